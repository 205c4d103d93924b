"""The core data plane: the rank asks for its batches, a window ahead, and acknowledges them."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator

import pyarrow as pa

from ..wire import Assembled, BatchKey, ChunkHeader, Reassembler

log = logging.getLogger("mmfeed_trainer.stream")


class CorePlane:
    """``StreamSource``'s core data plane (a mixin over the source's state)."""

    def _in_plan(self, k: tuple[int, int, int]) -> bool:
        shape = self._epochs.get(k[0])
        return shape is not None and k[1] < shape["steps"] and k[2] < shape["micro_batches"]

    def _after(self, k: tuple[int, int, int]) -> tuple[int, int, int]:
        e, s, mb = k
        shape = self._epochs[e]
        if mb + 1 < shape["micro_batches"]:
            return e, s, mb + 1
        if s + 1 < shape["steps"]:
            return e, s + 1, 0
        return e + 1, 0, 0

    def _request(self, k: tuple[int, int, int]) -> dict:
        return {"job": self.job, "epoch": k[0], "step": k[1], "micro_batch": k[2],
                "dp_rank": self.dp_rank, "mp_rank": self.mp_rank}

    async def _ask(self, keys) -> None:
        for k in keys:
            await self._nc.publish(self.reply["fetch_subject"], json.dumps(self._request(k)).encode(),
                                   reply=self._inbox)

    async def _take(self, timeout: float) -> list:
        """The chunks on the inbox: waits up to ``timeout`` for the first."""
        try:
            msgs = [await asyncio.wait_for(self._inbox_q.get(), timeout)]
        except asyncio.TimeoutError:
            return []
        while not self._inbox_q.empty():
            msgs.append(self._inbox_q.get_nowait())
        return msgs

    def _receive(self, msgs: list, reasm: Reassembler, asked: dict) -> tuple[list[Assembled], bool]:
        """Feed the inbox's messages to ``reasm``: only chunks of keys in ``asked`` (or already
        delivered: late copies) pass ``accept.BatchFilter``; the rest are dropped before they can
        mark a key as received. Returns (decided batches, whether a chunk of a key still asked
        for arrived). A no-responders status (no service subscribed) is no chunk."""
        decided, progress = reasm.expire(time.monotonic()), False

        def requested(h: ChunkHeader) -> bool:
            return (h.key.epoch, h.key.step, h.key.micro_batch) in asked or reasm.delivered(h.key)
        for m in msgs:
            if not m.data and (m.headers or {}).get("Status") == "503":
                continue  # the fetch found no service (it is starting, or gone): asked again later
            h = self._checked(m, requested)
            if h is None:
                continue
            progress = progress or not reasm.delivered(h.key)
            for res in reasm.add_parsed(h, m.data):
                if res.payload is not None:  # verified: the rank's generation is at least its
                    self._filter.accepted(res.header)
                decided.append(res)
        return decided, progress

    def _core_batches(self, start: tuple[int, int, int]) -> Iterator[tuple[BatchKey, pa.RecordBatch, list]]:
        """Verified (key, record, [ack handle]) in plan order: asks for a window of batches ahead
        (the consumer's flow control), again for any not received within ``fetch_timeout_s`` or
        after a reconnect; the service regenerates a batch it no longer holds. Only batches it
        asked for are taken (``_receive``); ``ServiceGone`` when none of them arrives within
        ``idle_timeout_s``."""
        reasm = Reassembler(max_pending=2 * self.fetch_window + 2)
        failures: dict[BatchKey, int] = {}
        nxt, asked, last_size = start, {}, 0
        reconnects = self._reconnects
        idle_since = time.monotonic()
        while True:
            limit = self.fetch_window
            if last_size:
                limit = max(1, min(limit, self.fetch_bytes // last_size))
            now = time.monotonic()
            new = []
            while len(asked) + len(new) < limit and self._in_plan(nxt):
                new.append(nxt)
                nxt = self._after(nxt)
            again = [k for k, t in asked.items() if now - t > self.fetch_timeout_s or reconnects != self._reconnects]
            reconnects = self._reconnects
            if new or again:
                self._call(self._ask(new + again), timeout=self.request_timeout_s)
                asked.update((k, now) for k in new + again)
            decided, progress = self._receive(self._call(self._take(1.0), timeout=self.request_timeout_s + 5),
                                              reasm, asked)
            if progress:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > self.idle_timeout_s:
                raise self._gone(self.reply["fetch_subject"], ", ".join(map(str, sorted(asked)[:4])) or "nothing")
            for res in decided:
                key = res.header.key
                k = (key.epoch, key.step, key.micro_batch)
                if res.duplicate or k not in asked:
                    continue
                rec = None if res.error else self._decoded(res, reasm, failures)
                if rec is None:
                    log.warning("batch %s failed (%s): asking for it again", key, res.error)
                    asked[k] = 0.0
                    continue
                del asked[k]
                last_size = len(res.payload)
                yield key, rec, [_CoreAck(self, k)]
                idle_since = time.monotonic()  # the consumer's time is not the service's

    async def _send_ack(self, k: tuple[int, int, int]) -> None:
        await self._send(self.reply["ack_subject"], json.dumps(self._request(k)).encode(), True)


class _CoreAck:
    """The acknowledgement handle of one batch on the core data plane (what a JetStream message
    is on the other): ``ack`` tells the service every batch up to this one is applied."""

    __slots__ = ("source", "key")

    def __init__(self, source: CorePlane, key: tuple[int, int, int]):
        self.source, self.key = source, key

    async def ack(self) -> None:
        await self.source._send_ack(self.key)

    async def term(self) -> None:
        """Nothing to terminate: a failed batch is asked for again."""

    async def in_progress(self) -> None:
        """Nothing to extend: the service holds a batch until it is acknowledged."""
