"""The image-text model: plain single-device PyTorch (parallelism is applied from outside).

ALBEF/BLIP style:

* ``VisionTower`` -- ViT. The patch embedding accepts a variable patch grid per sample
  (dynamic resolution): the micro-batch is a zero-padded (B, C, H, W) tensor plus each
  sample's true (C, h, w); patches outside a sample's floor(h/p) x floor(w/p) grid are masked
  out of attention. Position embeddings are looked up by (row, column) in a learned
  ``max_grid x max_grid`` table; a larger grid gets the table bilinearly resized to it
  (``grid_pos``), so every grid the service sends is accepted.

Every part also has ``forward_packed``: a packed micro-batch (``batches.pack``: captions
concatenated with ``cu_seqlens_text``, patches concatenated with ``cu_seqlens_image`` and
``image_grid``) runs without padding, and attention never crosses samples
(``segment_attention``: FlexAttention with a document mask on CUDA, built once per tower and
micro-batch from the segment layout (``docmask``), SDPA per segment elsewhere). Packed and
padded give the same per-sample results (``test_parity_packed_*``).
* ``TextTower`` -- BERT-like encoder over right-padded ``input_ids``; the attention mask is
  built on the device from the unpadded lengths.
* ``Fusion`` -- text queries self-attend and cross-attend to the image tokens; its [CLS]
  feeds the image-text matching (ITM) head.
* ``ContrastiveHead`` -- the learned logit scale of the image-text contrastive (ITC) loss.

Every tower returns its features and an L2-normalised embedding of its [CLS] token. Losses
live in ``losses.py`` because the contrastive one needs the whole (cross-rank) batch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batches import Batch
from .config import ModelConfig
from .docmask import document_mask
from ..data.layout import Layout, fill, grid_layout


class ImageFeatures(NamedTuple):
    tokens: torch.Tensor
    """(B, 1 + N, Dv): [CLS] then the patch tokens of the padded grid."""
    mask: torch.Tensor
    """(B, 1 + N) bool: True where the token is real (the [CLS] always is)."""
    emb: torch.Tensor
    """(B, E) L2-normalised contrastive embedding."""


class TextFeatures(NamedTuple):
    hidden: torch.Tensor
    """(B, L, Dt) token states; position 0 is [CLS]."""
    lengths: torch.Tensor
    """(B,) int64 unpadded lengths (0 for an empty padding sample)."""
    emb: torch.Tensor
    """(B, E) L2-normalised contrastive embedding."""


def _real_first(x: torch.Tensor, mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, N, D) and its mask (B, N) with each row's real tokens moved to the front, in
    their order, and cut to ``width`` places (at least each row's real tokens)."""
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)[:, :width]
    return x.gather(1, order[..., None].expand(-1, -1, x.shape[-1])), mask.gather(1, order)


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool mask of the first max(length, 1) positions.

    A padding sample with no tokens keeps position 0 so that no attention row is all-masked
    (which would give NaN); its weight is 0, so it contributes nothing to any loss.
    """
    pos = torch.arange(width, device=lengths.device)
    return pos[None, :] < lengths.clamp(min=1)[:, None]


class PackedImageFeatures(NamedTuple):
    tokens: torch.Tensor
    """(M, Dv) packed tokens: per sample its [CLS] then its own patches, row-major."""
    cu_seqlens: torch.Tensor
    """(B + 1,) int64 offsets of each sample's tokens in ``tokens`` ([CLS] included)."""
    emb: torch.Tensor
    """(B, E) L2-normalised contrastive embedding."""


def cumsum0(counts: torch.Tensor) -> torch.Tensor:
    """(n + 1,) int64 offsets [0, c0, c0 + c1, ...] of segments of ``counts`` (n,)."""
    return F.pad(counts.to(torch.int64).cumsum(0), (1, 0))


