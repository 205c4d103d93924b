"""Initialise the towers from local HuggingFace-format checkpoints (safetensors; nothing downloads).

* ``load_vit(model, path)``: a ``ViTModel`` / ``ViTForImageClassification`` checkpoint
  (keys ``[vit.]embeddings.*``, ``[vit.]encoder.layer.N.*``, ``[vit.]layernorm.*``) into
  ``model.vision``. The conv patch projection (D, C, p, p) is our linear patch embedding
  flattened in the same (C, p, p) order; the checkpoint's G x G position grid fills the
  rows and columns < G of our ``max_grid`` table exactly (a larger table repeats the edge
  row / column beyond, a smaller one keeps the top-left corner).
* ``load_bert(model, path)``: a ``BertModel`` / ``BertForPreTraining`` checkpoint (keys
  ``[bert.]embeddings.*``, ``[bert.]encoder.layer.N.*``) into ``model.text``, which must be
  built with ``text_post_norm=True`` (BERT normalises after each residual add). Token type 0
  is folded into the position table (we have no token types).

Both are exact up to two invariances: the key bias is dropped (softmax over keys ignores a
constant added to every key's score) and pooler / task heads are ignored; the projections to
the contrastive embedding, the fusion block and the ITM head keep their random init. The
layer-norm epsilon is ours (``layer_norm_eps``; HF uses 1e-12), a difference of ~1e-6.

Shapes are checked before anything is copied: a mismatch raises ValueError listing every
differing or missing tensor, so a wrong preset (or a ViT-L checkpoint) is named at once.
``path`` is a ``.safetensors`` file, or a directory with ``model.safetensors`` or a sharded
``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from .model import MMModel


@dataclass(slots=True)
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    """Our parameter names that were overwritten."""
    ignored: list[str] = field(default_factory=list)
    """Checkpoint keys not used (pooler, heads, key biases)."""


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, a directory with model.safetensors, or a sharded index."""
    from safetensors.torch import load_file
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            out = {}
            for name in files:
                out.update(load_file(os.path.join(path, name)))
            return out
        path = os.path.join(path, "model.safetensors")
    if not os.path.exists(path):
        raise ValueError(f"pretrained: {path} does not exist (want a .safetensors file or a directory with "
                         f"model.safetensors)")
    return load_file(path)


# transformers 5 names ViT layers differently in memory (``layers.N.attention.q_proj``); its
# checkpoints keep the names above. A state dict saved from a v5 model is read too.
_VIT_V5 = [
    (r"^layers\.(\d+)\.attention\.([qkv])_proj\.", None),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.(layernorm_before|layernorm_after)\.", r"encoder.layer.\1.\2."),
]
_QKV = {"q": "query", "k": "key", "v": "value"}


def _v4_name(key: str) -> str:
    for pattern, repl in _VIT_V5:
        if repl is None:
            key = re.sub(pattern, lambda m: f"encoder.layer.{m.group(1)}.attention.attention.{_QKV[m.group(2)]}.", key)
        else:
            key = re.sub(pattern, repl, key)
    return key


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop the task wrapper's prefix (``vit.`` / ``bert.``), old LayerNorm gamma/beta names and
    transformers 5's in-memory ViT layer names."""
    out = {}
    for key, value in state.items():
        key = _v4_name(key.removeprefix(prefix))
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        out[re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)] = value
    return out


def _layers(state: dict[str, torch.Tensor]) -> int:
    found = [int(m.group(1)) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k))]
    return max(found) + 1 if found else 0


_VIT_BLOCK = {
    "layernorm_before": "norm1", "attention.attention.query": "attn.q", "attention.attention.key": "attn.k",
    "attention.attention.value": "attn.v", "attention.output.dense": "attn.out", "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2",
}
_BERT_BLOCK = {
    "attention.self.query": "attn.q", "attention.self.key": "attn.k", "attention.self.value": "attn.v",
    "attention.output.dense": "attn.out", "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2", "output.LayerNorm": "norm2",
}


def _block_pairs(tower: str, layers: int, table: dict[str, str]) -> dict[str, str]:
    """HF key -> our name for every weight and bias of every layer (the key bias has no target)."""
    pairs = {}
    for i in range(layers):
        for theirs, ours in table.items():
            pairs[f"encoder.layer.{i}.{theirs}.weight"] = f"{tower}.blocks.{i}.{ours}.weight"
            if ours != "attn.k":
                pairs[f"encoder.layer.{i}.{theirs}.bias"] = f"{tower}.blocks.{i}.{ours}.bias"
    return pairs


