"""Apply (dp, mp) parallelism to a plain ``MMModel`` from outside, in a fixed order.

``parallelize(model, dims=..., cfg=...)`` returns the ``Stage`` this rank runs:

1. modality split (mp): keep the parts of this rank's role and drop the others --
   ``full`` (mp = 1): vision, text, fusion, itc; ``vision`` (mp rank 0): vision, fusion,
   itc; ``text`` (mp rank 1): text. Text features cross to the vision rank through the
   differentiable ``Exchange``.
2. per-block memory and speed wrappers (``blockwrap``): activation checkpointing
   (``cfg.ac``: none | selective | full), then ``torch.compile`` (``cfg.compile``).
3. data parallelism over dp: FSDP2 ``fully_shard`` per transformer block, per tower and on
   the stage root (``cfg.fsdp``; with ``cfg.mixed_precision`` bf16 parameters in compute and
   fp32 gradient reduction, with ``cfg.cpu_offload`` parameters, gradients and optimizer
   state on the host), or DDP. Both overlap gradient communication with the
   backward pass (per-block reduce-scatter / DDP buckets) and *sum* gradients over dp
   (the loss is already divided by the global sample weight).

A Stage's parameter names equal the model's (``vision.blocks.0.attn.q.weight`` ...), so
checkpoints and parity checks line up with the single-process model.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from . import blockwrap
from .. import timing
from ..data.batches import Batch
from .exchange import Exchange
from ..models.model import MMModel
from .parallel_dims import MP, ROLE_FULL, ROLE_TEXT, ROLE_VISION, ParallelDims

ROLE_PARTS = {
    ROLE_FULL: ("vision", "text", "fusion", "itc"),
    ROLE_VISION: ("vision", "fusion", "itc"),
    ROLE_TEXT: ("text",),
}


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How parallelism is applied (the layout itself is ``ParallelDims``)."""

    fsdp: bool = False
    """FSDP2 ``fully_shard`` over dp instead of DDP."""
    reshard_after_forward: bool | None = None
    """FSDP2: free the gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2).
    None: ZeRO-3 without pipeline parallelism, ZeRO-2 with it (as torchtitan): under a pipeline
    schedule a stage's forwards and backwards interleave over the micro-batches, so freeing
    after each forward gathers the stage's parameters again for every forward and backward
    (2 x M all-gathers a step instead of one)."""
    exchange_dtype: torch.dtype = torch.float32
    """dtype of the text features sent between mp ranks (bfloat16 halves the bytes)."""
    ddp_bucket_cap_mb: int = 25
    """DDP gradient bucket size: smaller buckets start communicating earlier in backward."""
    ac: str = "none"
    """Activation checkpointing per block: none, selective (keep matmul/attention outputs)
    or full (keep only block inputs); see ``blockwrap``."""
    compile: bool = False
    """``torch.compile`` every block's forward."""
    compile_backend: str = "inductor"
    """torch.compile backend (tests on CPU use aot_eager)."""
    mixed_precision: bool = False
    """FSDP2 ``MixedPrecisionPolicy``: bf16 parameters in forward/backward, fp32 gradient
    reduction, fp32 stage outputs; the sharded parameters and the optimizer stay fp32."""
    cpu_offload: bool = False
    """FSDP2 ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer state live in
    host memory (pinned on CUDA); the optimizer step runs on the CPU."""

    def validate(self, dp: int) -> None:
        """ValueError for a combination a layout with ``dp`` data-parallel ranks cannot apply."""
        if self.ac not in blockwrap.AC_MODES:
            raise ValueError(f"parallelize: --ac must be one of {blockwrap.AC_MODES}, got {self.ac!r}")
        needs_fsdp = [name for name, on in (("--mixed-precision", self.mixed_precision),
                                            ("--cpu-offload", self.cpu_offload)) if on]
        if needs_fsdp and not (self.fsdp and dp > 1):
            raise ValueError(f"parallelize: {' and '.join(needs_fsdp)} are FSDP2 policies: they need --fsdp "
                             f"with dp > 1 (this run: fsdp={self.fsdp}, dp={dp}); on one rank use "
                             f"--bf16 on (autocast) instead")


