"""Model and training configuration: documented dataclasses with validation and named presets.

The model presets live in ``presets/*.json`` in the schema that the Go service's cost
model reads as well (``mmfeed --model tiny|base|base-8h|FILE.json``); ``model_config``
takes a preset name or such a file."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the image-text model (vision tower, text tower, fusion block, heads)."""

    image_channels: int = 3
    """Channels of the pixel tensor (CHW)."""
    patch_size: int = 16
    """Side of a square ViT patch in pixels; images are cut into floor(H/p) x floor(W/p) patches."""
    max_grid: int = 32
    """Largest patch grid side the learned position table covers (32 x 16 = 512 px)."""
    vision_hidden: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_post_norm: bool = False
    """BERT-style text blocks (layer norm after each residual add, no final norm); set when
    loading a BERT checkpoint (``pretrained.load_bert``)."""
    vocab_size: int = 30522
    """Token vocabulary (bert-base-uncased)."""
    max_text_len: int = 512
    """Longest caption in tokens (position table size)."""
    pad_token_id: int = 0
    fusion_hidden: int = 64
    fusion_layers: int = 1
    fusion_heads: int = 4
    mlp_ratio: int = 4
    """MLP hidden = mlp_ratio x model hidden in every block."""
    embed_dim: int = 64
    """Shared image-text embedding size of the contrastive loss."""
    init_temperature: float = 0.07
    """Initial softmax temperature of the contrastive logits (learned, CLIP style)."""
    max_logit_scale: float = 100.0
    """Upper clamp of the learned 1/temperature."""
    layer_norm_eps: float = 1e-6
    init_std: float = 0.02
    """Std of the truncated-normal init of linear and embedding weights."""

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        positive = ("image_channels", "patch_size", "max_grid", "vision_hidden", "vision_layers",
                    "vision_heads", "text_hidden", "text_layers", "text_heads", "vocab_size",
                    "max_text_len", "fusion_hidden", "fusion_layers", "fusion_heads", "mlp_ratio",
                    "embed_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be > 0, got {getattr(self, name)}")
        for hidden, heads in (("vision_hidden", "vision_heads"), ("text_hidden", "text_heads"),
                              ("fusion_hidden", "fusion_heads")):
            if getattr(self, hidden) % getattr(self, heads):
                raise ValueError(f"model config: {hidden}={getattr(self, hidden)} is not divisible "
                                 f"by {heads}={getattr(self, heads)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"model config: pad_token_id {self.pad_token_id} outside vocab "
                             f"[0, {self.vocab_size})")
        if not 0 < self.init_temperature < 1:
            raise ValueError(f"model config: init_temperature must be in (0, 1), got {self.init_temperature}")


PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets")
"""The model presets, one JSON file each, in the schema the Go service reads too
(balancer/presets holds a generated copy; a Go test fails when they drift)."""
SCHEMA_ONLY = ("name", "description")
"""Schema keys that are no ModelConfig field: labels."""


def load_model_file(path: str) -> ModelConfig:
    """A ModelConfig from a preset-schema JSON file (``presets/*.json`` or your own);
    ValueError naming an unknown key or a bad value."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"model file {path}: {err}") from err
    if not isinstance(doc, dict):
        raise ValueError(f"model file {path}: want a JSON object")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(doc) - fields - set(SCHEMA_ONLY))
    if unknown:
        raise ValueError(f"model file {path}: unknown keys {unknown} (schema: {sorted(fields | set(SCHEMA_ONLY))})")
    cfg = ModelConfig(**{k: v for k, v in doc.items() if k in fields})
    cfg.validate()
    return cfg


def preset_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR) if f.endswith(".json"))


def tiny() -> ModelConfig:
    """CPU-test size: ViT 64 x 2 layers (patch 16), text 64 x 2 layers, fusion 64 x 1 layer."""
    return load_model_file(os.path.join(PRESET_DIR, "tiny.json"))


def base() -> ModelConfig:
    """GPU size: ViT-B/16 + BERT-base + 6 fusion layers (ALBEF/BLIP base)."""
    return load_model_file(os.path.join(PRESET_DIR, "base.json"))


PRESETS = {name: (lambda n=name: load_model_file(os.path.join(PRESET_DIR, f"{n}.json"))) for name in preset_names()}
"""tiny, base, base-8h: name -> ModelConfig factory."""


def model_config(name: str, **overrides) -> ModelConfig:
    """The named preset, or a preset-schema JSON file (a name ending in .json), with field
    overrides; ValueError for an unknown name or field."""
    if name.endswith(".json"):
        cfg = load_model_file(name)
    elif name in PRESETS:
        cfg = PRESETS[name]()
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(PRESETS)} or a FILE.json")
    fields = {f.name for f in dataclasses.fields(cfg)}
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown model config field {key!r}")
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay, gradient clipping."""

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at lr x min_lr_ratio."""
    warmup_steps: int = 10
    total_steps: int = 1000
    """Length of the cosine schedule (the run may stop earlier)."""
    weight_decay: float = 0.05
    """Applied to matrices only (not to biases, norms, scales)."""
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    """Global L2 norm clip over the whole model (all dp shards and mp ranks); <= 0 disables."""

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim config: lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim config: min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.total_steps <= 0:
            raise ValueError(f"optim config: warmup_steps >= 0 and total_steps > 0 required, got "
                             f"{self.warmup_steps}, {self.total_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"optim config: weight_decay must be >= 0, got {self.weight_decay}")
