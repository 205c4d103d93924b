"""Batch schema metadata keys, read from ``schema_keys.json``: the one file that the Go service's
``proto`` package is checked against (proto/keys_test.go), so the two languages cannot drift."""

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
