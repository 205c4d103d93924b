"""Arrow record batch (one micro-batch, docs/protocol.md schema) -> a typed ``Batch`` of tensors.

``Batch`` is what travels inside the trainer from decode to loss (the prefetcher, the step, the
model, the losses, the pipeline stages). ``record_to_batch(rb, role=...)`` returns one of host
tensors (pinned on request):

* always: ``ids`` (list[str]), ``step``, ``micro_batch`` (int), ``weight`` float32 (B,),
  ``num_live`` (int, samples with weight > 0), ``epoch`` (int, 0 unless the reader sets it);
* text (roles full and text): ``input_ids`` int64 (B, L) right-padded with ``pad_id`` to the
  micro-batch's longest, ``attention_mask`` int64 (B, L), ``lengths`` int64 (B,);
* vision (roles full and vision): ``pixel_values`` (B, C, H, W) zero-padded to the largest
  image, still in the wire's compact dtype (``pixel_dtype``: uint8 / float16 / bfloat16 /
  float32), its ``pixel_mean`` / ``pixel_std`` and ``pixel_shape`` int64 (B, 3); and the
  deterministic ITM negatives ``neg_text`` / ``neg_image`` int64 (B,).

* kept source fields (``mmfeed --keep url,json:label``): ``keep``, a dict from each kept
  column's name (``keep.url`` -> ``"url"``) to its values, one Python ``str`` / ``int`` /
  ``float`` or None (missing) per row; None when the record has no kept columns.

A field a role does not receive is None. ``Batch.to_dict()`` is the untyped form the stream
client (``stream.Stream``) hands out and ``data`` turns into HF-style items: the same names,
except that ``ids`` is keyed ``id``, and None fields left out.

``pack(batch, patch_size)`` turns a batch into a packed one (``--pack``): no padding,
per-sample boundaries instead. It replaces the padded fields and keeps the others:

* text: ``input_ids`` int64 (Σ max(length, 1),) the captions concatenated (an empty padding
  sample keeps one pad token, as the padded path does), ``cu_seqlens_text`` int64 (B + 1,)
  their offsets, ``lengths`` as before (``attention_mask`` becomes None);
* vision: ``patches`` (Σ rows·cols, C·p·p) every sample's own patch grid, row-major,
  concatenated, ``cu_seqlens_image`` int64 (B + 1,) their offsets, ``image_grid`` int64 (B, 2)
  each sample's patch rows x columns (``pixel_values`` becomes None). Packed on the device,
  the patches are the normalised float32 pixels; packed on the host, they keep the wire
  dtype and ``Batch.to`` normalises them (only real pixels: a quarter of the bytes to move
  for uint8, and no normalising of padding).

The wire does not change: the per-sample tensors arrive with their shapes and are packed by
the trainer (on the host on the CPU, on the device under CUDA).

``Batch.to(device)`` (and ``to_device(batch, device)``, which also takes the dict form) moves it
and makes ``pixel_values`` a normalised float32 tensor on the device: uint8 -> (x/255 - mean)/std
with the mean/std of the field metadata, bfloat16 from its raw uint16 bits, float16/float32 as
they are. Every wire dtype therefore gives the same tensor up to that dtype's rounding.

JPEG micro-batches (dtype ``jpeg`` or ``jpeg-source``: the opt-in JPEG wire and JPEG shard
sets) keep their rows encoded on the host (``pixel_jpeg``, a list of 1-D uint8 tensors, each
checked against the wire's limits; ``pixel_values`` None) until ``Batch.decoded(device)`` (the
prefetcher, on the trainer's device) or ``Batch.to`` decodes the whole micro-batch into the uint8
``pixel_values`` of the exact uint8 path (``jpegwire``).

Bad input (missing column, wrong type, pixel count not C*H*W, unknown dtype, a JPEG row over
its limits or that does not decode) raises ``BatchError`` (a ValueError) naming the column or
sample id.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from . import jpegwire
from .. import keys
from . import layout as layouts
from .negatives import itm_negatives
from ..parallel.parallel_dims import ROLE_FULL, ROLE_TEXT, ROLE_VISION

WIRE_DTYPES = {"float16": pa.float16(), "float32": pa.float32(), "bfloat16": pa.uint16(), "uint8": pa.uint8()}


class BatchError(ValueError):
    """A record batch that does not follow the wire schema."""


_TENSOR_FIELDS = ("weight", "input_ids", "attention_mask", "lengths", "cu_seqlens_text", "pixel_values",
                  "pixel_shape", "pixel_mean", "pixel_std", "patches", "cu_seqlens_image", "image_grid",
                  "neg_text", "neg_image")
PACKED_KEYS = ("cu_seqlens_text", "cu_seqlens_image", "image_grid")
"""The fields a packed batch adds (``pack``); any of them set marks a batch as packed."""


@dataclass(slots=True, kw_only=True)
class Batch:
    """One micro-batch of a rank (module doc); a field its role does not receive is None."""

    ids: list[str]
    step: int
    micro_batch: int
    weight: torch.Tensor
    num_live: int
    epoch: int = 0
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    """Padded text only."""
    lengths: torch.Tensor | None = None
    cu_seqlens_text: torch.Tensor | None = None
    """Packed text only."""
    pixel_values: torch.Tensor | None = None
    """Padded vision only: wire dtype on the host, normalised float on the device."""
    pixel_shape: torch.Tensor | None = None
    pixel_mean: torch.Tensor | None = None
    pixel_std: torch.Tensor | None = None
    pixel_dtype: str | None = None
    pixel_jpeg: list[torch.Tensor] | None = None
    """JPEG micro-batches only, until decoded: each row's bytes (module doc)."""
    pixel_resize: str | None = None
    """``jpeg-source`` only: the resize the decode applies (``jpegwire``)."""
    patches: torch.Tensor | None = None
    """Packed vision only (with ``cu_seqlens_image`` and ``image_grid``)."""
    cu_seqlens_image: torch.Tensor | None = None
    image_grid: torch.Tensor | None = None
    neg_text: torch.Tensor | None = None
    neg_image: torch.Tensor | None = None
    keep: dict[str, list] | None = None
    """Kept source fields by name, one value (or None) per row (``--keep``)."""
    layout: layouts.Layout | None = None
    """The per-sample sizes on the host (``layout``): recorded by ``to`` from the host tensors,
    completed by ``pack``; the packed forward reads them instead of the device."""

    @property
    def packed(self) -> bool:
        return any(getattr(self, k) is not None for k in PACKED_KEYS)

    @property
    def size(self) -> int:
        """Rows (samples, padding ones included)."""
        return int(self.weight.shape[0])

    @property
    def slot(self) -> dict:
        """``{"epoch", "step", "micro_batch"}``: where it is in the plan (``position.Position``)."""
        return {"epoch": self.epoch, "step": self.step, "micro_batch": self.micro_batch}

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (getattr(self, k) for k in _TENSOR_FIELDS) if t is not None]

    def replace(self, **changes) -> Batch:
        return dataclasses.replace(self, **changes)

    def map_tensors(self, fn) -> Batch:
        """A copy with ``fn`` applied to every tensor field."""
        return dataclasses.replace(self, **{k: fn(getattr(self, k)) for k in _TENSOR_FIELDS
                                            if getattr(self, k) is not None})

    def pin_memory(self) -> Batch:
        """Host tensors in pinned memory (for asynchronous copies to CUDA)."""
        return self.map_tensors(lambda t: t if t.is_pinned() else t.pin_memory())

    def decoded(self, device: torch.device | str = "cpu") -> Batch:
        """A JPEG micro-batch with its rows decoded into uint8 ``pixel_values`` on ``device``
        (``jpegwire.decode_pixels``); any other batch as it is."""
        if self.pixel_jpeg is None:
            return self
        try:
            px = jpegwire.decode_pixels(self.pixel_jpeg, self.pixel_shape, self.pixel_dtype, self.pixel_resize,
                                        self.ids, device)
        except jpegwire.JPEGError as err:
            raise BatchError(f"batch: step {self.step} micro-batch {self.micro_batch}: {err}") from err
        return self.replace(pixel_values=px, pixel_jpeg=None, pixel_resize=None, pixel_dtype="uint8")

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """On ``device``, with the pixels normalised to float32 there (module doc); a host
        batch records its ``layout`` first (nothing to read back from the device later)."""
        src = self.decoded(device)
        out = src.map_tensors(lambda t: t.to(device, non_blocking=non_blocking))
        if out.layout is None and src.weight.device.type == "cpu":
            out.layout = src.host_layout()
        if out.pixel_values is not None:
            out.pixel_values = _normalise(out.pixel_values, src.pixel_dtype, out.pixel_mean, out.pixel_std,
                                          out.pixel_shape)
        if out.patches is not None and out.patches.dtype != torch.float32:  # packed on the host
            out.patches = _normalise_patches(out.patches, out.pixel_mean, out.pixel_std)
        return out

    def host_layout(self, patch_size: int | None = None) -> layouts.Layout:
        """The ``layout`` read from this batch's tensors (free on the host; syncs elsewhere)."""
        return layouts.of_tensors(lengths=self.lengths, pixel_shape=self.pixel_shape, neg_text=self.neg_text,
                                  neg_image=self.neg_image, patch_size=patch_size)

    def to_dict(self) -> dict:
        """The untyped form: the documented key names (``ids`` as ``id``), None fields left out."""
        out = {"id": self.ids, "epoch": self.epoch, "step": self.step, "micro_batch": self.micro_batch,
               "num_live": self.num_live}
        for name in ("weight", "input_ids", "attention_mask", "lengths", "cu_seqlens_text", "pixel_values",
                     "pixel_shape", "pixel_mean", "pixel_std", "pixel_dtype", "patches", "cu_seqlens_image",
                     "image_grid", "neg_text", "neg_image", "keep"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


_TYPE_CHECKS = {
    keys.COL_ID: (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "utf8"),
    keys.COL_STEP: (pa.types.is_integer, "int32"),
    keys.COL_MICRO_BATCH: (pa.types.is_integer, "int32"),
    keys.COL_WEIGHT: (pa.types.is_floating, "float32"),
    keys.COL_INPUT_IDS: (lambda t: pa.types.is_list(t) and pa.types.is_integer(t.value_type), "list<int32>"),
    keys.COL_PIXEL_VALUES: (pa.types.is_list, "list<E>"),
    keys.COL_PIXEL_SHAPE: (lambda t: pa.types.is_fixed_size_list(t) and t.list_size == 3
                    and pa.types.is_integer(t.value_type), "fixed_size_list<int32>[3]"),
}


def _column(rb: pa.RecordBatch, name: str) -> pa.Array:
    idx = rb.schema.get_field_index(name)
    if idx < 0:
        raise BatchError(f"batch: missing column {name!r} (have {rb.schema.names})")
    col = rb.column(idx)
    check, want = _TYPE_CHECKS.get(name, (lambda t: True, ""))
    if not check(col.type):
        raise BatchError(f"batch: column {name!r} is {col.type}, want {want}")
    return col


def _list_parts(arr: pa.Array, name: str) -> tuple[np.ndarray, pa.Array]:
    """(lengths int64 (B,), flat values) of a list column, nulls as empty lists."""
    if not pa.types.is_list(arr.type) and not pa.types.is_large_list(arr.type):
        raise BatchError(f"batch: column {name!r} is {arr.type}, want a list")
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(offsets)
    if arr.null_count:
        lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    return lengths, arr.flatten()


def _text(rb: pa.RecordBatch, pad_id: int) -> dict:
    lengths, flat = _list_parts(_column(rb, keys.COL_INPUT_IDS), keys.COL_INPUT_IDS)
    ids = flat.to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(int(lengths.max(initial=0)), 1)
    out = np.full((len(lengths), width), pad_id, dtype=np.int64)
    mask = np.arange(width)[None, :] < lengths[:, None]
    out[mask] = ids
    return {"input_ids": torch.from_numpy(out), "attention_mask": torch.from_numpy(mask.astype(np.int64)),
            "lengths": torch.from_numpy(lengths.copy())}


def _pixel_field_meta(rb: pa.RecordBatch) -> dict[str, str]:
    _column(rb, keys.COL_PIXEL_VALUES)  # present, with a list type
    field = rb.schema.field(keys.COL_PIXEL_VALUES)
    return {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}


def _pixel_meta(rb: pa.RecordBatch) -> tuple[str, list[float], list[float]]:
    md = _pixel_field_meta(rb)
    dtype = md.get(keys.FIELD_DTYPE)
    if dtype not in WIRE_DTYPES and dtype not in jpegwire.JPEG_DTYPES:
        raise BatchError(f"batch: pixel_values dtype metadata {dtype!r}, want one of "
                         f"{sorted([*WIRE_DTYPES, *jpegwire.JPEG_DTYPES])}")
    if md.get(keys.FIELD_LAYOUT, keys.LAYOUT_CHW) != keys.LAYOUT_CHW:
        raise BatchError(f"batch: pixel_values layout {md.get(keys.FIELD_LAYOUT)!r}, want {keys.LAYOUT_CHW}")
    try:
        mean = [float(v) for v in json.loads(md.get(keys.FIELD_MEAN, "[0,0,0]"))]
        std = [float(v) for v in json.loads(md.get(keys.FIELD_STD, "[1,1,1]"))]
    except (ValueError, TypeError) as err:
        raise BatchError(f"batch: pixel_values mean/std metadata: {err}") from err
    return dtype, mean, std


# numpy element type used to copy each wire dtype, and the torch dtype of the result.
_STORAGE = {"float16": (np.float16, torch.float16), "float32": (np.float32, torch.float32),
            "bfloat16": (np.int16, torch.int16), "uint8": (np.uint8, torch.uint8)}


def _values(values: pa.Array, dtype: str) -> np.ndarray:
    """The flat pixel elements as a numpy view of the Arrow buffer (no copy)."""
    if values.type != WIRE_DTYPES[dtype]:
        raise BatchError(f"batch: pixel_values elements are {values.type}, metadata says {dtype}")
    return values.to_numpy(zero_copy_only=False).view(_STORAGE[dtype][0])


def _vision(rb: pa.RecordBatch, ids: list[str], pin: bool) -> dict:
    dtype, mean, std = _pixel_meta(rb)
    lengths, flat = _list_parts(_column(rb, keys.COL_PIXEL_VALUES), keys.COL_PIXEL_VALUES)
    shape_col = _column(rb, keys.COL_PIXEL_SHAPE)
    shapes = shape_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(-1, 3)
    if dtype in jpegwire.JPEG_DTYPES:
        return _jpeg_vision(rb, ids, dtype, mean, std, lengths, flat, shapes)
    if (shapes < 0).any() or (shapes.prod(axis=1) != lengths).any():
        bad = int(np.nonzero((shapes < 0).any(axis=1) | (shapes.prod(axis=1) != lengths))[0][0])
        raise BatchError(f"batch: sample {ids[bad]!r} has {lengths[bad]} pixel values, shape {shapes[bad].tolist()}")
    channels = set(shapes[lengths > 0, 0].tolist()) or {3}
    if len(channels) != 1 or len(mean) != next(iter(channels)) or len(std) != len(mean):
        raise BatchError(f"batch: channel counts {sorted(channels)} do not match mean/std of length {len(mean)}")
    c = next(iter(channels))
    values = _values(flat, dtype)
    h, w = int(shapes[:, 1].max(initial=1)), int(shapes[:, 2].max(initial=1))
    fixed = bool((shapes[:, 1] == h).all() and (shapes[:, 2] == w).all() and (lengths > 0).all())
    # One copy, straight into (pinned) torch memory: the Arrow buffer may go away after this.
    alloc = torch.empty if fixed else torch.zeros
    pixels = alloc((len(ids), c, h, w), dtype=_STORAGE[dtype][1], pin_memory=pin)
    out = pixels.numpy()
    if fixed:
        out[...] = values.reshape(out.shape)
    else:
        start = 0
        for i, (n, (_, hi, wi)) in enumerate(zip(lengths.tolist(), shapes.tolist())):
            if n:
                out[i, :, :hi, :wi] = values[start:start + n].reshape(c, hi, wi)
            start += n
    if dtype == "bfloat16":
        pixels = pixels.view(torch.bfloat16)
    return {"pixel_values": pixels, "pixel_shape": torch.from_numpy(shapes.copy()),
            "pixel_mean": torch.tensor(mean, dtype=torch.float32), "pixel_std": torch.tensor(std, dtype=torch.float32),
            "pixel_dtype": dtype}


def _keep(rb: pa.RecordBatch) -> dict[str, list] | None:
    """The kept columns (``keys.KEEP_COLUMN_PREFIX`` + name: utf8, int64 or float64, nullable)
    by name, as Python lists; None when there are none."""
    out: dict[str, list] = {}
    for i, field in enumerate(rb.schema):
        if not field.name.startswith(keys.KEEP_COLUMN_PREFIX):
            continue
        t = field.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_int64(t) or pa.types.is_float64(t)):
            raise BatchError(f"batch: kept column {field.name!r} is {t}, want utf8, int64 or float64")
        out[field.name[len(keys.KEEP_COLUMN_PREFIX):]] = rb.column(i).to_pylist()
    return out or None


