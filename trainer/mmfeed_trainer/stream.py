"""NATS stream client of a trainer rank (docs/protocol.md sections 6-9), with nats-py.

``StreamSource`` registers the rank with the service (``register``), pulls its chunks from
its durable JetStream consumer, reassembles and verifies them (``wire.Reassembler``),
decodes each payload to one Arrow record batch, checks it against the chunk headers, and
yields whole steps in (step, micro-batch) order. Chunks are acknowledged only after the step
that used them has been applied (``ack``); failed batches are terminated and re-requested
(``resend``); steps below the resume step are acknowledged and dropped. ``feedback`` is
published after every step, ``done`` after the last step of the epoch.

nats-py is asyncio: an event loop runs in a daemon thread and the synchronous methods
submit coroutines to it, so the prefetch thread (``steps``) and the training thread
(``ack``, ``feedback``) can both use the source.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from .parallel_dims import ParallelDims
from .sources import Source, StepData
from .wire import Assembled, BatchKey, ChunkError, Reassembler

log = logging.getLogger("mmfeed_trainer.stream")


class StreamError(RuntimeError):
    """The service refused the rank, or the stream broke the protocol."""


class StreamSource(Source):
    def __init__(self, *, url: str, job: str, dims: ParallelDims, fetch_batch: int = 64,
                 idle_timeout_s: float = 600.0, request_timeout_s: float = 30.0, max_reorder: int = 64,
                 ranks: tuple[int, int] | None = None):
        """``ranks``: this rank's (dp rank, mp rank); default from the process group."""
        self.url, self.job, self.dims = url, job, dims
        self.dp_rank, self.mp_rank = ranks if ranks is not None else dims.coords()
        self.fetch_batch = fetch_batch
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_reorder = max_reorder
        self.reply: dict = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mmfeed-nats", daemon=True)
        self._thread.start()
        self._nc = None
        self._sub = None
        self._acked_steps = 0

    # -- plumbing -------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _subject(self, kind: str) -> str:
        return f"mmfeed.{self.job}.ctl.{kind}"

    def _publish(self, kind: str, body: dict) -> None:
        self._call(self._nc.publish(self._subject(kind), json.dumps(body).encode()), timeout=self.request_timeout_s)

    # -- register ---------------------------------------------------------------------------
    def register(self, *, resume_step: int, epoch: int = 0) -> dict:
        """Connect, register this rank, bind its durable consumer; returns the reply."""
        return self._call(self._register(resume_step, epoch), timeout=self.request_timeout_s * 2)

    async def _register(self, resume_step: int, epoch: int) -> dict:
        import nats
        self._nc = await nats.connect(self.url, name=f"mmfeed-trainer-{self.dp_rank}-{self.mp_rank}",
                                      max_reconnect_attempts=-1)
        body = {"job": self.job, "dp_rank": self.dp_rank, "mp_rank": self.mp_rank,
                "dp": self.dims.dp, "mp": self.dims.mp,
                "placement": "modality" if self.dims.mp == 2 else "colocated",
                "epoch": epoch, "resume_step": resume_step}
        msg = await self._nc.request(self._subject("register"), json.dumps(body).encode(),
                                     timeout=self.request_timeout_s)
        reply = json.loads(msg.data)
        if not reply.get("ok"):
            raise StreamError(f"stream: the service refused rank ({self.dp_rank}, {self.mp_rank}): "
                              f"{reply.get('error')}")
        want = {"colocated": "all", "modality": "vision" if self.mp_rank == 0 else "text"}[body["placement"]]
        if reply.get("modality", want) != want:
            raise StreamError(f"stream: service sends modality {reply.get('modality')!r}, this rank needs {want!r}")
        js = self._nc.jetstream()
        self._sub = await js.pull_subscribe(reply["subject"], durable=reply["consumer"], stream=reply["stream"])
        self.reply = reply
        self.epoch = reply.get("epoch", epoch)
        log.info("registered: %d steps x %d micro-batches, consumer %s", reply["steps"], reply["micro_batches"],
                 reply["consumer"])
        return reply

    # -- batches ----------------------------------------------------------------------------
    async def _fetch(self):
        import nats.errors
        try:
            return await self._sub.fetch(self.fetch_batch, timeout=1.0)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            return []

    def _term(self, tags) -> None:
        for m in tags:
            self._call(m.term())

    def _resend(self, res: Assembled) -> None:
        k = res.header.key
        log.warning("batch %s failed (%s): requesting a resend", k, res.error)
        self._term(res.tags)
        self._publish("resend", {"job": self.job, "epoch": k.epoch, "step": k.step, "micro_batch": k.micro_batch,
                                 "dp_rank": k.dp_rank, "mp_rank": k.mp_rank, "reason": res.error})

    def _decode(self, res: Assembled) -> pa.RecordBatch:
        k = res.header.key
        reader = pa.ipc.open_stream(res.payload)
        rec = reader.read_next_batch()
        md = {key.decode(): v.decode() for key, v in (rec.schema.metadata or {}).items()}
        if md.get("mmfeed.schema_version") != "1":
            raise StreamError(f"stream: batch {k}: schema version {md.get('mmfeed.schema_version')!r}, want 1")
        meta = (md.get("mmfeed.job"), md.get("mmfeed.epoch"), md.get("mmfeed.dp_rank"), md.get("mmfeed.mp_rank"))
        if meta != (k.job, str(k.epoch), str(k.dp_rank), str(k.mp_rank)):
            raise StreamError(f"stream: batch {k}: schema metadata {meta} differs from the chunk headers")
        if rec.num_rows:
            step, mb = rec.column("step")[0].as_py(), rec.column("micro_batch")[0].as_py()
            if (step, mb) != (k.step, k.micro_batch):
                raise StreamError(f"stream: batch {k}: columns say step {step} micro-batch {mb}")
        return rec

    def _batches(self, start_step: int) -> Iterator[tuple[BatchKey, pa.RecordBatch, list]]:
        """Verified (key, record, tags) in arrival order; drops (acks) steps < start_step."""
        reasm = Reassembler()
        idle_since = time.monotonic()
        while True:
            msgs = self._call(self._fetch())
            if msgs:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > self.idle_timeout_s:
                raise StreamError(f"stream: no batch for {self.idle_timeout_s:.0f} s")
            decided = reasm.expire(time.monotonic())
            for m in msgs:
                try:
                    decided += reasm.add(m.headers, m.data, m)
                except ChunkError as err:
                    log.warning("terminating a bad chunk on %s: %s", m.subject, err)
                    self._term([m])
            for res in decided:
                if res.duplicate:
                    for m in res.tags:
                        self._call(m.ack())
                elif res.error:
                    self._resend(res)
                elif res.header.key.step < start_step:
                    for m in res.tags:
                        self._call(m.ack())
                else:
                    yield res.header.key, self._decode(res), res.tags

    def steps(self, start_step: int) -> Iterator[StepData]:
        """Whole steps in order, from ``start_step`` to the epoch's last step."""
        if not self.reply:
            raise StreamError("stream: register() first")
        total, per_step = self.reply["steps"], self.reply["micro_batches"]
        held: dict[tuple[int, int], tuple[pa.RecordBatch, list]] = {}
        step, mb = start_step, 0
        current = StepData(step, [])
        if step >= total:
            return
        for key, rec, tags in self._batches(start_step):
            if (key.step, key.micro_batch) < (step, mb):
                for m in tags:  # an old replay of something already used
                    self._call(m.ack())
                continue
            held[(key.step, key.micro_batch)] = (rec, tags)
            if len(held) > self.max_reorder:
                raise StreamError(f"stream: step {step} micro-batch {mb} missing while {len(held)} later "
                                  "batches arrived (gap in the plan order)")
            while (step, mb) in held:
                rec, tags = held.pop((step, mb))
                current.records.append(rec)
                current.handles.extend(tags)
                mb += 1
                if mb == per_step:
                    yield current
                    step, mb = step + 1, 0
                    if step >= total:
                        return
                    current = StepData(step, [])

    def ack(self, data: StepData) -> None:
        async def _ack_all():
            for m in data.handles:
                await m.ack()
        self._call(_ack_all(), timeout=self.request_timeout_s)
        self._acked_steps = data.step + 1

    def feedback(self, *, step: int, compute_seconds: float, data_wait_seconds: float, samples: int) -> None:
        self._publish("feedback", {"job": self.job, "epoch": self.epoch, "step": step,
                                   "dp_rank": self.dp_rank, "mp_rank": self.mp_rank,
                                   "compute_seconds": max(compute_seconds, 0.0),
                                   "data_wait_seconds": max(data_wait_seconds, 0.0), "samples": samples})

    def position(self, next_step: int) -> dict:
        return {"next_step": next_step, "epoch": getattr(self, "epoch", 0),
                "plan_hash": self.reply.get("plan_hash", "")}

    def close(self) -> None:
        if self._nc is not None:
            if self.reply and self._acked_steps >= self.reply["steps"]:
                self._publish("done", {"job": self.job, "epoch": self.epoch, "dp_rank": self.dp_rank,
                                       "mp_rank": self.mp_rank, "steps": self.reply["steps"]})
            self._call(self._nc.drain(), timeout=self.request_timeout_s)
            self._nc = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
