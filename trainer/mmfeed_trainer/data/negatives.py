"""The deterministic in-batch negatives of the image-text matching loss, drawn when a record
becomes a ``Batch`` (``batches.record_to_batch``) and used by ``models.losses``."""

from __future__ import annotations

import torch


def itm_negatives(weight: torch.Tensor, segments: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic in-batch ITM negatives, chosen within each segment (a dp rank's batch).

    Among a segment's live samples v_0..v_{n-1}, image v_k is paired with text v_{k+1} and
    text v_k with image v_{k+1} (indices mod n). Returns (neg_text, neg_image) int64 index
    tensors over the whole batch; samples with no negative (dead, or n < 2) point to
    themselves and are dropped by ``itm_sum`` via ``has_negative``.
    """
    w = weight.detach().cpu()
    segments = segments or [w.shape[0]]
    if sum(segments) != w.shape[0]:
        raise ValueError(f"itm negatives: segments {segments} do not sum to batch size {w.shape[0]}")
    neg = torch.arange(w.shape[0], dtype=torch.int64)
    start = 0
    for n in segments:
        live = torch.nonzero(w[start:start + n] > 0).flatten() + start
        if live.numel() >= 2:
            neg[live] = live.roll(-1)
        start += n
    return neg, neg.clone()