def _jpeg_vision(rb: pa.RecordBatch, ids: list[str], dtype: str, mean: list[float], std: list[float],
                 lengths: np.ndarray, flat: pa.Array, shapes: np.ndarray) -> dict:
    """The vision fields of a JPEG micro-batch: rows checked and kept encoded (module doc)."""
    if len(mean) != 3 or len(std) != 3:
        raise BatchError(f"batch: {dtype} pixels need mean/std of 3 channels, have {len(mean)}/{len(std)}")
    bad = np.nonzero((shapes[:, 0] != 3) | (shapes[:, 1:] < 1).any(axis=1))[0]
    if len(bad):
        raise BatchError(f"batch: {dtype} sample {ids[bad[0]]!r} has shape {shapes[bad[0]].tolist()}, want 3,H,W")
    try:
        resize = jpegwire.parse_resize(dtype, _pixel_field_meta(rb).get(keys.FIELD_RESIZE))
        rows = jpegwire.host_rows(dtype, lengths, flat, shapes, ids)
    except jpegwire.JPEGError as err:
        raise BatchError(f"batch: {err}") from err
    return {"pixel_values": None, "pixel_jpeg": rows, "pixel_resize": resize,
            "pixel_shape": torch.from_numpy(shapes.copy()), "pixel_mean": torch.tensor(mean, dtype=torch.float32),
            "pixel_std": torch.tensor(std, dtype=torch.float32), "pixel_dtype": dtype}


