"""AdamW with warmup + cosine schedule, and gradient clipping over the whole sharded model.

Both run a constant number of kernels per step, not a few per parameter (the base model has
525 parameter tensors): AdamW is ``fused`` (one kernel for the whole update) when every
parameter is on CUDA and ``foreach`` otherwise; the clipping norm is ``get_total_norm``'s
foreach path (``torch._foreach_norm`` per device and dtype) over the local gradients (the
shards of FSDP2's DTensors), and the rescale one ``_foreach_mul_``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ..models.config import OptimConfig


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (ndim >= 2, including embeddings); no decay for biases, norms, scales."""
    decay, no_decay = [], []
    for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def implementation(params) -> dict:
    """AdamW's implementation flag for ``params``: ``fused`` when every one is on CUDA (a DTensor's
    device is its local shard's), ``foreach`` otherwise (CPU, CPU offload, a mix)."""
    params = list(params)
    if params and all(p.is_cuda for p in params):
        return {"fused": True}
    return {"foreach": True}


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    cfg.validate()
    groups = param_groups(module, cfg.weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                            **implementation(p for g in groups for p in g["params"]))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """Linear warmup from 1/warmup to 1, then cosine from 1 to min_lr_ratio at total_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(cfg.total_steps - cfg.warmup_steps, 1)
    t = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def clip_grad_norm(module: nn.Module, max_norm: float, *, sharded_group=None, model_group=None,
                   comm_device: torch.device | None = None) -> torch.Tensor:
    """Clip all gradients by the L2 norm of the *whole* model's gradient; returns that norm.

    ``sharded_group``: the dp group when gradients are sharded over it (FSDP2), so local
    squares are summed over it; ``model_group``: the mp group, whose ranks hold disjoint
    parts of the model. The norm stays on the device (no host sync). ``comm_device``: where
    the norm is reduced when gradients live elsewhere (FSDP2 CPU offload under NCCL).
    """
    grads = [_local(p.grad) for p in module.parameters() if p.grad is not None]
    dev = grads[0].device if grads else torch.device("cpu")
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    sq = torch.zeros((), dtype=acc, device=dev)
    if grads:  # gradients are float32 (or float64) here: parameters stay in full precision
        sq = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True).to(acc).square()
    if comm_device is not None:
        sq = sq.to(comm_device)
    for group in (sharded_group, model_group):
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(sq, group=group)
    norm = sq.sqrt()
    if max_norm > 0 and grads:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device, grads[0].dtype))
    return norm