class Stage(nn.Module):
    """The part of the model one rank runs; ``forward(mb)`` computes one micro-batch.

    Returns a dict: loss ranks get ``img_emb``, ``txt_emb``, ``itm_logits``, ``logit_scale``;
    the text rank (mp rank 1) gets ``token``, a scalar whose ``backward()`` runs its
    backward pass once the vision rank sends the feature gradient. ``clock_slot`` holds the
    current step's ``timing.StepClock`` (filled by ``step.train_step``) for the mp exchange and
    the FSDP2 unshard hooks, which run inside ``forward``.
    """

    def __init__(self, model: MMModel, role: str, exchange: Exchange | None = None):
        super().__init__()
        if role not in ROLE_PARTS:
            raise ValueError(f"stage: unknown role {role!r}")
        if role != ROLE_FULL and exchange is None:
            raise ValueError(f"stage: role {role!r} needs an Exchange")
        self.role = role
        self.exchange = exchange
        self.clock_slot = timing.ClockSlot()
        for name in ROLE_PARTS[role]:
            self.add_module(name, getattr(model, name))

    def forward(self, mb: Batch) -> dict:
        packed = mb.packed
        if self.role == ROLE_TEXT:
            lengths = mb.layout.lengths if mb.layout is not None else None
            return {"token": self.exchange.send_text(self._text(mb, packed), self.clock_slot.clock, lengths)}
        if packed:  # the towers dispatch on the packed arguments (FSDP2 hooks see every call)
            img = self.vision(mb.patches, mb.cu_seqlens_image, mb.image_grid, layout=mb.layout)
        else:
            img = self.vision(mb.pixel_values, mb.pixel_shape, layout=mb.layout)
        layout = mb.layout
        if self.role == ROLE_FULL:
            txt = self._text(mb, packed)
        else:
            txt, lengths = self.exchange.recv_text(img.emb.shape[0], self.clock_slot.clock)
            layout = layout._replace(lengths=lengths) if layout is not None else None
        logits = self.fusion(img, txt, mb.neg_text, mb.neg_image, layout=layout)
        return {"img_emb": img.emb, "txt_emb": txt.emb, "itm_logits": logits, "logit_scale": self.itc()}

    def _text(self, mb: Batch, packed: bool):
        return self.text(mb.input_ids, mb.lengths, layout=mb.layout)  # 1-D input_ids when packed


def _sum_allreduce_hook(group, bucket):
    """DDP comm hook: all-reduce SUM (DDP's default divides by the dp size)."""
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _fsdp_policies(cfg: ParallelConfig, *, root: bool) -> dict:
    """fully_shard keyword arguments for the mixed-precision and offload policies."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    kw = {}
    if cfg.mixed_precision:
        # Outputs leave the stage in fp32 (the losses' softmax); inside, blocks pass bf16 on.
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                               output_dtype=torch.float32 if root else None)
    if cfg.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return kw


def reshard_after_forward(cfg: ParallelConfig, pp: int) -> bool:
    """``cfg.reshard_after_forward``, or its default for ``pp`` stages (see the field)."""
    return cfg.reshard_after_forward if cfg.reshard_after_forward is not None else pp == 1


def _apply_fsdp(stage: Stage, dims: ParallelDims, cfg: ParallelConfig) -> nn.Module:
    from torch.distributed.fsdp import FSDPModule, fully_shard
    mesh = dims.dp_mesh()
    inner = _fsdp_policies(cfg, root=False)
    reshard = reshard_after_forward(cfg, dims.pp)
    for name in ("vision", "text", "fusion"):
        part = getattr(stage, name, None)
        if part is None:
            continue
        for block in part.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, **inner)
        fully_shard(part, mesh=mesh, reshard_after_forward=reshard, **inner)
    fully_shard(stage, mesh=mesh, reshard_after_forward=reshard,
                **_fsdp_policies(cfg, root=True))
    # Sum over dp (the loss is already divided by the global weight); plain SUM also works on
    # gloo, which lacks the PREMUL_SUM a divide factor would otherwise use. The setters act on
    # one FSDP module's own parameter group, so every sharded module needs them.
    for module in stage.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            timing.bracket_forward_pre_hooks(module, stage.clock_slot)  # all-gather waits are not compute
    return stage


def _apply_ddp(stage: Stage, dims: ParallelDims, cfg: ParallelConfig, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP
    group = dims.dp_group()
    ddp = DDP(stage, process_group=group, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=cfg.ddp_bucket_cap_mb, gradient_as_bucket_view=True)
    ddp.register_comm_hook(group, _sum_allreduce_hook)
    return ddp


def parallelize(model: MMModel, *, dims: ParallelDims, cfg: ParallelConfig,
                device: torch.device | None = None) -> nn.Module:
    """Split ``model`` for this rank's mp role, move it to ``device``, wrap it for dp.

    The distributed process group and ``dims.build_mesh`` must be set up first (unless the
    world size is 1). Returns the module to call once per micro-batch.
    """
    device = device or torch.device("cpu")
    cfg.validate(dims.dp)
    exchange = None
    if dims.mp == 2:
        exchange = Exchange(peer=dims.peer(), group=dims.mp_group(), device=device, dtype=cfg.exchange_dtype,
                            hidden_dim=model.cfg.text_hidden, embed_dim=model.cfg.embed_dim,
                            host_group=dims.host_group(MP))
    stage = Stage(model, dims.role, exchange).to(device)
    blockwrap.apply_ac(stage, cfg.ac)
    if cfg.compile:
        blockwrap.apply_compile(stage, backend=cfg.compile_backend)
    if dims.dp == 1:
        return stage
    if cfg.fsdp:
        return _apply_fsdp(stage, dims, cfg)
    return _apply_ddp(stage, dims, cfg, device)


def unwrap(module: nn.Module) -> Stage:
    """The Stage inside a DDP wrapper (FSDP2 modifies the Stage in place)."""
    return module.module if hasattr(module, "module") and isinstance(module.module, Stage) else module


def grad_sync(module: nn.Module, enabled: bool):
    """Context that enables or skips the dp gradient reduction of this backward
    (gradient accumulation over micro-batches: sync only on the last one)."""
    if hasattr(module, "no_sync"):  # DDP
        return contextlib.nullcontext() if enabled else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()