def _int_scalar(rb: pa.RecordBatch, name: str) -> int:
    col = _column(rb, name).to_numpy(zero_copy_only=False)
    if (col != col[0]).any():
        raise BatchError(f"batch: column {name!r} is not constant within the micro-batch")
    return int(col[0])


def tokenizer_meta(rb: pa.RecordBatch) -> tuple[int | None, int | None]:
    """The (vocab size, pad id) of the tokenizer that made ``rb``'s ids, from its
    ``mmfeed.vocab_size`` / ``mmfeed.pad_id`` schema metadata; None where absent."""
    md = rb.schema.metadata or {}
    out = []
    for key in (keys.META_VOCAB_SIZE, keys.META_PAD_ID):
        raw = md.get(key.encode())
        try:
            out.append(None if raw is None else int(raw))
        except ValueError:
            raise BatchError(f"batch: schema metadata {key}={raw!r} is not an integer") from None
    return out[0], out[1]


def record_to_batch(rb: pa.RecordBatch, *, role: str = ROLE_FULL, pad_id: int = 0, pin: bool = False,
                    pack: bool | None = None, vocab_size: int | None = None) -> Batch:
    """Convert one micro-batch record for a rank of ``role`` (host tensors). ``pack``: when
    not None, the record's ``mmfeed.pack`` schema metadata (planned for packed micro-batches)
    must say the same, else BatchError. ``input_ids`` are padded with the record's
    ``mmfeed.pad_id`` (the tokenizer's) when present, else with ``pad_id``. ``vocab_size``: the
    model's vocabulary; a record whose ``mmfeed.vocab_size`` is larger is a BatchError."""
    if role not in (ROLE_FULL, ROLE_VISION, ROLE_TEXT):
        raise ValueError(f"batch: unknown role {role!r}")
    data_vocab, data_pad = tokenizer_meta(rb)
    if vocab_size is not None and data_vocab is not None and data_vocab > vocab_size:
        raise BatchError(f"batch: the model's vocabulary ({vocab_size} ids) is smaller than the data's tokenizer "
                         f"({data_vocab} ids, schema metadata {keys.META_VOCAB_SIZE}): choose a model "
                         f"(--model FILE.json) with vocab_size >= {data_vocab}")
    if data_pad is not None:
        pad_id = data_pad
    if pack is not None:
        planned = (rb.schema.metadata or {}).get(keys.META_PACK.encode(), b"false")
        if planned not in (b"true", b"false") or (planned == b"true") != pack:
            raise BatchError(f"batch: the plan says {keys.META_PACK}={planned.decode(errors='replace')}, "
                             f"this trainer runs {'packed' if pack else 'padded'} micro-batches (--pack)")
    if rb.num_rows == 0:
        raise BatchError("batch: empty micro-batch (ranks must get padding samples instead)")
    ids = [str(v) for v in _column(rb, keys.COL_ID).to_pylist()]
    weight_col = _column(rb, keys.COL_WEIGHT)
    weight = torch.from_numpy(weight_col.cast(pa.float32()).fill_null(0).to_numpy(zero_copy_only=False).copy())
    if not torch.isfinite(weight).all() or (weight < 0).any():
        raise BatchError("batch: weights must be finite and >= 0")
    fields: dict = {}
    if role in (ROLE_FULL, ROLE_TEXT):
        fields.update(_text(rb, pad_id))
    pin = pin and torch.cuda.is_available()
    if role in (ROLE_FULL, ROLE_VISION):
        fields.update(_vision(rb, ids, pin))
        fields["neg_text"], fields["neg_image"] = itm_negatives(weight)
    out = Batch(ids=ids, step=_int_scalar(rb, keys.COL_STEP), micro_batch=_int_scalar(rb, keys.COL_MICRO_BATCH),
                weight=weight, num_live=int((weight > 0).sum()), keep=_keep(rb), **fields)
    return out.pin_memory() if pin else out


