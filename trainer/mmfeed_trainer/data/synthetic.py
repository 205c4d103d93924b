"""Deterministic synthetic micro-batches in the wire schema (tests, benchmarks, gpu-check).

Each (seed, step, dp rank) gives the same records on every process: unequal sample counts
per rank and micro-batch, dynamic image resolutions in patch multiples, ragged captions, and
zero-weight padding samples (some empty, some with content that must be ignored).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .. import keys

CLS_ID, SEP_ID = 101, 102
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
_ARROW_PIXEL = {"float16": pa.float16(), "float32": pa.float32(), "bfloat16": pa.uint16(), "uint8": pa.uint8()}


@dataclass(kw_only=True, slots=True)
class SynthConfig:
    """Shape of the synthetic stream."""

    seed: int = 0
    dp: int = 1
    """Data-parallel ranks (records are generated per dp rank)."""
    micro_batches: int = 2
    """Micro-batches per step (equal on every rank, as the service guarantees)."""
    min_samples: int = 2
    max_samples: int = 5
    """Samples per (rank, micro-batch), drawn uniformly: ranks get unequal counts."""
    pad_prob: float = 0.2
    """Probability that a sample is a zero-weight padding sample."""
    min_text: int = 3
    max_text: int = 12
    """Caption length in tokens including [CLS] and [SEP]."""
    vocab_size: int = 30522
    patch: int = 16
    grids: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 1), (2, 2))
    """Patch grids (rows, cols) to draw image sizes from; one entry = fixed resolution."""
    dtype: str = "float32"
    """Pixel wire dtype: float32, float16, bfloat16 or uint8."""
    distinct_steps: int = 0
    """> 0: the source cycles through this many generated steps (cheap data for benchmarks,
    so generation never limits the trainer); 0: every step is new."""


def _pixels(rng: np.random.Generator, c: int, h: int, w: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw uint8 image and its wire encoding."""
    raw = rng.integers(0, 256, size=(c, h, w), dtype=np.uint8)
    if dtype == "uint8":
        return raw, raw
    norm = (raw.astype(np.float32) / 255.0 - np.array(MEAN, np.float32)[:, None, None]) / np.array(STD, np.float32)[:, None, None]
    return raw, encode_float(norm, dtype)


