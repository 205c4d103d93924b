"""Losses: image-text contrastive (ITC) over the global batch and image-text matching (ITM).

All functions return *sums* weighted by the per-sample ``weight`` (0 = padding sample); the
caller divides the step's total by the global weight, all-reduced over dp on the device
(``global_weight``), so that a sharded step equals one process on the whole global batch.

A zero-weight sample contributes nothing: it is masked out of the contrastive logits as a
key (column) and its rows (queries) and ITM pairs are dropped with ``torch.where``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import timing
from ..data.negatives import itm_negatives  # noqa: F401 (the conversion draws them: data.batches)

def _acc(x: torch.Tensor) -> torch.Tensor:
    """At least float32 for the softmax (bf16/fp16 logits under autocast), float64 stays."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# Large finite negative instead of -inf so that an all-masked row stays finite (no NaN).
_MASKED_LOGIT = -1e9


class GatherRows(torch.autograd.Function):
    """all_gather along dim 0 whose backward all-reduces (sums) the gradient and returns this
    rank's slice: every rank's loss terms reach the embeddings that produced them.

    Inputs must have the same shape on every rank (pad to the largest first).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, clock: timing.StepClock | None = None) -> torch.Tensor:
        ctx.group, ctx.clock = group, clock
        ctx.rank = dist.get_rank(group)
        ctx.rows = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        with timing.comm(clock):
            dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        with timing.comm(ctx.clock):
            dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows], None, None


def gather_padded(x: torch.Tensor, sizes: list[int], group, clock: timing.StepClock | None = None) -> torch.Tensor:
    """Concatenate every rank's rows (rank r holds sizes[r]) in rank order, with gradient
    (the gather and its backward are comm spans of ``clock``)."""
    if group is None or len(sizes) == 1:
        return x
    pad = max(sizes) - x.shape[0]
    full = GatherRows.apply(F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)) if pad else x, group, clock)
    width = max(sizes)
    return torch.cat([full[r * width:r * width + n] for r, n in enumerate(sizes)])


def itc_sum(img_emb: torch.Tensor, txt_emb: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
            *, sizes: list[int] | None = None, rank: int = 0, group=None,
            clock: timing.StepClock | None = None) -> torch.Tensor:
    """Weighted sum over this rank's samples of (CE image->text + CE text->image) / 2.

    Keys are the global batch (all dp ranks, gathered with gradient); ``sizes`` are the
    per-rank row counts, ``rank`` this rank's index in them; the gathers are comm spans of
    ``clock`` (the step's ``timing.StepClock``). Single process: leave defaults.
    """
    sizes = sizes or [img_emb.shape[0]]
    offset = sum(sizes[:rank])
    dtype = torch.promote_types(_acc(img_emb).dtype, _acc(txt_emb).dtype)  # bf16 towers: fp32 logits
    img_emb, txt_emb = img_emb.to(dtype), txt_emb.to(dtype)
    all_img = gather_padded(img_emb, sizes, group, clock)
    all_txt = gather_padded(txt_emb, sizes, group, clock)
    all_w = gather_padded(weight, sizes, group, clock) if len(sizes) > 1 else weight
    key_dead = all_w <= 0
    target = torch.arange(img_emb.shape[0], device=img_emb.device) + offset
    i2t = (scale * img_emb @ all_txt.t()).masked_fill(key_dead[None, :], _MASKED_LOGIT)
    t2i = (scale * txt_emb @ all_img.t()).masked_fill(key_dead[None, :], _MASKED_LOGIT)
    per = 0.5 * (F.cross_entropy(_acc(i2t), target, reduction="none")
                 + F.cross_entropy(_acc(t2i), target, reduction="none"))
    live = weight > 0
    return torch.where(live, per * weight, torch.zeros_like(per)).sum()


def has_negative(neg: torch.Tensor) -> torch.Tensor:
    return neg != torch.arange(neg.shape[0], device=neg.device)


def itm_sum(logits: torch.Tensor, weight: torch.Tensor, neg_text: torch.Tensor) -> torch.Tensor:
    """Weighted sum of (CE(pos, 1) + CE(neg text, 0) + CE(neg image, 0)) / 3 per anchor sample.

    ``logits`` is the (3B, 2) output of ``Fusion``; anchors without a negative count only
    the positive term (still divided by 3, so every anchor has the same scale).
    """
    b = weight.shape[0]
    ones = torch.ones(b, dtype=torch.int64, device=logits.device)
    target = torch.cat([ones, torch.zeros_like(ones), torch.zeros_like(ones)])
    ce = F.cross_entropy(_acc(logits), target, reduction="none").view(3, b)
    has_neg = has_negative(neg_text)
    per = (ce[0] + torch.where(has_neg, ce[1] + ce[2], torch.zeros_like(ce[0]))) / 3
    return torch.where(weight > 0, per * weight, torch.zeros_like(per)).sum()


def global_weight(local_weight_sum: torch.Tensor, group=None, clock: timing.StepClock | None = None) -> torch.Tensor:
    """Sum of the sample weights of the whole step over dp, on the device (async-safe).

    Returns 1 where the global sum is 0 (an all-padding step), so the loss is 0, not NaN.
    """
    total = _acc(local_weight_sum.detach().clone())
    if group is not None and dist.get_world_size(group) > 1:
        with timing.comm(clock):
            dist.all_reduce(total, group=group)
    return torch.where(total > 0, total, torch.ones_like(total))
