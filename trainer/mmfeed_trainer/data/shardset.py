"""Reading a shard set written by ``mmfeed shard`` (docs/shard.md): manifest, epoch indexes,
data files on a local disk or object storage, JPEG pixels.

``ShardSet(location)`` opens ``shard.json`` under a folder or URL (``s3://bucket/prefix``,
``gs://``, ``file:///path``: pyarrow's filesystems, credentials from the environment; any
other scheme through fsspec when it is installed). ``rank_steps(epoch, dp_rank, start)``
yields ``(step, [record per micro-batch])`` of one rank in one epoch, following that epoch's
index: the rows are gathered from the data files (written once, for every epoch) and the
``step``, ``micro_batch``, ``weight`` and ``cost`` columns are the epoch's.

JPEG sets (``store == "jpeg"``) are decoded here to uint8 CHW pixels (``decode=True``, the
default), so every record has the uint8 wire schema; with ``decode=False`` (what ``ShardSource``
and so the trainer use) the records keep their JPEG ``pixel_values``, the layout of the ``jpeg``
wire dtype, and the prefetcher decodes each micro-batch on the trainer's device (``jpegwire``).
``decode_jpeg_column(col, device)`` decodes a column on a given device.
A malformed set (missing file, index out of range, bad JPEG) raises ``ShardError``, which
names the file. Every path ``shard.json`` lists must stay inside the set's root (relative, no
``..``; for a local set also after resolving links), and each data file is checked against the
SHA-256 and size the manifest lists the first time it is opened (``verify=False``: only when
``verify()`` is called), so a tampered or corrupt set is refused instead of read
(docs/security.md, "Shard sets").
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

MANIFEST = "shard.json"
FORMAT, VERSION = "mmfeed-shard", 2
_HASH_BLOCK = 4 << 20


class ShardError(ValueError):
    """A shard set that cannot be read as its manifest says."""


def open_filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, base path) of a folder or URL."""
    scheme = urlparse(location).scheme
    if scheme in ("", "file", "s3", "gs", "gcs", "hdfs") or len(scheme) == 1:  # 1: a Windows drive
        try:
            return pafs.FileSystem.from_uri(location if scheme else _abs(location))
        except (pa.ArrowInvalid, OSError) as err:
            raise ShardError(f"shards: cannot open {location}: {err}") from err
    try:
        import fsspec  # noqa: PLC0415 - optional, only for schemes pyarrow lacks
    except ImportError as err:
        raise ShardError(f"shards: {scheme}:// needs fsspec and its {scheme} driver") from err
    fs, path = fsspec.core.url_to_fs(location)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _abs(path: str) -> str:
    return os.path.abspath(path)


def check_name(name) -> str:
    """``name`` when it is a path inside the set's root: relative, '/'-separated, no empty,
    ``.`` or ``..`` part, no backslash, NUL or drive; ShardError otherwise."""
    if not isinstance(name, str) or not name:
        raise ShardError(f"shards: {MANIFEST} lists the path {name!r}, want a file name inside the set")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name or "\x00" in name \
            or ":" in parts[0]:
        raise ShardError(f"shards: {MANIFEST} lists the path {name!r}, which leaves the set's root")
    return name


