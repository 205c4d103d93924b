"""What the trainer shares with the Go service on the wire, read from ``schema_keys.json``: the
batch schema metadata keys, column names and pixel field metadata, the chunk header layout, and
the subject and inbox names. It is the one file that the Go service's ``proto`` package is
checked against (proto/keys_test.go, shared_test.go), so the two languages cannot drift."""

from __future__ import annotations

import json
import os

_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema_keys.json")
with open(_FILE, encoding="utf-8") as _f:
    _DOC = json.load(_f)
_META = _DOC["schema_metadata"]

SCHEMA_VERSION: str = _DOC["schema_version"]
"""Value of ``META_SCHEMA_VERSION`` this trainer reads."""
KEEP_COLUMN_PREFIX: str = _DOC["keep_column_prefix"]
"""Prefix of the kept columns (``mmfeed --keep``): ``keep.url`` carries the source's ``url``."""
META_SCHEMA_VERSION: str = _META["schema_version"]
META_JOB: str = _META["job"]
META_EPOCH: str = _META["epoch"]
META_DP_RANK: str = _META["dp_rank"]
META_MP_RANK: str = _META["mp_rank"]
META_MODALITY: str = _META["modality"]
META_PACK: str = _META["pack"]
"""``"true"`` on records of a job planned for packed micro-batches; absent otherwise."""
META_VOCAB_SIZE: str = _META["vocab_size"]
"""The tokenizer's vocabulary size (decimal); absent when unknown."""
META_PAD_ID: str = _META["pad_id"]
"""The tokenizer's pad id (decimal); absent when unknown or the tokenizer has none."""

_JPEG_SOURCE = _DOC["jpeg_source"]
DTYPE_JPEG_SOURCE: str = _JPEG_SOURCE["dtype"]
"""The wire dtype whose rows are source JPEGs the trainer resizes (``jpegwire``)."""
FIELD_RESIZE: str = _JPEG_SOURCE["resize_key"]
"""``pixel_values`` field metadata key of ``jpeg-source`` batches: ``"<policy>/<filter>"``."""
MAX_SOURCE_JPEG_BYTES: int = _JPEG_SOURCE["max_bytes"]
MAX_SOURCE_JPEG_PIXELS: int = _JPEG_SOURCE["max_pixels"]
"""The most bytes of a ``jpeg-source`` row, and pixels its JPEG header may declare."""

COLUMNS: dict[str, str] = dict(_DOC["columns"])
"""Arrow column names by field (``proto`` Col* constants)."""
COL_ID: str = COLUMNS["id"]
COL_STEP: str = COLUMNS["step"]
COL_MICRO_BATCH: str = COLUMNS["micro_batch"]
COL_INPUT_IDS: str = COLUMNS["input_ids"]
COL_PIXEL_VALUES: str = COLUMNS["pixel_values"]
COL_PIXEL_SHAPE: str = COLUMNS["pixel_shape"]
COL_TEXT_TOKENS: str = COLUMNS["text_tokens"]
COL_IMAGE_TOKENS: str = COLUMNS["image_tokens"]
COL_COST: str = COLUMNS["cost"]
COL_WEIGHT: str = COLUMNS["weight"]
MODALITY_COLUMNS: dict[str, tuple[str, ...]] = {m: tuple(c) for m, c in _DOC["modality_columns"].items()}
"""The columns a record of each modality (all, vision, text) carries, in schema order."""

_PIXEL = _DOC["pixel_field"]
FIELD_DTYPE: str = _PIXEL["dtype"]
FIELD_LAYOUT: str = _PIXEL["layout"]
FIELD_SHAPE: str = _PIXEL["shape"]
FIELD_MEAN: str = _PIXEL["mean"]
FIELD_STD: str = _PIXEL["std"]
"""``pixel_values`` field metadata keys."""
LAYOUT_CHW: str = _PIXEL["layout_chw"]
"""The one pixel layout: channel-major, row-major inside a plane."""
PIXEL_DTYPES: tuple[str, ...] = tuple(_PIXEL["dtypes"])
"""The pixel element types (``dtype`` field metadata values) the service writes."""

_CHUNK = _DOC["chunk"]
HEADERS: dict[str, str] = dict(_CHUNK["headers"])
"""Chunk message header names by field (docs/protocol.md section 3)."""
REQUIRED_HEADERS: tuple[str, ...] = tuple(HEADERS[k] for k in _CHUNK["required"])
"""The headers every chunk carries; ``Mmfeed-Generation`` only when > 0, ``Nats-Msg-Id`` optional."""
HDR_JOB, HDR_EPOCH, HDR_STEP = HEADERS["job"], HEADERS["epoch"], HEADERS["step"]
HDR_MICRO_BATCH, HDR_DP_RANK, HDR_MP_RANK = HEADERS["micro_batch"], HEADERS["dp_rank"], HEADERS["mp_rank"]
HDR_CHUNK, HDR_SIZE, HDR_CHECKSUM = HEADERS["chunk"], HEADERS["size"], HEADERS["checksum"]
HDR_SCHEMA, HDR_GENERATION, HDR_MSG_ID = HEADERS["schema"], HEADERS["generation"], HEADERS["msg_id"]
CHECKSUM_PREFIX: str = _CHUNK["checksum_prefix"]
"""Prefix of the ``Mmfeed-Checksum`` value (then 8 lowercase hex digits)."""
_MSG_ID, _MSG_ID_GEN = _CHUNK["msg_id"], _CHUNK["msg_id_generation"]


def msg_id(*, job: str, epoch: int, step: int, micro_batch: int, dp_rank: int, mp_rank: int, chunk: int,
           generation: int = 0) -> str:
    """The JetStream dedupe id (``Nats-Msg-Id``) of one chunk; generation > 0 appends its suffix."""
    base = _MSG_ID.format(job=job, epoch=epoch, step=step, micro_batch=micro_batch, dp_rank=dp_rank,
                          mp_rank=mp_rank, chunk=chunk)
    return base + (_MSG_ID_GEN.format(generation=generation) if generation > 0 else "")


_SUBJECTS = {k: v for k, v in _DOC["subjects"].items() if not k.startswith("_") and k != "control_kinds"}
CONTROL_KINDS: dict[str, str] = dict(_DOC["subjects"]["control_kinds"])
"""The kinds of control subject a rank publishes on (register, feedback, done, resend)."""


def subject(name: str, *, job: str, dp: int | None = None, mp: int | None = None, kind: str | None = None) -> str:
    """The NATS name ``name`` (batch, control, rank_control, fetch, ack, view, inbox_prefix,
    stream, consumer, bucket) of a job, filled from the shared pattern."""
    return _SUBJECTS[name].format(job=job, dp=dp, mp=mp, kind=kind)