def segment_ids(counts: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """(Σ counts,) int64: token t of segment i gets i. ``total`` (Σ counts, known on the host)
    keeps the device from being read for the output size."""
    return torch.repeat_interleave(torch.arange(counts.shape[0], device=counts.device), counts, output_size=total)


class Segments(NamedTuple):
    """The layout of a packed sequence, built once per tower and micro-batch (``segments``)
    and used by every attention layer: ``ids`` (N,) the segment (sample) of each token, and
    ``sizes`` its segments' token counts on the host (one device sync per tower, not per layer).
    Where attention runs FlexAttention (``flex_enabled``: CUDA), ``mask`` is the document
    ``BlockMask`` of the queries it was built for attending to these segments as keys (itself
    for self-attention; the fusion's captions for its cross-attention), so no layer builds one."""

    ids: torch.Tensor
    sizes: list[int]
    mask: object | None = None


def flex_enabled(t: torch.Tensor) -> bool:
    """Whether packed attention on ``t``'s device runs FlexAttention (CUDA) rather than SDPA per
    segment (elsewhere); the tests turn it on for the CPU to exercise the CUDA path's masks."""
    return t.is_cuda


def segments(counts: torch.Tensor, queries: Segments | None = None, sizes: list[int] | None = None) -> Segments:
    """The ``Segments`` of a packed sequence whose segments have ``counts`` (n,) tokens, in order;
    with FlexAttention also its document mask as keys of ``queries`` (default: itself).
    ``sizes``: the same counts on the host (``layout``); None reads them from the device."""
    sizes = [int(n) for n in counts.tolist()] if sizes is None else list(sizes)
    ids = segment_ids(counts, sum(sizes))
    mask = None
    if flex_enabled(ids):
        mask = document_mask(ids if queries is None else queries.ids, ids, counts.shape[0])
    return Segments(ids, sizes, mask)


def gather_segments(cu: torch.Tensor, order: torch.Tensor, total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices that concatenate the segments ``order`` (k,) of a packed sequence with
    offsets ``cu``, and the offsets (k + 1,) of the result; ``total``: its length (host)."""
    counts = (cu[1:] - cu[:-1])[order]
    out_cu = cumsum0(counts)
    seg = segment_ids(counts, total)
    return cu[order][seg] + torch.arange(seg.shape[0], device=cu.device) - out_cu[seg], out_cu


_flex = None


def _flex_attention():
    """torch.compile'd FlexAttention (built on first use; dynamic shapes: packed lengths vary)."""
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex = torch.compile(flex_attention, dynamic=True)
    return _flex


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      q_seg: Segments, kv_seg: Segments) -> torch.Tensor:
    """Attention of packed q (1, H, N, d) over k, v (1, H, M, d) where query n sees only the
    keys of its own segment (q_seg.ids[n] == kv_seg.ids[m]): the document mask of packed
    samples. Both sequences have the same number of segments, each with >= 1 key.

    On CUDA it is FlexAttention with that mask as a block mask (``kv_seg.mask``, built once
    per tower and micro-batch by ``segments``; ``docmask``): one compiled kernel over the
    packed sequence that skips the blocks where no query sees its keys, so the work is about
    Σ per-sample n·m rather than (Σ n)·(Σ m). It is chosen because it takes different query
    and key packings (the fusion's cross-attention packs captions against images), ships
    with the pinned torch (flash-attn's varlen kernel would be a CUDA build this machine
    cannot install and test), and needs no nested tensors. Elsewhere (CPU) it is
    ``split_segment_attention``.
    """
    if flex_enabled(q):
        return flex_segment_attention(q, k, v, q_seg, kv_seg)
    return split_segment_attention(q, k, v, q_seg, kv_seg)


def split_segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_seg: Segments, kv_seg: Segments) -> torch.Tensor:
    """``segment_attention`` without a varlen kernel: SDPA on each segment's own queries and
    keys (views of the packed tensors, ``split``), outputs concatenated. Nothing is padded or
    masked, and the backward of a split is one concatenation; one SDPA call per segment and
    layer is cheap on the CPU, where this runs (it replaced copying the segments into a
    zero-padded batch per layer; docs/BENCHMARKS.md, "Packed plans")."""
    parts = zip(q.split(q_seg.sizes, 2), k.split(kv_seg.sizes, 2), v.split(kv_seg.sizes, 2))
    return torch.cat([F.scaled_dot_product_attention(a, b, c) for a, b, c in parts], 2)