class ShardSet:
    """A shard set's manifest and its open files. Not safe for concurrent use."""

    def __init__(self, location: str, *, cache_records: int = 64, verify: bool = True, decode: bool = True):
        """``verify``: check each data file's SHA-256 the first time it is opened (one extra
        read of the file); False leaves it to ``verify()``. ``decode``: JPEG sets' records
        come decoded to uint8 (False: as stored, for a decode on the trainer's device)."""
        self.location, self._verify, self._decode = location, verify, decode
        self.fs, self.base = open_filesystem(location)
        try:
            with self.fs.open_input_stream(self._path(MANIFEST)) as f:
                self.manifest = json.loads(f.read())
        except FileNotFoundError as err:
            raise ShardError(f"shards: {location} has no {MANIFEST}") from err
        except (OSError, ValueError) as err:
            raise ShardError(f"shards: {location}/{MANIFEST}: {err}") from err
        m = self.manifest
        if m.get("format") != FORMAT or m.get("version") != VERSION:
            raise ShardError(f"shards: {MANIFEST} format {m.get('format')!r} version {m.get('version')!r}, "
                             f"want {FORMAT!r} {VERSION}")
        self.files = m["files"]
        self.epochs = {e["epoch"]: e for e in m["epochs"]}
        for entry in [*self.files, *self.epochs.values()]:
            check_name(entry.get("path"))
        self._verified: set[int] = set()
        self.store = m["store"]
        self._readers: dict[int, ipc.RecordBatchFileReader] = {}
        self._records: OrderedDict[tuple[int, int], pa.RecordBatch] = OrderedDict()
        self._cache = cache_records

    def _path(self, name: str) -> str:
        """The full path of a file the manifest lists, inside the set's root (``check_name``; a
        local set's resolved links too)."""
        path = f"{self.base.rstrip('/')}/{check_name(name)}" if self.base else check_name(name)
        if isinstance(self.fs, pafs.LocalFileSystem) and name != MANIFEST:
            root = os.path.realpath(self.base or ".")
            if os.path.commonpath([root, os.path.realpath(path)]) != root:
                raise ShardError(f"shards: {self.location}: {name} resolves outside the set's root")
        return path

    def verify(self, file: int | None = None) -> None:
        """Check a data file (every one: None) against the SHA-256 and size in the manifest;
        ShardError naming the file on a mismatch."""
        for i in range(len(self.files)) if file is None else [file]:
            if i in self._verified:
                continue
            entry = self.files[i]
            want = entry.get("sha256")
            if not isinstance(want, str) or len(want) != 64:
                raise ShardError(f"shards: {self.location}: {MANIFEST} lists no SHA-256 for {entry['path']}")
            digest, size = hashlib.sha256(), 0
            try:
                with self.fs.open_input_stream(self._path(entry["path"])) as f:
                    while block := f.read(_HASH_BLOCK):
                        digest.update(block)
                        size += len(block)
            except (OSError, pa.ArrowInvalid) as err:
                raise ShardError(f"shards: {self.location}: {entry['path']}: {err}") from err
            if digest.hexdigest() != want.lower() or size != entry.get("bytes", size):
                raise ShardError(f"shards: {self.location}: {entry['path']} fails its SHA-256 check ({size} bytes, "
                                 f"sha256 {digest.hexdigest()}; {MANIFEST} lists {entry.get('bytes')} bytes, "
                                 f"sha256 {want}): tampered or corrupt")
            self._verified.add(i)

    def _reader(self, file: int) -> ipc.RecordBatchFileReader:
        """The open reader of a data file, verified first when ``verify`` is on."""
        r = self._readers.get(file)
        if r is None:
            if self._verify:
                self.verify(file)
            r = self._readers[file] = self._open(self.files[file]["path"])
        return r

    def _batch(self, r: ipc.RecordBatchFileReader, i: int, name: str) -> pa.RecordBatch:
        """Record ``i`` of an open file; a record that does not read or decompress is a
        ShardError naming the file."""
        try:
            return r.get_batch(i)
        except (OSError, pa.ArrowException, ValueError) as err:
            raise ShardError(f"shards: {self.location}: {name}: record {i}: {err}") from err

    def _open(self, name: str) -> ipc.RecordBatchFileReader:
        path = self._path(name)
        try:
            # Decompression on the calling thread: the pool costs more CPU than it saves here.
            opts = ipc.IpcReadOptions(use_threads=False)
            if isinstance(self.fs, pafs.LocalFileSystem):
                return ipc.open_file(pa.memory_map(path), options=opts)
            return ipc.open_file(self.fs.open_input_file(path), options=opts)
        except (OSError, pa.ArrowInvalid) as err:
            raise ShardError(f"shards: {self.location}: {name}: {err}") from err

    def schema(self, file: int) -> pa.Schema:
        """The schema (with its metadata) of a data file."""
        return self._reader(file).schema

    def record(self, file: int, record: int) -> pa.RecordBatch:
        """One record batch of a data file (kept in a small LRU cache)."""
        key = (file, record)
        rb = self._records.get(key)
        if rb is not None:
            self._records.move_to_end(key)
            return rb
        if not 0 <= file < len(self.files):
            raise ShardError(f"shards: index names data file {file}, the manifest lists {len(self.files)}")
        r = self._reader(file)
        name = self.files[file]["path"]
        if not 0 <= record < r.num_record_batches:
            raise ShardError(f"shards: {name} has {r.num_record_batches} records, index wants {record}")
        rb = self._batch(r, record, name)
        self._records[key] = rb
        if len(self._records) > self._cache:
            self._records.popitem(last=False)
        return rb

    def index(self, epoch: int, dp_rank: int) -> dict[str, np.ndarray]:
        """The index rows of one rank in one epoch, as numpy columns."""
        if epoch not in self.epochs:
            raise ShardError(f"shards: {self.location} holds epochs {sorted(self.epochs)}, not {epoch}")
        if not 0 <= dp_rank < self.manifest["dp"]:
            raise ShardError(f"shards: dp rank {dp_rank} out of range [0,{self.manifest['dp']})")
        name = self.epochs[epoch]["path"]
        rb = self._batch(self._open(name), dp_rank, name)
        return {name: rb.column(name).to_numpy(zero_copy_only=False) for name in rb.schema.names}

    def rank_steps(self, epoch: int, dp_rank: int, start: int = 0) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
        """(step, records in micro-batch order) of one rank and epoch, from step ``start`` on."""
        ix = self.index(epoch, dp_rank)
        step, mb = ix["step"], ix["micro_batch"]
        if len(step) == 0:
            return
        bounds = np.flatnonzero(np.diff(step.astype(np.int64) * (1 << 32) + mb)) + 1
        groups = np.split(np.arange(len(step)), bounds)
        records: list[pa.RecordBatch] = []
        for k, g in enumerate(groups):
            s = int(step[g[0]])
            if s >= start:
                records.append(self._micro_batch(ix, g))
            last = k + 1 == len(groups) or int(step[groups[k + 1][0]]) != s
            if last and records:
                yield s, records
                records = []

    def _gather(self, files: list[int], recs: list[int], rows: list[int]) -> pa.RecordBatch:
        """The rows at (file, record, row) positions, in order, as one record batch. Sets
        written with one row per record (the default) decompress only the rows read."""
        parts = [_row(self.record(f, r), i) for f, r, i in zip(files, recs, rows, strict=True)]
        return pa.concat_batches(parts)

    def _micro_batch(self, ix: dict[str, np.ndarray], g: np.ndarray) -> pa.RecordBatch:
        files, recs, rows = ix["file"][g], ix["record"][g], ix["row"][g]
        first = self.record(int(files[0]), int(recs[0]))
        if (files == files[0]).all() and (recs == recs[0]).all() and len(g) == first.num_rows \
                and (rows == np.arange(len(g))).all():
            rb = first  # the record as written (the first epoch)
        else:
            rb = self._gather(files.tolist(), recs.tolist(), rows.tolist())
        rb = _set(rb, "step", pa.array(ix["step"][g], pa.int32()))
        rb = _set(rb, "micro_batch", pa.array(ix["micro_batch"][g], pa.int32()))
        rb = _set(rb, "weight", pa.array(ix["weight"][g], pa.float32()))
        rb = _set(rb, "cost", pa.array(ix["cost"][g], pa.float64()))
        if self.store == "jpeg" and self._decode:
            rb = decode_jpeg_record(rb)
        return rb