def to_device(batch: Batch | dict, device: torch.device, *, non_blocking: bool = False) -> Batch | dict:
    """Move a host batch to ``device``; normalise the pixels there to float32. Takes a ``Batch``
    (``Batch.to``) or its dict form (``Batch.to_dict``, the stream's and ``data``'s items with
    ``pixel_mean``/``pixel_std``/``pixel_shape``/``pixel_dtype``) and returns the same kind."""
    if isinstance(batch, Batch):
        return batch.to(device, non_blocking=non_blocking)
    out = {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
           for k, v in batch.items()}
    if "pixel_values" in out:
        out["pixel_values"] = _normalise(out["pixel_values"], batch["pixel_dtype"], out["pixel_mean"],
                                         out["pixel_std"], out["pixel_shape"])
    return out


def _normalise(px: torch.Tensor, dtype: str | None, mean: torch.Tensor, std: torch.Tensor,
               shape: torch.Tensor) -> torch.Tensor:
    """Wire-dtype pixels (on the device) as normalised float32; uint8 padding stays 0."""
    if dtype == "uint8":
        px = (px.float() / 255.0 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
        px = px * _valid_pixels(shape, px.shape[2], px.shape[3])
    return px.float()


def _normalise_patches(patches: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Wire-dtype packed patches (N, C·p·p), channel-major within a patch, as normalised
    float32. Every packed pixel lies inside its image, so there is no padding to keep at 0."""
    if patches.dtype != torch.uint8:
        return patches.float()
    x = patches.view(patches.shape[0], mean.shape[0], -1).float() / 255.0
    return ((x - mean.view(1, -1, 1)) / std.view(1, -1, 1)).view(patches.shape[0], -1)


def _valid_pixels(shape: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, 1, H, W) float mask of each sample's own h x w region of the padded tensor."""
    rows = torch.arange(height, device=shape.device)[None, :, None] < shape[:, 1, None, None]
    cols = torch.arange(width, device=shape.device)[None, None, :] < shape[:, 2, None, None]
    return (rows & cols)[:, None].float()


def is_packed(batch: Batch) -> bool:
    return batch.packed


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(counts.to(torch.int64).cumsum(0), (1, 0))


def _runs(counts: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For the first counts[i] entries of every row i, row after row (``total`` = Σ counts, on
    the host): each one's row and its index in the row. The gather they give replaces boolean
    masking, whose output size only the device knows."""
    rows = torch.arange(counts.shape[0], device=counts.device)
    seg = torch.repeat_interleave(rows, counts, output_size=total)
    return seg, torch.arange(total, device=counts.device) - _offsets(counts)[seg]


def pack(batch: Batch, patch_size: int) -> Batch:
    """The packed form of a batch (module doc); a packed batch is returned as is. The output
    sizes come from the host ``layout`` (read from the tensors on the host, where that is
    free, else the one ``to`` recorded), so packing on the device reads nothing back."""
    if batch.packed:
        return batch
    on_host = batch.weight.device.type == "cpu"
    layout = batch.host_layout(patch_size) if on_host or batch.layout is None else \
        batch.layout._replace(patch_size=patch_size)
    out = batch.replace(attention_mask=None, pixel_values=None, layout=layout)
    if batch.input_ids is not None:
        ids, counts = batch.input_ids, batch.lengths.clamp(min=1)
        seg, local = _runs(counts, sum(layout.text_counts))
        out.input_ids = ids.reshape(-1)[seg * ids.shape[1] + local]
        out.cu_seqlens_text = _offsets(counts)
    if batch.pixel_values is not None:
        px, p = batch.pixel_values, patch_size
        b, c, hgt, wid = px.shape
        if hgt < p or wid < p:
            px = torch.nn.functional.pad(px, (0, max(p - wid, 0), 0, max(p - hgt, 0)))
        gh, gw = max(hgt // p, 1), max(wid // p, 1)
        patches = px[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(b * gh * gw, c * p * p)
        grid = batch.pixel_shape.to(px.device, torch.int64)[:, 1:] // p
        # packed patch t of sample i sits at (row, col) = divmod(t - cu[i], cols_i) of its grid
        seg, local = _runs(grid.prod(dim=1), sum(layout.image_counts))
        cols = grid[seg, 1]
        out.patches = patches[seg * (gh * gw) + (local // cols) * gw + local % cols]
        out.cu_seqlens_image = _offsets(grid.prod(dim=1))
        out.image_grid = grid
    return out


def concat_records(records: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record with the rows of ``records`` in order (the single-process view of a
    micro-batch spread over dp ranks); schemas must match."""
    table = pa.Table.from_batches([r.replace_schema_metadata(None) for r in records])
    return table.combine_chunks().to_batches()[0]