def _pos_grid(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """(1 + G*G, D) HF table -> (1 + grid*grid, D): [CLS] row, then the G x G grid cropped or
    edge-extended to grid x grid (exact for every patch (r, c) with r, c < min(G, grid))."""
    cells = pos.shape[0] - 1
    side = math.isqrt(cells)
    if side * side != cells:
        raise ValueError(f"pretrained: position_embeddings has {cells} patch rows, not a square grid")
    g = pos[1:].reshape(side, side, -1)
    idx = torch.arange(grid).clamp(max=side - 1)
    g = g[idx][:, idx]
    return torch.cat([pos[:1], g.reshape(grid * grid, -1)])


def _vit_targets(model: MMModel, state: dict[str, torch.Tensor]) -> dict[str, tuple[str, Callable]]:
    cfg = model.cfg
    same = lambda t: t  # noqa: E731
    targets = {k: (v, same) for k, v in _block_pairs("vision", cfg.vision_layers, _VIT_BLOCK).items()}
    targets.update({
        "embeddings.patch_embeddings.projection.weight": ("vision.patch_embed.weight", lambda t: t.reshape(t.shape[0], -1)),
        "embeddings.patch_embeddings.projection.bias": ("vision.patch_embed.bias", same),
        "embeddings.cls_token": ("vision.cls", lambda t: t.reshape(1, -1)),
        "embeddings.position_embeddings": ("vision.pos", lambda t: _pos_grid(t.reshape(-1, t.shape[-1]), cfg.max_grid)),
        "layernorm.weight": ("vision.norm.weight", same),
        "layernorm.bias": ("vision.norm.bias", same),
    })
    return targets


def _grown_rows(t: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    """A checkpoint's word embeddings in a model whose vocabulary was grown (``--resize-vocab``):
    its rows first, the model's own initial rows after them. Any other shape is left to the
    shape check."""
    if t.dim() != 2 or t.shape[0] >= ours.shape[0] or t.shape[1] != ours.shape[1]:
        return t
    return torch.cat([t.to(ours.dtype), ours.detach()[t.shape[0]:].to(t.device)])


def _bert_targets(model: MMModel, state: dict[str, torch.Tensor]) -> dict[str, tuple[str, Callable]]:
    cfg = model.cfg
    same = lambda t: t  # noqa: E731
    targets = {k: (v, same) for k, v in _block_pairs("text", cfg.text_layers, _BERT_BLOCK).items()}
    token_type = state.get("embeddings.token_type_embeddings.weight")

    def positions(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] < cfg.max_text_len:
            return t  # the shape check reports it
        t = t[:cfg.max_text_len]
        return t + token_type[0] if token_type is not None else t
    targets.update({
        "embeddings.word_embeddings.weight": ("text.tok.weight", lambda t: _grown_rows(t, model.text.tok.weight)),
        "embeddings.position_embeddings.weight": ("text.pos.weight", positions),
        "embeddings.LayerNorm.weight": ("text.emb_norm.weight", same),
        "embeddings.LayerNorm.bias": ("text.emb_norm.bias", same),
    })
    return targets


def _copy(model: MMModel, state: dict[str, torch.Tensor], targets: dict, what: str, path: str) -> LoadReport:
    params = dict(model.named_parameters())
    problems, pending = [], []
    for theirs, (ours, convert) in sorted(targets.items()):
        if theirs not in state:
            problems.append(f"  missing {theirs} (for {ours} {tuple(params[ours].shape)})")
            continue
        value = convert(state[theirs])
        if tuple(value.shape) != tuple(params[ours].shape):
            problems.append(f"  {theirs} {tuple(state[theirs].shape)} -> {ours}: checkpoint gives "
                            f"{tuple(value.shape)}, model has {tuple(params[ours].shape)}")
            continue
        pending.append((ours, value))
    extra = _layers(state) - (model.cfg.vision_layers if what == "ViT" else model.cfg.text_layers)
    if extra > 0:
        problems.append(f"  checkpoint has {extra} more encoder layers than the model")
    if problems:
        raise ValueError(f"pretrained: {what} checkpoint {path} does not fit the model "
                         f"({len(problems)} problems):\n" + "\n".join(problems))
    with torch.no_grad():
        for ours, value in pending:
            params[ours].copy_(value.to(params[ours].dtype))
    used = set(targets)
    return LoadReport(loaded=[ours for ours, _ in pending], ignored=sorted(k for k in state if k not in used))


def load_vit(model: MMModel, path: str) -> LoadReport:
    """Copy a HuggingFace ViT checkpoint into ``model.vision`` (module doc for the mapping)."""
    state = _strip(read_safetensors(path), "vit.")
    return _copy(model, state, _vit_targets(model, state), "ViT", path)


def load_bert(model: MMModel, path: str) -> LoadReport:
    """Copy a HuggingFace BERT checkpoint into ``model.text`` (needs ``text_post_norm``)."""
    if not model.cfg.text_post_norm:
        raise ValueError("pretrained: BERT is post-norm; build the model with text_post_norm=True "
                         "(the trainer's --init-text does)")
    state = _strip(read_safetensors(path), "bert.")
    return _copy(model, state, _bert_targets(model, state), "BERT", path)