def _row(rec: pa.RecordBatch, i: int) -> pa.RecordBatch:
    if not 0 <= i < rec.num_rows:
        raise ShardError(f"shards: index row position {i} past the end of its record ({rec.num_rows} rows)")
    return rec if rec.num_rows == 1 else rec.slice(i, 1)


def _set(rb: pa.RecordBatch, name: str, arr: pa.Array) -> pa.RecordBatch:
    i = rb.schema.get_field_index(name)
    return rb.set_column(i, rb.schema.field(i), arr)


def _jpeg_tensors(col: pa.Array) -> list:
    import torch  # noqa: PLC0415
    offsets = col.offsets.to_numpy(zero_copy_only=False)
    values = col.values.to_numpy(zero_copy_only=False)
    return [torch.from_numpy(values[offsets[i]:offsets[i + 1]].copy()) for i in range(len(col))]


def decode_jpeg_column(col: pa.Array, device: str = "cpu") -> list:
    """Decode a JPEG ``pixel_values`` column to uint8 CHW tensors on ``device``."""
    data = _jpeg_tensors(col)
    with warnings.catch_warnings():  # torchvision 0.29 points to torchcodec; decode_jpeg still works
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_jpeg  # noqa: PLC0415
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as err:
            raise ShardError(f"shards: JPEG pixels do not decode: {err}") from err


def decode_jpeg_record(rb: pa.RecordBatch) -> pa.RecordBatch:
    """The record with its JPEG ``pixel_values`` decoded to uint8 CHW (dtype metadata uint8)."""
    i = rb.schema.get_field_index("pixel_values")
    field = rb.schema.field(i)
    md = dict(field.metadata or {})
    if md.get(b"dtype") != b"jpeg":
        return rb
    imgs = decode_jpeg_column(rb.column(i))
    shapes = rb.column("pixel_shape").flatten().to_numpy(zero_copy_only=False).reshape(-1, 3)
    for k, (img, shape) in enumerate(zip(imgs, shapes, strict=True)):
        if tuple(img.shape) != tuple(int(d) for d in shape):
            raise ShardError(f"shards: row {k} decodes to {tuple(img.shape)}, pixel_shape says {tuple(shape)}")
    flat = np.concatenate([img.numpy().reshape(-1) for img in imgs]) if imgs else np.zeros(0, np.uint8)
    offsets = np.zeros(len(imgs) + 1, np.int32)
    np.cumsum([img.numel() for img in imgs], out=offsets[1:])
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.uint8()))
    md[b"dtype"] = b"uint8"
    return rb.set_column(i, pa.field("pixel_values", pa.list_(pa.uint8()), metadata=md), arr)
