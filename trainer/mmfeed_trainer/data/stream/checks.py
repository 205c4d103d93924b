"""What both data planes check of a received batch: its headers against what the rank accepts,
its decoded record against the chunk headers; and the error of a rank nobody sends to."""

from __future__ import annotations

import pyarrow as pa

from .. import accept, jpegwire
from ... import keys
from ..wire import Assembled, ChunkError, ChunkHeader, Reassembler, parse_header
from .errors import ServiceGone, StreamError

DECODE_ATTEMPTS = 3
"""Times one batch may fail to decode (after its checksum passed) before the client stops."""


class Checks:
    """``StreamSource``'s checks of received batches (a mixin over the source's state)."""

    def _decoded(self, res: Assembled, reasm: Reassembler, failures: dict) -> pa.RecordBatch | None:
        """``_decode``, or None after a decode failure (the caller asks for the batch again);
        StreamError once the same batch failed ``DECODE_ATTEMPTS`` times (a batch that passed its
        checksum and still cannot be read is not a transport fault)."""
        try:
            return self._decode(res)
        except (StreamError, pa.ArrowException, ValueError, IndexError, KeyError) as err:
            k = res.header.key
            failures[k] = failures.get(k, 0) + 1
            if failures[k] >= DECODE_ATTEMPTS:
                raise StreamError(f"stream: batch {k} failed to decode {failures[k]} times: {err}") from err
            res.error = f"decode: {err}"
            reasm.forget(k)
            return None

    def _decode(self, res: Assembled) -> pa.RecordBatch:
        k = res.header.key
        reader = pa.ipc.open_stream(pa.py_buffer(res.payload))  # zero-copy over the reassembled buffer
        rec = reader.read_next_batch()
        md = {key.decode(): v.decode() for key, v in (rec.schema.metadata or {}).items()}
        if md.get(keys.META_SCHEMA_VERSION) != keys.SCHEMA_VERSION:
            raise StreamError(f"stream: batch {k}: schema version {md.get(keys.META_SCHEMA_VERSION)!r}, "
                              f"want {keys.SCHEMA_VERSION}")
        meta = tuple(md.get(key) for key in (keys.META_JOB, keys.META_EPOCH, keys.META_DP_RANK, keys.META_MP_RANK))
        if meta != (k.job, str(k.epoch), str(k.dp_rank), str(k.mp_rank)):
            raise StreamError(f"stream: batch {k}: schema metadata {meta} differs from the chunk headers")
        if rec.num_rows:
            step, mb = rec.column(keys.COL_STEP)[0].as_py(), rec.column(keys.COL_MICRO_BATCH)[0].as_py()
            if (step, mb) != (k.step, k.micro_batch):
                raise StreamError(f"stream: batch {k}: columns say step {step} micro-batch {mb}")
        jpegwire.check_record(rec)  # JPEG rows within the wire's limits before anything decodes them
        return rec

    def _checked(self, m, requested) -> ChunkHeader | None:
        """The chunk's parsed header when the rank accepts it (``accept.BatchFilter``), else None
        (counted, warned). ``requested(header)``: the rank asked for this key."""
        try:
            h = parse_header(m.headers)
        except ChunkError as err:
            self._filter.drop(accept.MALFORMED, f"{err} on {m.subject}")
            return None
        why = self._filter.reason(h, requested=requested(h))
        if why is not None:
            self._filter.drop(why, f"{h.key} generation {h.gen} on {m.subject}")
            return None
        return h

    def _gone(self, where: str, waiting: str) -> ServiceGone:
        """The error of a rank that got no batch it asked for within ``idle_timeout_s``."""
        dropped = f"; dropped {self._filter.total()} chunks it did not ask for" if self._filter.total() else ""
        return ServiceGone(f"stream: {self._who()}: no batch on {where} for {self.idle_timeout_s:.0f} s (waiting for "
                           f"{waiting}{dropped}): the service is gone or NATS is unreachable (bound: idle_timeout_s, "
                           f"{accept.SERVICE_TIMEOUT_ENV})")
