"""The JetStream data plane: chunks pulled from the rank's durable consumer."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator

import pyarrow as pa

from ..wire import BatchKey, Reassembler
from .errors import StreamError

log = logging.getLogger("mmfeed_trainer.stream")

RESEND_ATTEMPTS = 5
"""Resend requests before the client gives up (the service answers each; backoff 1, 2, 4, 8 s)."""


def fetch_size(batch: int, max_bytes: int, max_payload: int) -> int:
    """At most ``batch`` messages and, counting each at ``max_payload``, at most ``max_bytes``;
    at least one."""
    return max(1, min(batch, max_bytes // max(1, max_payload)))


class JetStreamPlane:
    """``StreamSource``'s JetStream data plane (a mixin over the source's state)."""

    def _fetch_size(self) -> int:
        """Messages per fetch: ``fetch_batch``, fewer when that many chunks of the server's
        max_payload would exceed ``fetch_bytes``."""
        return fetch_size(self.fetch_batch, self.fetch_bytes, self._nc.max_payload)

    async def _fetch(self):
        import nats.errors
        try:
            return await self._sub.fetch(self._fetch_size(), timeout=1.0)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            return []

    def _term(self, tags) -> None:
        for m in tags:
            self._call(m.term())

    def _resend(self, key: BatchKey, tags: list, reason: str) -> None:
        """Terminate a failed batch's chunks and ask the service to send it again, as a request
        it answers, retried: a lost resend would leave the rank waiting for a batch nobody sends.
        StreamError when the service never answers or refuses."""
        log.warning("batch %s failed (%s): requesting a resend", key, reason)
        self._term(tags)
        body = json.dumps({"job": self.job, "epoch": key.epoch, "step": key.step, "micro_batch": key.micro_batch,
                           "dp_rank": key.dp_rank, "mp_rank": key.mp_rank, "reason": reason}).encode()
        for attempt in range(RESEND_ATTEMPTS):
            try:
                msg = self._call(self._nc.request(self._subject("resend"), body, timeout=self.request_timeout_s),
                                 timeout=self.request_timeout_s + 5)
            except Exception as err:  # nats timeout or no responders: the service may be restarting
                log.warning("resend of %s unanswered (attempt %d of %d): %s", key, attempt + 1, RESEND_ATTEMPTS, err)
                time.sleep(min(2.0 ** attempt, 10.0))
                continue
            reply = json.loads(msg.data)
            if not reply.get("ok"):
                raise StreamError(f"stream: resend of batch {key} refused: {reply.get('error', '')}")
            return
        raise StreamError(f"stream: resend of batch {key} unanswered after {RESEND_ATTEMPTS} attempts")

    def _batches(self) -> Iterator[tuple[BatchKey, pa.RecordBatch, list]]:
        """Verified (key, record, tags) in arrival order. A chunk of another job or rank, or with
        malformed headers, is terminated and counted (``dropped``)."""
        reasm = Reassembler()
        failures: dict[BatchKey, int] = {}
        idle_since = time.monotonic()
        while True:
            msgs = self._call(self._fetch())
            now = time.monotonic()
            decided = reasm.expire(now)
            for m in msgs:
                h = self._checked(m, lambda h: True)
                if h is None:
                    self._term([m])
                    continue
                idle_since = now
                decided += reasm.add_parsed(h, m.data, m)
            if now - idle_since > self.idle_timeout_s:
                raise self._gone(f"consumer {self.reply.get('consumer')}", "the next batch")
            for res in decided:
                if res.duplicate:
                    self._ack_tags(res.tags)
                elif res.error:
                    self._resend(res.header.key, res.tags, res.error)
                elif (rec := self._decoded(res, reasm, failures)) is None:
                    self._resend(res.header.key, res.tags, res.error)
                else:
                    yield res.header.key, rec, res.tags
                    idle_since = time.monotonic()  # the consumer's time is not the service's
