"""The batch wire of docs/protocol.md, without NATS: CRC-32C, chunk headers, reassembly.

``Reassembler.add(headers, data, tag)`` takes one chunk message (its NATS headers as a dict,
its bytes, and an opaque ``tag`` -- the nats-py message -- to acknowledge or terminate later)
and returns an ``Assembled`` when something is decided: a verified payload with the tags of
all its chunks, a failure (terminate the tags, ask for a resend), or a late duplicate (ack).
Bad headers raise ``ChunkError`` for that message alone. Not thread-safe (one per rank).
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import keys

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


def _table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(_POLY), t >> 1).astype(np.uint32)
    return t


_T = _table()
_LANE = 1024
_SHIFT_CACHE: dict[int, np.ndarray] = {}


def _zero_shift_tables(nbytes: int) -> np.ndarray:
    """(4, 256) tables of the linear map 'feed nbytes zero bytes' on a CRC state, by state byte."""
    if nbytes not in _SHIFT_CACHE:
        basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)
        for _ in range(nbytes):
            basis = _T[basis & 0xFF] ^ (basis >> 8)
        tables = np.zeros((4, 256), dtype=np.uint32)
        values = np.arange(256, dtype=np.uint32)
        for k in range(4):
            acc = np.zeros(256, dtype=np.uint32)
            for bit in range(8):
                acc ^= np.where((values >> bit) & 1, basis[8 * k + bit], np.uint32(0)).astype(np.uint32)
            tables[k] = acc
        _SHIFT_CACHE[nbytes] = tables
    return _SHIFT_CACHE[nbytes]


def _crc32c_numpy(data: bytes, value: int = 0) -> int:
    """CRC-32C with numpy: lanes of 1 KiB computed side by side, then combined (CRC is linear).
    ``value`` is the CRC-32C of the bytes before ``data`` (to continue it)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    lanes = len(buf) // _LANE
    crc = value ^ 0xFFFFFFFF
    if lanes:
        block = buf[:lanes * _LANE].reshape(lanes, _LANE).astype(np.uint32)
        state = np.zeros(lanes, dtype=np.uint32)
        state[0] = crc
        for j in range(_LANE):
            state = _T[(state ^ block[:, j]) & 0xFF] ^ (state >> 8)
        shift = _zero_shift_tables(_LANE)
        crc = int(state[0])
        for value in state[1:].tolist():
            crc = int(shift[0][crc & 0xFF] ^ shift[1][(crc >> 8) & 0xFF]
                      ^ shift[2][(crc >> 16) & 0xFF] ^ shift[3][crc >> 24]) ^ value
    table = _T.tolist()
    for b in buf[lanes * _LANE:].tolist():
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data, value: int = 0) -> int:
    """CRC-32C of ``data`` (any bytes-like object; check value of b"123456789": 0xE3069283),
    continuing ``value``, the CRC-32C of the bytes before it: ``crc32c(b, crc32c(a)) ==
    crc32c(a + b)``.

    Uses the ``crc32c`` package (a dependency of mmfeed_trainer; hardware CRC, GB/s), else
    ``google_crc32c``'s C build; without either, a numpy table (~100 MB/s, a bottleneck for a
    GPU trainer), with a ``SlowPathWarning`` the first time it is chosen.
    """
    return _impl(data, value)


class SlowPathWarning(RuntimeWarning):
    """A slow fallback was taken (install the named package)."""


def _pick_impl():
    try:
        import crc32c as _c  # type: ignore
        return lambda d, v=0: _c.crc32c(d, v)
    except ImportError:
        pass
    try:
        import google_crc32c  # type: ignore
        if getattr(google_crc32c, "implementation", "c") == "c":
            return lambda d, v=0: google_crc32c.extend(v, bytes(d))
    except ImportError:
        pass
    warnings.warn("mmfeed_trainer.wire: the crc32c package is not installed; checksums use a numpy table "
                  "(~100 MB/s, slower than the stream): pip install crc32c", SlowPathWarning, stacklevel=2)
    return _crc32c_numpy


