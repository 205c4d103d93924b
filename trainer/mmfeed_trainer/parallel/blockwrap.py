"""Per-block memory and speed wrappers, applied from outside the model (torchtitan style).

* ``apply_ac(stage, mode)`` -- activation checkpointing of every transformer block:
  ``full`` keeps only each block's input and recomputes the block in backward; ``selective``
  keeps the outputs of the matmuls and of attention (the expensive ops) and recomputes the
  cheap ones (layer norms, GELU, residual adds, reshapes) -- op-level selective AC.
* ``apply_compile(stage)`` -- ``torch.compile`` of every block's forward (one graph per block,
  reused by all blocks of a tower; shapes vary between micro-batches, so dimensions are
  marked dynamic after the first recompile).

Both replace the block's *instance* ``forward`` instead of wrapping the module, so parameter
names (``vision.blocks.0.attn.q.weight``) and checkpoints stay those of ``MMModel``, and FSDP2's
per-block hooks (which run in ``__call__``) stay outside the checkpointed / compiled region:
apply them before ``fully_shard`` / DDP. AC goes first, compile second (compile traces the
checkpointed forward).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

AC_MODES = ("none", "selective", "full")

_ATEN = torch.ops.aten
_SAVE_OPS = {getattr(_ATEN, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_cudnn_attention") if hasattr(_ATEN, name)}
"""Ops whose outputs selective AC keeps: matmuls and the fused attention kernels."""


def blocks(stage: nn.Module) -> list[nn.Module]:
    """The transformer blocks of every tower this stage holds (vision, text, fusion)."""
    out = []
    for name in ("vision", "text", "fusion"):
        part = getattr(stage, name, None)
        if part is not None:
            # A pipeline stage keeps its share of a tower's blocks in a ModuleDict keyed by
            # the block's index in the whole tower (``pp.stage``).
            out.extend(part.blocks.values() if isinstance(part.blocks, nn.ModuleDict) else part.blocks)
    return out


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, mode: str):
    context_fn = (functools.partial(create_selective_checkpoint_contexts, _selective_policy)
                  if mode == "selective" else None)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        extra = {"context_fn": context_fn} if context_fn else {}
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=False, **extra, **kwargs)
    return run


def apply_ac(stage: nn.Module, mode: str) -> int:
    """Activation checkpointing of every block per ``mode`` (AC_MODES); returns the count."""
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing: mode must be one of {AC_MODES}, got {mode!r}")
    if mode == "none":
        return 0
    found = blocks(stage)
    for block in found:
        block.forward = _checkpointed(block.forward, mode)
    return len(found)


def apply_compile(stage: nn.Module, *, backend: str = "inductor") -> int:
    """``torch.compile`` every block's forward (after ``apply_ac``); returns the count.

    ``backend``: inductor on GPUs; the CPU tests use aot_eager (same tracing and autograd
    path, no C++ build)."""
    found = blocks(stage)
    for block in found:
        block.forward = torch.compile(block.forward, backend=backend)
    return len(found)
