"""FlexAttention document masks of packed samples, built from the segment layout.

A packed sequence holds its samples (segments) one after another, so its per-token segment
ids are sorted. Query n may see key m iff both belong to the same sample. ``document_mask``
builds that ``BlockMask`` from the first and last id of every 128-token block alone:
(Q/128) x (K/128) comparisons instead of create_block_mask's Q x K mask (over 6 * 10^8
entries for a base-model micro-batch of 128 images), no compiled mask function, and the
same code on every device (so the CPU tests run the CUDA path's masks).

Both lengths are padded to a multiple of the block, at least two blocks (``padded_length``):
FlexAttention then sees whole blocks only, and block counts that torch.compile does not
specialise (it does for 1), so its kernel compiled with dynamic shapes serves every
micro-batch after the first (``test_packed_flex_attention_does_not_recompile``). Padding tokens get the id one past the last sample:
they see only each other (no query row is empty) and no real token sees them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 128
"""FlexAttention's block size, and the multiple the packed lengths are padded to."""


MIN_BLOCKS = 2
"""Blocks a padded length has at least: torch.compile specialises sizes 0 and 1, so a mask of
one block row or column would compile FlexAttention again (``test_docmask``)."""


def padded_length(n: int) -> int:
    """``n`` rounded up to a whole number of blocks, at least ``MIN_BLOCKS``."""
    return max(-(-n // BLOCK), MIN_BLOCKS) * BLOCK


def _ordered(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, 1, rows) counts and (1, 1, rows, cols) column indices of the True entries of
    ``flags`` (rows, cols), listed first and in order: the layout ``BlockMask`` takes."""
    num = flags.sum(-1, dtype=torch.int32)
    idx = torch.argsort(flags.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[None, None], idx[None, None]


def document_mask(q_ids: torch.Tensor, kv_ids: torch.Tensor, segments: int):
    """The ``BlockMask`` of queries with sorted segment ids ``q_ids`` (N,) over keys with sorted
    ids ``kv_ids`` (M,) of the same ``segments`` samples, for the lengths padded to
    ``padded_length`` (its ``seq_lengths``): a block pair is listed when their id ranges
    overlap, as a full block (no mask_mod applied) when both hold one and the same sample."""
    from torch.nn.attention.flex_attention import BlockMask
    qp, kp = padded_length(q_ids.shape[0]), padded_length(kv_ids.shape[0])
    q = F.pad(q_ids, (0, qp - q_ids.shape[0]), value=segments)
    k = F.pad(kv_ids, (0, kp - kv_ids.shape[0]), value=segments)
    qb, kb = q.view(-1, BLOCK), k.view(-1, BLOCK)
    q_lo, q_hi, k_lo, k_hi = qb[:, 0], qb[:, -1], kb[:, 0], kb[:, -1]
    touch = (q_lo[:, None] <= k_hi[None, :]) & (k_lo[None, :] <= q_hi[:, None])
    full = (q_lo == q_hi)[:, None] & (k_lo == k_hi)[None, :] & (q_lo[:, None] == k_lo[None, :])

    def same_segment(b, h, qi, ki):
        return q[qi] == k[ki]

    return BlockMask.from_kv_blocks(*_ordered(touch & ~full), *_ordered(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=same_segment, seq_lengths=(qp, kp))