_impl = _pick_impl()


class ChunkError(ValueError):
    """A chunk whose headers break section 3 of the protocol (terminate it alone)."""


HEADERS = keys.REQUIRED_HEADERS
"""The headers every chunk carries (``schema_keys.json``, shared with the Go service)."""
_NUM = re.compile(r"0|[1-9][0-9]{0,9}")
_JOB = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CHECKSUM = re.compile(re.escape(keys.CHECKSUM_PREFIX) + r"([0-9a-f]{8})")


@dataclass(frozen=True, slots=True)
class BatchKey:
    job: str
    epoch: int
    step: int
    micro_batch: int
    dp_rank: int
    mp_rank: int

    def msg_id(self, index: int, gen: int) -> str:
        return keys.msg_id(job=self.job, epoch=self.epoch, step=self.step, micro_batch=self.micro_batch,
                           dp_rank=self.dp_rank, mp_rank=self.mp_rank, chunk=index, generation=gen)


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    key: BatchKey
    gen: int
    index: int
    count: int
    size: int
    checksum: int


def _num(headers: dict, name: str) -> int:
    value = headers.get(name)
    if value is None:
        raise ChunkError(f"wire: header {name} missing")
    if not isinstance(value, str) or not _NUM.fullmatch(value) or int(value) > 2**31 - 1:
        raise ChunkError(f"wire: header {name}={value!r} is not a canonical number")
    return int(value)


def parse_header(headers: dict | None) -> ChunkHeader:
    """Parse and check one chunk's headers (protocol section 3)."""
    headers = headers or {}
    for name in HEADERS:
        if name not in headers:
            raise ChunkError(f"wire: header {name} missing")
    job = headers[keys.HDR_JOB]
    if not _JOB.fullmatch(job):
        raise ChunkError(f"wire: header {keys.HDR_JOB}={job!r} is not a job name")
    if headers[keys.HDR_SCHEMA] != keys.SCHEMA_VERSION:
        raise ChunkError(f"wire: unknown schema version {headers[keys.HDR_SCHEMA]!r}")
    key = BatchKey(job, _num(headers, keys.HDR_EPOCH), _num(headers, keys.HDR_STEP),
                   _num(headers, keys.HDR_MICRO_BATCH), _num(headers, keys.HDR_DP_RANK),
                   _num(headers, keys.HDR_MP_RANK))
    parts = headers[keys.HDR_CHUNK].split("/")
    if len(parts) != 2 or not all(_NUM.fullmatch(p) for p in parts):
        raise ChunkError(f"wire: header {keys.HDR_CHUNK}={headers[keys.HDR_CHUNK]!r} is not i/n")
    index, count = int(parts[0]), int(parts[1])
    if not 0 <= index < count:
        raise ChunkError(f"wire: chunk {index}/{count} out of range")
    size = _num(headers, keys.HDR_SIZE)
    if size <= 0:
        raise ChunkError(f"wire: header {keys.HDR_SIZE}={headers[keys.HDR_SIZE]!r} must be > 0")
    m = _CHECKSUM.fullmatch(headers[keys.HDR_CHECKSUM])
    if not m:
        raise ChunkError(f"wire: header {keys.HDR_CHECKSUM}={headers[keys.HDR_CHECKSUM]!r} is not "
                         f"{keys.CHECKSUM_PREFIX}<8 hex>")
    gen = _num(headers, keys.HDR_GENERATION) if keys.HDR_GENERATION in headers else 0
    if keys.HDR_GENERATION in headers and gen == 0:
        raise ChunkError(f"wire: {keys.HDR_GENERATION} must be positive when present")
    msg_id = headers.get(keys.HDR_MSG_ID)
    if msg_id is not None and msg_id != key.msg_id(index, gen):
        raise ChunkError(f"wire: {keys.HDR_MSG_ID} {msg_id!r} differs from {key.msg_id(index, gen)!r}")
    return ChunkHeader(key, gen, index, count, size, int(m.group(1), 16))