def flex_segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           q_seg: Segments, kv_seg: Segments, *, compiled: bool = True) -> torch.Tensor:
    """``segment_attention`` with FlexAttention and the document block mask ``kv_seg.mask``
    (built here when the layout carries none): q, k, v are zero-padded to the mask's lengths
    and the output cut back to N. ``compiled=False`` runs FlexAttention eagerly (slow; lets
    the CPU tests check the mask)."""
    mask = kv_seg.mask if kv_seg.mask is not None else document_mask(q_seg.ids, kv_seg.ids, len(kv_seg.sizes))
    qp, kp = mask.seq_lengths
    n, m = q.shape[2], k.shape[2]
    if compiled:
        flex = _flex_attention()
    else:
        from torch.nn.attention.flex_attention import flex_attention as flex
    q, k, v = F.pad(q, (0, 0, 0, qp - n)), F.pad(k, (0, 0, 0, kp - m)), F.pad(v, (0, 0, 0, kp - m))
    return flex(q, k, v, block_mask=mask)[:, :, :n]


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head attention; ``context`` (cross-attention) may have another width (kv_dim)."""

    def __init__(self, dim: int, heads: int, kv_dim: int | None = None):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        # No key bias: softmax is invariant to it (its gradient is zero up to rounding noise,
        # which Adam would amplify into random updates).
        self.k = nn.Linear(kv_dim or dim, dim, bias=False)
        self.v = nn.Linear(kv_dim or dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, kv_mask: torch.Tensor,
                context: torch.Tensor | None = None) -> torch.Tensor:
        ctx = x if context is None else context
        b, n, d = x.shape
        h = self.heads
        q = self.q(x).view(b, n, h, d // h).transpose(1, 2)
        k = self.k(ctx).view(b, ctx.shape[1], h, d // h).transpose(1, 2)
        v = self.v(ctx).view(b, ctx.shape[1], h, d // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=kv_mask[:, None, None, :])
        return self.out(y.transpose(1, 2).reshape(b, n, d))

    def forward_packed(self, x: torch.Tensor, q_seg: Segments,
                       context: torch.Tensor | None = None, kv_seg: Segments | None = None) -> torch.Tensor:
        """x (N, D) packed tokens in the samples (segments) ``q_seg``; ``context`` (M, Dkv)
        in ``kv_seg`` for cross-attention. A token attends only to its own segment."""
        ctx = x if context is None else context
        kv_seg = q_seg if kv_seg is None else kv_seg
        n, d = x.shape
        h = self.heads
        q = self.q(x).view(n, h, d // h).transpose(0, 1)[None]
        k = self.k(ctx).view(ctx.shape[0], h, d // h).transpose(0, 1)[None]
        v = self.v(ctx).view(ctx.shape[0], h, d // h).transpose(0, 1)[None]
        y = segment_attention(q, k, v, q_seg, kv_seg)
        return self.out(y[0].transpose(0, 1).reshape(n, d))


class Block(nn.Module):
    """Pre-norm transformer block; with ``cross_dim`` it adds cross-attention to a context.
    ``post_norm`` (BERT): normalise after each residual add instead (no cross-attention)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, eps: float, cross_dim: int | None = None,
                 post_norm: bool = False):
        super().__init__()
        self.post_norm = post_norm
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, heads)
        self.cross_norm = nn.LayerNorm(dim, eps=eps) if cross_dim else None
        self.cross = Attention(dim, heads, kv_dim=cross_dim) if cross_dim else None
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Padded x (B, N, D) with boolean masks, or packed x (N, D) with ``Segments`` in
        place of the masks (``forward_packed``). Called through the module so that FSDP2's
        hooks gather the parameters in both cases."""
        if x.dim() == 2:
            return self.forward_packed(x, mask, context, context_mask)
        if self.post_norm:
            x = self.norm1(x + self.attn(x, mask))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x), mask)
        if self.cross is not None:
            x = x + self.cross(self.cross_norm(x), context_mask, context=context)
        return x + self.mlp(self.norm2(x))

    def forward_packed(self, x: torch.Tensor, seg: Segments,
                       context: torch.Tensor | None = None, context_seg: Segments | None = None) -> torch.Tensor:
        """Packed tokens x (N, D) in the samples ``seg``; see ``Attention.forward_packed``."""
        if self.post_norm:
            x = self.norm1(x + self.attn.forward_packed(x, seg))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn.forward_packed(self.norm1(x), seg)  # inside the block: no own FSDP unit
        if self.cross is not None:
            x = x + self.cross.forward_packed(self.cross_norm(x), seg, context=context, kv_seg=context_seg)
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, p = cfg.vision_hidden, cfg.patch_size
        self.patch_size = p
        self.max_grid = cfg.max_grid
        self.patch_embed = nn.Linear(cfg.image_channels * p * p, d)
        self.cls = nn.Parameter(torch.zeros(1, d))
        self.pos = nn.Parameter(torch.zeros(cfg.max_grid * cfg.max_grid + 1, d))
        self.blocks = nn.ModuleList(Block(d, cfg.vision_heads, cfg.mlp_ratio, cfg.layer_norm_eps)
                                    for _ in range(cfg.vision_layers))
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.proj = nn.Linear(d, cfg.embed_dim)

    def grid_pos(self, rows: int, cols: int) -> torch.Tensor:
        """(rows·cols, D) position embeddings of a rows x cols patch grid, row-major: the
        learned max_grid x max_grid table looked up by (row, column) when the grid fits,
        else the table bilinearly resized to max(rows, max_grid) x max(cols, max_grid)
        first, so every grid the service sends is accepted."""
        g, d = self.max_grid, self.pos.shape[1]
        table = self.pos[1:].view(g, g, d)
        if rows > g or cols > g:
            size = (max(rows, g), max(cols, g))
            table = F.interpolate(table.permute(2, 0, 1)[None], size=size, mode="bilinear",
                                  align_corners=False)[0].permute(1, 2, 0)
        return table[:rows, :cols].reshape(rows * cols, d)

    def forward(self, pixel_values: torch.Tensor, pixel_shape: torch.Tensor,
                image_grid: torch.Tensor | None = None, layout: Layout | None = None) -> ImageFeatures | PackedImageFeatures:
        """pixel_values (B, C, H, W) zero-padded; pixel_shape (B, 3) int: each sample's (C, h, w).
        Packed (``image_grid`` given): ``forward_packed(pixel_values, pixel_shape, image_grid, layout)``
        with the patches and cu_seqlens_image in the first two places."""
        if image_grid is not None:
            return self.forward_packed(pixel_values, pixel_shape, image_grid, layout)
        x, mask = self.embed(pixel_values, pixel_shape, layout)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(x, mask)

    def embed(self, pixel_values: torch.Tensor, pixel_shape: torch.Tensor,
              layout: Layout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded input of the first block: (B, 1 + N, D) [CLS] + patch tokens with their
        position embeddings, and the (B, 1 + N) bool mask of real tokens. N is the most
        patches of any sample (each sample's own grid, row-major, its padding after it), not
        the grid of the largest height by the largest width: a 4 x 16 and a 16 x 4 image pad to
        64 tokens, not 256 (what balancer.PaddedFeatures prices). The sizes come from the host
        ``layout`` (or from ``pixel_shape`` on the host); with neither, the tokens keep the
        padded grid's places (the same result, more work)."""
        b, c, hgt, wid = pixel_values.shape
        p, g = self.patch_size, self.max_grid
        gh, gw = max(hgt // p, 1), max(wid // p, 1)
        if hgt < p or wid < p:  # only padding samples are smaller than a patch
            pixel_values = F.pad(pixel_values, (0, max(p - wid, 0), 0, max(p - hgt, 0)))
        x = pixel_values[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
        x = self.patch_embed(x.permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p))
        dev = x.device
        rows = torch.arange(gh, device=dev).repeat_interleave(gw)
        cols = torch.arange(gw, device=dev).repeat(gh)
        grid = pixel_shape.to(dev, torch.int64)[:, 1:] // p  # (B, 2) true grid per sample
        valid = (rows[None, :] < grid[:, :1]) & (cols[None, :] < grid[:, 1:])
        if gh <= g and gw <= g:
            x = x + self.pos[1 + rows * g + cols]
        else:  # some sample's grid exceeds the table: each sample gets its own grid's embeddings
            pos = x.new_zeros(x.shape)
            for i, (r, k) in enumerate(grid.tolist()):
                if r * k:
                    pos[i, valid[i]] = self.grid_pos(r, k)
            x = x + pos
        cls = (self.cls + self.pos[:1]).expand(b, 1, -1)
        x = torch.cat([cls, x], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=dev), valid], dim=1)
        n = self._most_patches(pixel_shape, layout)
        if n is not None and n < gh * gw:
            x, mask = _real_first(x, mask, 1 + n)
        return x, mask

    def _most_patches(self, pixel_shape: torch.Tensor, layout: Layout | None) -> int | None:
        """The most patches of any sample, from the host (None where only the device knows)."""
        p = self.patch_size
        if layout is not None and layout.shapes is not None:
            shapes = layout.shapes
        elif pixel_shape.device.type == "cpu":
            shapes = [(h, w) for _, h, w in pixel_shape.tolist()]
        else:
            return None
        return max(((h // p) * (w // p) for h, w in shapes), default=0)

    def head(self, x: torch.Tensor, mask: torch.Tensor) -> ImageFeatures:
        """The features after the last block: final norm and the [CLS] embedding."""
        x = self.norm(x)
        return ImageFeatures(x, mask, F.normalize(self.proj(x[:, 0]), dim=-1))

    def packed_pos(self, cu_seqlens: torch.Tensor, image_grid: torch.Tensor,
                   layout: Layout | None = None) -> torch.Tensor:
        """(N, D) position embeddings of packed patches (``grid_pos`` of each sample's grid);
        ``layout``: the grids on the host (None: read from ``image_grid``)."""
        g = self.max_grid
        layout = grid_layout(layout, image_grid)
        if layout.max_grid <= g:
            counts = cu_seqlens[1:] - cu_seqlens[:-1]
            seg = segment_ids(counts, sum(layout.image_counts))
            local = torch.arange(seg.shape[0], device=seg.device) - cu_seqlens[seg]
            width = image_grid[seg, 1]
            return self.pos[1 + (local // width) * g + local % width]
        return torch.cat([self.grid_pos(r, k) for r, k in layout.grid])

    def forward_packed(self, patches: torch.Tensor, cu_seqlens: torch.Tensor,
                       image_grid: torch.Tensor, layout: Layout | None = None) -> PackedImageFeatures:
        """patches (N, C·p·p) of every sample's own grid, row-major, concatenated;
        cu_seqlens (B + 1,) their offsets; image_grid (B, 2) each sample's rows x columns;
        ``layout`` the same sizes on the host (``layout``; None: read from the device)."""
        layout = grid_layout(layout, image_grid)
        x, cu = self.embed_packed(patches, cu_seqlens, image_grid, layout)
        seg = segments(cu[1:] - cu[:-1], sizes=[n + 1 for n in layout.image_counts])
        for blk in self.blocks:
            x = blk(x, seg)
        return self.head_packed(x, cu)

    def embed_packed(self, patches: torch.Tensor, cu_seqlens: torch.Tensor,
                     image_grid: torch.Tensor, layout: Layout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed input of the first block: (M, D) per sample its [CLS] then its patches,
        and the (B + 1,) offsets of the samples in it ([CLS] included)."""
        layout = grid_layout(layout, image_grid)
        b = image_grid.shape[0]
        x = self.patch_embed(patches) + self.packed_pos(cu_seqlens, image_grid, layout)
        counts = cu_seqlens[1:] - cu_seqlens[:-1] + 1  # with the [CLS] token
        cu = cumsum0(counts)
        cls = (self.cls + self.pos[:1]).expand(b, -1)
        # [all CLS; all patches] -> per sample [CLS, its patches]: token t of sample i is its
        # CLS (row i) at t = cu[i], else patch t - cu[i] - 1 of it (row b + cu_seqlens[i] + ...)
        seg = segment_ids(counts, sum(layout.image_counts) + b)
        local = torch.arange(seg.shape[0], device=x.device) - cu[seg]
        order = torch.where(local == 0, seg, b + cu_seqlens[seg] + local - 1)
        return torch.cat([cls, x])[order], cu

    def head_packed(self, x: torch.Tensor, cu: torch.Tensor) -> PackedImageFeatures:
        """``head`` of packed tokens with offsets ``cu`` ([CLS] included)."""
        x = self.norm(x)
        return PackedImageFeatures(x, cu, F.normalize(self.proj(x[cu[:-1]]), dim=-1))


class TextTower(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.text_hidden
        self.max_len = cfg.max_text_len
        self.tok = nn.Embedding(cfg.vocab_size, d)
        self.pos = nn.Embedding(cfg.max_text_len, d)
        self.emb_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.blocks = nn.ModuleList(Block(d, cfg.text_heads, cfg.mlp_ratio, cfg.layer_norm_eps,
                                          post_norm=cfg.text_post_norm)
                                    for _ in range(cfg.text_layers))
        # Post-norm blocks end normalised already (BERT has no final norm).
        self.norm = nn.Identity() if cfg.text_post_norm else nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.proj = nn.Linear(d, cfg.embed_dim)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor, layout: Layout | None = None) -> TextFeatures:
        """input_ids (B, L) right-padded; lengths (B,) unpadded token counts. 1-D input_ids
        are packed (``forward_packed``, with the host ``layout``)."""
        if input_ids.dim() == 1:
            return self.forward_packed(input_ids, lengths, layout)
        x, mask = self.embed(input_ids, lengths)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(x, lengths)

    def embed(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded input of the first block (B, L, D) and its (B, L) bool mask."""
        width = input_ids.shape[1]
        if width > self.max_len:
            raise ValueError(f"text: {width} tokens exceed max_text_len {self.max_len}")
        pos = torch.arange(width, device=input_ids.device)
        x = self.emb_norm(self.tok(input_ids) + self.pos(pos)[None])
        return x, length_mask(lengths, width)

    def head(self, x: torch.Tensor, lengths: torch.Tensor) -> TextFeatures:
        """The features after the last block, padded (B, L, D) or packed (T, D)."""
        x = self.norm(x)
        first = x[:, 0] if x.dim() == 3 else x[cumsum0(lengths.clamp(min=1))[:-1]]
        return TextFeatures(x, lengths, F.normalize(self.proj(first), dim=-1))

    def forward_packed(self, input_ids: torch.Tensor, lengths: torch.Tensor,
                       layout: Layout | None = None) -> TextFeatures:
        """input_ids (Σ max(length, 1),) the captions concatenated (an empty padding sample
        keeps one pad token, as in the padded path); lengths (B,) unpadded token counts
        (``layout.lengths`` on the host; None: read from the device).
        Returns TextFeatures whose ``hidden`` is packed: (Σ max(length, 1), Dt)."""
        x, seg = self.embed_packed(input_ids, lengths, layout)
        for blk in self.blocks:
            x = blk(x, seg)
        return self.head(x, lengths)

    def embed_packed(self, input_ids: torch.Tensor, lengths: torch.Tensor,
                     layout: Layout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed input of the first block (T, D) and its ``Segments``."""
        sizes = fill(layout, lengths=lengths).text_counts
        if sizes and max(sizes) > self.max_len:
            raise ValueError(f"text: {max(sizes)} tokens exceed max_text_len {self.max_len}")
        counts = lengths.clamp(min=1)
        cu = cumsum0(counts)
        seg = segments(counts, sizes=sizes)
        pos = torch.arange(seg.ids.shape[0], device=seg.ids.device) - cu[seg.ids]
        return self.emb_norm(self.tok(input_ids) + self.pos(pos)), seg


class Fusion(nn.Module):
    """Cross-attention fusion (text queries over image tokens) and the ITM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.fusion_hidden
        self.in_proj = nn.Linear(cfg.text_hidden, d) if cfg.text_hidden != d else nn.Identity()
        self.blocks = nn.ModuleList(Block(d, cfg.fusion_heads, cfg.mlp_ratio, cfg.layer_norm_eps,
                                          cross_dim=cfg.vision_hidden)
                                    for _ in range(cfg.fusion_layers))
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.itm_head = nn.Linear(d, 2)

    def forward(self, img: ImageFeatures, txt: TextFeatures,
                neg_text: torch.Tensor, neg_image: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
        """ITM logits (3B, 2) for [positive pairs; (image i, text neg_text[i]); (image neg_image[i], text i)].
        Packed features go to ``forward_packed`` (with the host ``layout``)."""
        if isinstance(img, PackedImageFeatures):
            return self.forward_packed(img, txt, neg_text, neg_image, layout)
        b = img.tokens.shape[0]
        self_idx = torch.arange(b, device=neg_text.device)
        img_idx = torch.cat([self_idx, self_idx, neg_image])
        txt_idx = torch.cat([self_idx, neg_text, self_idx])
        x = self.in_proj(txt.hidden[txt_idx])
        mask = length_mask(txt.lengths[txt_idx], x.shape[1])
        ctx, ctx_mask = img.tokens[img_idx], img.mask[img_idx]
        for blk in self.blocks:
            x = blk(x, mask, ctx, ctx_mask)
        return self.itm_head(self.norm(x[:, 0]))

    def forward_packed(self, img: PackedImageFeatures, txt: TextFeatures,
                       neg_text: torch.Tensor, neg_image: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
        """``forward`` on packed features: each pair's caption tokens attend to themselves
        and cross-attend to that pair's image tokens only. ``layout``: the sizes on the host
        (a field it lacks -- the text lengths on the vision rank of mp 2 -- is read from the device)."""
        b = img.emb.shape[0]
        layout = fill(grid_layout(layout, cu_seqlens=img.cu_seqlens), lengths=txt.lengths,
                      neg_text=neg_text, neg_image=neg_image)
        q_sizes, k_sizes = layout.pairs()
        self_idx = torch.arange(b, device=neg_text.device)
        img_idx = torch.cat([self_idx, self_idx, neg_image])
        txt_idx = torch.cat([self_idx, neg_text, self_idx])
        tok, q_cu = gather_segments(cumsum0(txt.lengths.clamp(min=1)), txt_idx, sum(q_sizes))
        ctx_tok, k_cu = gather_segments(img.cu_seqlens, img_idx, sum(k_sizes))
        q_seg = segments(q_cu[1:] - q_cu[:-1], sizes=q_sizes)
        k_seg = segments(k_cu[1:] - k_cu[:-1], queries=q_seg, sizes=k_sizes)  # the captions over their images
        x = self.in_proj(txt.hidden[tok])
        ctx = img.tokens[ctx_tok]
        for blk in self.blocks:
            x = blk(x, q_seg, ctx, k_seg)
        return self.itm_head(self.norm(x[q_cu[:-1]]))


class ContrastiveHead(nn.Module):
    """Learned inverse temperature of the contrastive logits, clamped like CLIP."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_log = math.log(cfg.max_logit_scale)
        # 1-D (not a scalar): FSDP2 shards parameters along dim 0.
        self.log_scale = nn.Parameter(torch.full((1,), math.log(1.0 / cfg.init_temperature)))

    def forward(self) -> torch.Tensor:
        return self.log_scale.clamp(max=self.max_log).exp()  # shape (1,), broadcasts


class ModelOutput(NamedTuple):
    img_emb: torch.Tensor
    txt_emb: torch.Tensor
    itm_logits: torch.Tensor
    logit_scale: torch.Tensor


class MMModel(nn.Module):
    """The whole model on one device. Parts: ``vision``, ``text``, ``fusion``, ``itc``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.vision = VisionTower(cfg)
        self.text = TextTower(cfg)
        self.fusion = Fusion(cfg)
        self.itc = ContrastiveHead(cfg)
        self.init_weights()

    def init_weights(self) -> None:
        """Deterministic init from the current torch RNG (truncated normal, zero biases)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.vision.pos, std=std, a=-2 * std, b=2 * std)
        nn.init.trunc_normal_(self.vision.cls, std=std, a=-2 * std, b=2 * std)

    def forward(self, pixel_values: torch.Tensor, pixel_shape: torch.Tensor, input_ids: torch.Tensor,
                lengths: torch.Tensor, neg_text: torch.Tensor, neg_image: torch.Tensor) -> ModelOutput:
        img = self.vision(pixel_values, pixel_shape)
        txt = self.text(input_ids, lengths)
        logits = self.fusion(img, txt, neg_text, neg_image)
        return ModelOutput(img.emb, txt.emb, logits, self.itc())

    def forward_packed(self, mb: Batch) -> ModelOutput:
        """The forward pass on a packed micro-batch (``batches.pack``)."""
        img = self.vision(mb.patches, mb.cu_seqlens_image, mb.image_grid, layout=mb.layout)
        txt = self.text(mb.input_ids, mb.lengths, layout=mb.layout)
        logits = self.fusion(img, txt, mb.neg_text, mb.neg_image, layout=mb.layout)
        return ModelOutput(img.emb, txt.emb, logits, self.itc())


def flops_parts(cfg: ModelConfig, text_tokens: int, image_tokens: int) -> dict[str, float]:
    """The forward FLOPs of one sample by part: ``patch_embed``, one ``vision_block``, one
    ``text_block``, and the whole ``fusion`` (its blocks on 3 pairs). ``flops_per_sample`` and
    the pipeline stages' counts (``parallel.pp.stage.stage_flops``) are sums of these.

    Counts matmuls only: 2 x params x tokens for the linear layers plus 4 x n x m x d for
    attention; fusion runs on 3 pairs per sample (positive and two ITM negatives).
    """
    def block(d: int, n: int, m: int, cross: int = 0) -> float:
        lin = 2 * n * (4 * d * d + 2 * cfg.mlp_ratio * d * d)
        att = 4 * n * n * d
        if cross:
            lin += 2 * n * (2 * d * d) + 2 * m * (2 * cross * d)
            att += 4 * n * m * d
        return lin + att

    nv, nt = image_tokens + 1, max(text_tokens, 1)
    return {"patch_embed": 2 * nv * 3 * cfg.patch_size ** 2 * cfg.vision_hidden,
            "vision_block": block(cfg.vision_hidden, nv, 0), "text_block": block(cfg.text_hidden, nt, 0),
            "fusion": 3 * cfg.fusion_layers * block(cfg.fusion_hidden, nt, nv, cross=cfg.vision_hidden)}


def flops_per_sample(cfg: ModelConfig, text_tokens: int, image_tokens: int) -> float:
    """Approximate training FLOPs (forward + backward = 3 x forward) of one sample
    (``flops_parts``)."""
    f = flops_parts(cfg, text_tokens, image_tokens)
    vision = cfg.vision_layers * f["vision_block"] + f["patch_embed"]
    text = cfg.text_layers * f["text_block"]
    return 3.0 * (vision + text + f["fusion"])


def micro_batch_flops(cfg: ModelConfig, mb) -> float:
    """Training FLOPs of one micro-batch (a ``batches.Batch`` with both modalities) as the
    model computes it, every row counted (padding samples too): padded, each row at the
    padded caption length and the most patches of any sample (``VisionTower.embed``); packed,
    each sample at its own length and grid."""
    if mb.packed:
        lengths, grid = mb.lengths.tolist(), mb.image_grid.tolist()
        return sum(flops_per_sample(cfg, n, gh * gw) for n, (gh, gw) in zip(lengths, grid))
    b, width = mb.input_ids.shape
    p = cfg.patch_size
    patches = max(((h // p) * (w // p) for _, h, w in mb.pixel_shape.tolist()), default=0)
    return b * flops_per_sample(cfg, width, patches)