def encode_float(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array -> wire elements (bfloat16 as round-to-nearest-even uint16 bits)."""
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype(np.uint16)
    raise ValueError(f"synthetic: unknown dtype {dtype!r}")


def pixel_field(dtype: str, shape: list[int] | None = None) -> pa.Field:
    md = {keys.FIELD_DTYPE: dtype, keys.FIELD_LAYOUT: keys.LAYOUT_CHW, keys.FIELD_SHAPE: json.dumps(shape),
          keys.FIELD_MEAN: json.dumps(list(MEAN)), keys.FIELD_STD: json.dumps(list(STD))}
    return pa.field(keys.COL_PIXEL_VALUES, pa.list_(_ARROW_PIXEL[dtype]), metadata=md)


def schema(dtype: str, *, dp_rank: int = 0, job: str = "synthetic") -> pa.Schema:
    types = {keys.COL_ID: pa.string(), keys.COL_STEP: pa.int32(), keys.COL_MICRO_BATCH: pa.int32(),
             keys.COL_INPUT_IDS: pa.list_(pa.int32()), keys.COL_PIXEL_SHAPE: pa.list_(pa.int32(), 3),
             keys.COL_TEXT_TOKENS: pa.int32(), keys.COL_IMAGE_TOKENS: pa.int32(), keys.COL_COST: pa.float64(),
             keys.COL_WEIGHT: pa.float32()}
    fields = [pixel_field(dtype) if name == keys.COL_PIXEL_VALUES else pa.field(name, types[name])
              for name in keys.MODALITY_COLUMNS["all"]]
    md = {keys.META_SCHEMA_VERSION: keys.SCHEMA_VERSION, keys.META_JOB: job, keys.META_EPOCH: "0",
          keys.META_DP_RANK: str(dp_rank), keys.META_MP_RANK: "0", keys.META_MODALITY: "all"}
    return pa.schema(fields, metadata=md)


def _sample(rng: np.random.Generator, cfg: SynthConfig, pad: bool) -> dict:
    empty = pad and rng.random() < 0.5
    n_text = 0 if empty else int(rng.integers(cfg.min_text, cfg.max_text + 1))
    ids = [CLS_ID] + rng.integers(1000, cfg.vocab_size, size=max(n_text - 2, 0)).tolist() + [SEP_ID]
    ids = ids[:n_text]
    gh, gw = cfg.grids[int(rng.integers(len(cfg.grids)))]
    c, h, w = (3, 0, 0) if empty else (3, gh * cfg.patch, gw * cfg.patch)
    _, wire = _pixels(rng, c, h, w, cfg.dtype)
    return {"ids": ids, "pixels": wire.reshape(-1), "shape": [c, h, w], "weight": 0.0 if pad else 1.0,
            "image_tokens": (h // cfg.patch) * (w // cfg.patch)}


def micro_batch(cfg: SynthConfig, step: int, dp_rank: int, mb: int) -> pa.RecordBatch:
    """The record of (step, dp rank, micro-batch); a pure function of its arguments."""
    rng = np.random.default_rng([cfg.seed, step, dp_rank, mb])
    n = int(rng.integers(cfg.min_samples, cfg.max_samples + 1))
    samples = [_sample(rng, cfg, pad=bool(rng.random() < cfg.pad_prob)) for _ in range(n)]
    if all(s["weight"] == 0 for s in samples):
        samples[0] = _sample(rng, cfg, pad=False)
    ids = [f"s{step}-r{dp_rank}-m{mb}-{i}" for i in range(n)]
    arrays = {
        keys.COL_ID: pa.array(ids, pa.string()),
        keys.COL_STEP: pa.array([step] * n, pa.int32()),
        keys.COL_MICRO_BATCH: pa.array([mb] * n, pa.int32()),
        keys.COL_INPUT_IDS: pa.array([s["ids"] for s in samples], pa.list_(pa.int32())),
        keys.COL_PIXEL_VALUES: pa.ListArray.from_arrays(
            pa.array(np.cumsum([0] + [len(s["pixels"]) for s in samples]), pa.int32()),
            pa.array(np.concatenate([s["pixels"] for s in samples]), _ARROW_PIXEL[cfg.dtype])),
        keys.COL_PIXEL_SHAPE: pa.array([s["shape"] for s in samples], pa.list_(pa.int32(), 3)),
        keys.COL_TEXT_TOKENS: pa.array([len(s["ids"]) for s in samples], pa.int32()),
        keys.COL_IMAGE_TOKENS: pa.array([s["image_tokens"] for s in samples], pa.int32()),
        keys.COL_COST: pa.array([float(len(s["ids"]) + s["image_tokens"]) for s in samples], pa.float64()),
        keys.COL_WEIGHT: pa.array([s["weight"] for s in samples], pa.float32()),
    }
    sch = schema(cfg.dtype, dp_rank=dp_rank)
    return pa.RecordBatch.from_arrays([arrays[name] for name in sch.names], schema=sch)


def step_records(cfg: SynthConfig, step: int, dp_rank: int) -> list[pa.RecordBatch]:
    return [micro_batch(cfg, step, dp_rank, m) for m in range(cfg.micro_batches)]


def write_shards(cfg: SynthConfig, directory: str, steps: int) -> list[str]:
    """Write ``rank-%05d.arrow`` per dp rank (the ``mmfeed shard`` layout) for ``steps`` steps."""
    import os
    paths = []
    os.makedirs(directory, exist_ok=True)
    for r in range(cfg.dp):
        path = os.path.join(directory, f"rank-{r:05d}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema(cfg.dtype, dp_rank=r)) as writer:
            for s in range(steps):
                for rec in step_records(cfg, s, r):
                    writer.write_batch(rec)
        paths.append(path)
    return paths