def make_chunks(key: BatchKey, payload: bytes, chunk_size: int, gen: int = 0) -> list[tuple[dict, bytes]]:
    """(headers, data) of every chunk of ``payload`` (a publisher; used by tests and tools)."""
    n = -(-len(payload) // chunk_size)
    checksum = f"{keys.CHECKSUM_PREFIX}{crc32c(payload):08x}"
    out = []
    for i in range(n):
        h = {keys.HDR_JOB: key.job, keys.HDR_EPOCH: str(key.epoch), keys.HDR_STEP: str(key.step),
             keys.HDR_MICRO_BATCH: str(key.micro_batch), keys.HDR_DP_RANK: str(key.dp_rank),
             keys.HDR_MP_RANK: str(key.mp_rank), keys.HDR_CHUNK: f"{i}/{n}", keys.HDR_SIZE: str(len(payload)),
             keys.HDR_CHECKSUM: checksum, keys.HDR_SCHEMA: keys.SCHEMA_VERSION, keys.HDR_MSG_ID: key.msg_id(i, gen)}
        if gen:
            h[keys.HDR_GENERATION] = str(gen)
        out.append((h, payload[i * chunk_size:(i + 1) * chunk_size]))
    return out


@dataclass(slots=True)
class Assembled:
    header: ChunkHeader
    payload: bytes | None = None
    """The verified payload; None for a failure or a late duplicate. A single-chunk batch's is the
    chunk's bytes (no copy)."""
    tags: list = field(default_factory=list)
    error: str | None = None
    """Why the batch failed (terminate ``tags`` and ask for a resend)."""
    duplicate: bool = False
    """A chunk of a batch already delivered: acknowledge ``tags``."""


@dataclass(slots=True)
class _Pending:
    """An incomplete batch. Every chunk but the last has ``chunk`` bytes (section 4), so each
    chunk's length is checked as it arrives, and the CRC-32C runs over the chunks in index order
    as far as they are contiguous: with in-order arrival each chunk is checksummed when it lands
    and the batch is verified with its last chunk; the chunks are then joined with one copy."""
    header: ChunkHeader
    started: float
    chunk: int
    parts: dict = field(default_factory=dict)
    summed: int = 0
    crc: int = 0
    tags: list = field(default_factory=list)

    def span(self, index: int) -> tuple[int, int]:
        off = index * self.chunk
        return off, min(self.chunk, self.header.size - off)


def _chunk_size(h: ChunkHeader, n: int) -> int:
    """Data bytes of every chunk but the last, from one chunk of ``n`` bytes: a chunk before the
    last has exactly that many; the last has what remains. Raises ValueError when no chunk size
    cuts the payload into ``h.count`` chunks that way."""
    if h.count == 1:
        c = h.size
    elif h.index == h.count - 1:
        c = (h.size - n) // (h.count - 1)
    else:
        c = n
    if c <= 0 or (h.count - 1) * c >= h.size or h.count * c < h.size:
        raise ValueError(f"chunk {h.index}/{h.count}: {n} bytes do not cut a {h.size}-byte payload "
                         f"into {h.count} chunks")
    return c


class Reassembler:
    """Protocol section 4, receiver side. A chunk is kept as received (no copy), its length
    checked against the batch's chunk size at once and its CRC-32C folded in as soon as the
    chunks before it are there; a complete multi-chunk batch is joined with one copy
    (``b"".join``: measured faster in CPython than writing the chunks into a preallocated
    ``bytearray``, which CPython zero-fills first)."""

    def __init__(self, *, max_batch_bytes: int = 1 << 30, max_pending: int = 8, timeout_s: float = 120.0,
                 remember: int = 4096):
        self.max_batch_bytes = max_batch_bytes
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.remember = remember
        self._pending: dict[tuple[BatchKey, int], _Pending] = {}
        self._delivered: dict[BatchKey, None] = {}

    def add(self, headers: dict | None, data: bytes, tag=None, now: float | None = None) -> list[Assembled]:
        """Feed one chunk; returns the batches decided by it (usually zero or one)."""
        return self.add_parsed(parse_header(headers), data, tag, now)

    def add_parsed(self, h: ChunkHeader, data: bytes, tag=None,
                   now: float | None = None) -> list[Assembled]:
        """``add`` for a chunk whose headers the caller parsed (``parse_header``) and checked."""
        now = time.monotonic() if now is None else now
        if h.key in self._delivered:
            return [Assembled(h, tags=[tag], duplicate=True)]
        if h.size > self.max_batch_bytes:
            return [Assembled(h, tags=[tag], error=f"size {h.size} over the {self.max_batch_bytes} byte bound")]
        out = self.expire(now)
        slot = (h.key, h.gen)
        p = self._pending.get(slot)
        if p is None:
            if not data:
                return out + [Assembled(h, tags=[tag], error=f"chunk {h.index} is empty")]
            try:
                chunk = _chunk_size(h, len(data))
            except ValueError as err:
                return out + [Assembled(h, tags=[tag], error=str(err))]
            if len(self._pending) >= self.max_pending:
                oldest = min(self._pending, key=lambda s: self._pending[s].started)
                out.append(self._fail(oldest, "chunk missing (too many newer batches)"))
            p = self._pending[slot] = _Pending(h, now, chunk)
        p.tags.append(tag)
        if (h.count, h.size, h.checksum) != (p.header.count, p.header.size, p.header.checksum):
            return out + [self._fail(slot, "inconsistent chunks")]
        _, want = p.span(h.index)
        if len(data) != want:
            return out + [self._fail(slot, f"chunk {h.index}/{h.count}: {len(data)} bytes, want {want} (chunks of "
                                           f"{p.chunk} bytes, payload {h.size}; truncated or mis-sized)")]
        if h.index in p.parts:
            if p.parts[h.index] != data:
                return out + [self._fail(slot, f"duplicate chunk {h.index} with different bytes")]
            return out
        p.parts[h.index] = data if isinstance(data, bytes) else bytes(data)
        while p.summed in p.parts:
            p.crc = crc32c(p.parts[p.summed], p.crc)
            p.summed += 1
        if len(p.parts) == h.count:
            return out + [self._finish(slot)]
        return out

    def delivered(self, key: BatchKey) -> bool:
        """A batch under ``key`` was delivered (among the last ``remember``)."""
        return key in self._delivered

    def forget(self, key: BatchKey) -> None:
        """Accept ``key`` again: the batch delivered under it could not be used (it failed to
        decode), so its next generation is not a duplicate."""
        self._delivered.pop(key, None)

    def expire(self, now: float) -> list[Assembled]:
        """Fail batches incomplete for longer than the timeout."""
        late = [s for s, p in self._pending.items() if now - p.started > self.timeout_s]
        return [self._fail(s, f"chunk missing after {self.timeout_s:.0f} s") for s in late]

    def _fail(self, slot, reason: str) -> Assembled:
        p = self._pending.pop(slot)
        return Assembled(p.header, tags=p.tags, error=reason)

    def _finish(self, slot) -> Assembled:
        p = self._pending.pop(slot)
        parts = p.parts
        payload = parts[0] if p.header.count == 1 else b"".join([parts[i] for i in range(p.header.count)])
        if p.summed != p.header.count or len(payload) != p.header.size:
            return Assembled(p.header, tags=p.tags, error=f"payload {len(payload)} bytes, header says {p.header.size}")
        if p.crc != p.header.checksum:
            return Assembled(p.header, tags=p.tags, error=f"crc32c mismatch ({p.crc:08x} != {p.header.checksum:08x})")
        self._delivered[p.header.key] = None
        while len(self._delivered) > self.remember:
            self._delivered.pop(next(iter(self._delivered)))
        # Redeliveries of the same batch under another generation are now late duplicates.
        for other in [s for s in self._pending if s[0] == p.header.key]:
            dup = self._pending.pop(other)
            p.tags.extend(dup.tags)
        return Assembled(p.header, payload=payload, tags=p.tags)
