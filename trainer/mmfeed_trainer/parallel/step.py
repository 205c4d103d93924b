"""One training step of a rank: forward/backward over its micro-batches, clip, update.

The step's loss is  sum over micro-batches m and samples i of  w_i * (ITC_i + ITM_i)  divided
by W, the sum of all weights of the step over every dp rank (all-reduced on the device
before the first backward). Gradients are *summed* over dp, so the update equals the one of
a single process on the whole global batch (``losses.py`` for the per-sample terms).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..models import losses
from .. import timing
from ..data.batches import Batch
from .optim import clip_grad_norm
from .parallel_dims import DP, ParallelDims
from .parallelize import grad_sync, unwrap


def _first_layers(module: nn.Module) -> list[nn.Module]:
    """The first layer of each tower this rank holds: the end of its backward pass."""
    stage = unwrap(module)
    layers = []
    if getattr(stage, "vision", None) is not None:
        layers.append(stage.vision.patch_embed)
    if getattr(stage, "text", None) is not None:
        layers.append(stage.text.tok)
    return layers


@dataclass(slots=True)
class StepStats:
    loss: torch.Tensor | None
    """This rank's share of the step loss (detached, on device); None on the text rank.
    Summed over dp it is the global step loss."""
    global_weight: torch.Tensor | None
    grad_norm: torch.Tensor
    samples: int
    """Live (weight > 0) samples this rank consumed."""
    clock: timing.StepClock | None = None
    """The step's timeline; read it (``compute_seconds``) at a log step: on CUDA it syncs."""

    @property
    def compute_seconds(self) -> float:
        """Rank-local forward + backward time, without waits for other ranks (``timing``);
        reading it synchronizes the device on CUDA (``timing.StepClock.compute_seconds``)."""
        return self.clock.compute_seconds() if self.clock is not None else 0.0


def _dp_sizes(micro_batches: list[Batch], dims: ParallelDims, device: torch.device | None = None,
              clock: timing.StepClock | None = None) -> list[list[int]]:
    """Per micro-batch, the sample count of every dp rank: one small all_gather of host
    tensors per step over the dp host group (``ParallelDims.host_group``: gloo), so the
    device is not involved; none without dp. ``device`` is not used (kept for callers)."""
    group = dims.host_group(DP)
    if group is None:
        return [[mb.size] for mb in micro_batches]
    local = torch.tensor([mb.size for mb in micro_batches], dtype=torch.int64)
    parts = [torch.empty_like(local) for _ in range(dims.dp)]
    with timing.comm(clock):
        dist.all_gather(parts, local, group=group)
    table = torch.stack(parts).t().tolist()  # (micro-batch, dp rank)
    return [[int(n) for n in row] for row in table]


def forward_backward(module: nn.Module, micro_batches: list[Batch], *, dims: ParallelDims,
                     device: torch.device, autocast: contextlib.AbstractContextManager | None = None,
                     clock: timing.StepClock | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Accumulate this rank's gradients for one step; returns (loss share, global weight).
    Forwards and exchanges with other ranks are marked on ``clock`` (None: not timed)."""
    if not micro_batches:
        raise ValueError("step: no micro-batches")
    autocast = autocast or contextlib.nullcontext()
    if not dims.has_loss:
        for i, mb in enumerate(micro_batches):
            with grad_sync(module, i == len(micro_batches) - 1):
                with autocast, timing.forward(clock):
                    out = module(mb)
                out["token"].backward()
        return None, None
    dp_group = dims.dp_group()
    local_w = torch.stack([mb.weight.sum() for mb in micro_batches]).sum()
    total_w = losses.global_weight(local_w, dp_group, clock)
    sizes = _dp_sizes(micro_batches, dims, device, clock)
    loss_sum = torch.zeros((), dtype=total_w.dtype, device=device)
    for i, mb in enumerate(micro_batches):
        with grad_sync(module, i == len(micro_batches) - 1):
            with autocast, timing.forward(clock):
                out = module(mb)
            itc = losses.itc_sum(out["img_emb"], out["txt_emb"], mb.weight, out["logit_scale"],
                                 sizes=sizes[i], rank=dims.dp_rank, group=dp_group, clock=clock)
            itm = losses.itm_sum(out["itm_logits"], mb.weight, mb.neg_text)
            loss = (itc + itm) / total_w
            loss.backward()
        loss_sum += loss.detach()
    return loss_sum, total_w


def train_step(module: nn.Module, optimizer: torch.optim.Optimizer, scheduler, micro_batches: list[Batch], *,
               dims: ParallelDims, device: torch.device, max_grad_norm: float,
               autocast: contextlib.AbstractContextManager | None = None) -> StepStats:
    """forward_backward, clip over the whole model, optimizer and scheduler step, zero grads."""
    clock = timing.StepClock(device, forward_only=dims.fsdp and dims.dp > 1)
    with unwrap(module).clock_slot.timed(clock):
        hooks = [layer.register_full_backward_pre_hook(lambda *_: clock.mark_backward_done())
                 for layer in _first_layers(module)]
        try:
            loss, total_w = forward_backward(module, micro_batches, dims=dims, device=device, autocast=autocast,
                                             clock=clock)
        finally:
            for h in hooks:
                h.remove()
    norm = clip_grad_norm(module, max_grad_norm,
                          sharded_group=dims.dp_group() if dims.fsdp else None,
                          model_group=dims.mp_group(), comm_device=device)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    live = sum(mb.num_live for mb in micro_batches)
    return StepStats(loss=loss, global_weight=total_w, grad_norm=norm, samples=live, clock=clock)
