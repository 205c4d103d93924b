"""The image-text model: plain single-device PyTorch (parallelism is applied from outside).

ALBEF/BLIP style:

* ``VisionTower`` -- ViT. The patch embedding accepts a variable patch grid per sample
  (dynamic resolution): the micro-batch is a zero-padded (B, C, H, W) tensor plus each
  sample's true (C, h, w); patches outside a sample's floor(h/p) x floor(w/p) grid are masked
  out of attention. Position embeddings are looked up by (row, column) in a learned
  ``max_grid x max_grid`` table, so any grid up to that size needs no interpolation.
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

from .config import ModelConfig


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


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool mask of the first max(length, 1) positions.

    A padding sample with no tokens keeps position 0 so that no attention row is all-masked
    (which would give NaN); its weight is 0, so it contributes nothing to any loss.
    """
    pos = torch.arange(width, device=lengths.device)
    return pos[None, :] < lengths.clamp(min=1)[:, None]


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
        if self.post_norm:
            x = self.norm1(x + self.attn(x, mask))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x), mask)
        if self.cross is not None:
            x = x + self.cross(self.cross_norm(x), context_mask, context=context)
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

    def forward(self, pixel_values: torch.Tensor, pixel_shape: torch.Tensor) -> ImageFeatures:
        """pixel_values (B, C, H, W) zero-padded; pixel_shape (B, 3) int: each sample's (C, h, w)."""
        b, c, hgt, wid = pixel_values.shape
        p, g = self.patch_size, self.max_grid
        gh, gw = max(hgt // p, 1), max(wid // p, 1)
        if gh > g or gw > g:
            raise ValueError(f"vision: patch grid {gh}x{gw} exceeds max_grid {g} (image {hgt}x{wid}, patch {p})")
        if hgt < p or wid < p:  # only padding samples are smaller than a patch
            pixel_values = F.pad(pixel_values, (0, max(p - wid, 0), 0, max(p - hgt, 0)))
        x = pixel_values[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
        x = self.patch_embed(x.permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p))
        dev = x.device
        rows = torch.arange(gh, device=dev).repeat_interleave(gw)
        cols = torch.arange(gw, device=dev).repeat(gh)
        x = x + self.pos[1 + rows * g + cols]
        grid = pixel_shape.to(dev, torch.int64)[:, 1:] // p  # (B, 2) true grid per sample
        valid = (rows[None, :] < grid[:, :1]) & (cols[None, :] < grid[:, 1:])
        cls = (self.cls + self.pos[:1]).expand(b, 1, -1)
        x = torch.cat([cls, x], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=dev), valid], dim=1)
        for blk in self.blocks:
            x = blk(x, mask)
        x = self.norm(x)
        return ImageFeatures(x, mask, F.normalize(self.proj(x[:, 0]), dim=-1))


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

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> TextFeatures:
        """input_ids (B, L) right-padded; lengths (B,) unpadded token counts."""
        width = input_ids.shape[1]
        if width > self.max_len:
            raise ValueError(f"text: {width} tokens exceed max_text_len {self.max_len}")
        pos = torch.arange(width, device=input_ids.device)
        x = self.emb_norm(self.tok(input_ids) + self.pos(pos)[None])
        mask = length_mask(lengths, width)
        for blk in self.blocks:
            x = blk(x, mask)
        x = self.norm(x)
        return TextFeatures(x, lengths, F.normalize(self.proj(x[:, 0]), dim=-1))


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
                neg_text: torch.Tensor, neg_image: torch.Tensor) -> torch.Tensor:
        """ITM logits (3B, 2) for [positive pairs; (image i, text neg_text[i]); (image neg_image[i], text i)]."""
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


def flops_per_sample(cfg: ModelConfig, text_tokens: int, image_tokens: int) -> float:
    """Approximate training FLOPs (forward + backward = 3 x forward) of one sample.

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
    vision = cfg.vision_layers * block(cfg.vision_hidden, nv, 0) + 2 * nv * 3 * cfg.patch_size ** 2 * cfg.vision_hidden
    text = cfg.text_layers * block(cfg.text_hidden, nt, 0)
    fusion = 3 * cfg.fusion_layers * block(cfg.fusion_hidden, nt, nv, cross=cfg.vision_hidden)
    return 3.0 * (vision + text + fusion)
