"""NATS stream client of a trainer rank (docs/protocol.md sections 6-9), with nats-py.

``StreamSource`` registers the rank with the service (``register``), then reads its chunks
on the data plane the register reply names: on the core data plane (the default) it asks for
its next batches itself, a window of them ahead, on the rank's fetch subject and acknowledges
applied batches on its ack subject; on the JetStream data plane it pulls them from its durable
consumer. It reassembles and verifies them (``wire.Reassembler``),
decodes each payload to one Arrow record batch, checks it against the chunk headers, and
yields whole steps in (epoch, step, micro-batch) order, registering again for each next
epoch until the service has none. While the service is not up yet or still plans the epoch,
``register`` waits and asks again (up to ``wait_s``). The job's layout comes back in every
register reply: with ``placement=None`` the rank takes the service's placement, and with
``global_rank`` set it also takes (dp, mp) from the service and derives its (dp rank, mp
rank) from the global rank. Chunks are acknowledged only after the step that used them
has been applied (``ack``); failed batches are terminated and re-requested (``resend``);
batches before the resume position are acknowledged and dropped. ``feedback`` is published
after every step, ``done`` once the last step of an epoch is acknowledged.

Only chunks the rank asked for are taken (``accept.BatchFilter``: its job, its ranks, no
older generation and, on the core plane, a key it requested), checked before reassembly and
counted in ``dropped``. Every wait is bounded (``wait_s``, ``idle_timeout_s``, both
``MMFEED_SERVICE_TIMEOUT_S`` by default): a service that is gone is ``ServiceGone``.

nats-py is asyncio: an event loop runs in a daemon thread and the synchronous methods
submit coroutines to it, so the prefetch thread (``steps``) and the training thread
(``ack``, ``feedback``) can both use the source. After ``close`` a call raises StreamError,
and a call ``close`` cut short ends at once; no coroutine is left unawaited.

Logging: connection events are one line each and never a traceback (``_NatsEvents``): a
refused connect while waiting for the service, a disconnect and a reconnect at INFO once
(repeats at DEBUG, nothing while closing); any other NATS error (authorization, slow
consumer) one WARNING line. A service that never answers is one ``ServiceGone`` error.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from . import accept, jpegwire, keys
from .batches import Batch
from .natsauth import NatsAuth
from .parallel_dims import ROLE_FULL, ROLE_TEXT, ROLE_VISION, ParallelDims
from .position import Position
from .prefetch import Prefetcher
from .sources import Source, StepData
from .wire import Assembled, BatchKey, ChunkError, ChunkHeader, Reassembler, parse_header

log = logging.getLogger("mmfeed_trainer.stream")


ROLES = {"all": ROLE_FULL, "vision": ROLE_VISION, "text": ROLE_TEXT}
"""The role whose columns ``batches.record_to_batch`` keeps, by the modality a rank receives."""
RESEND_ATTEMPTS = 5
"""Resend requests before the client gives up (the service answers each; backoff 1, 2, 4, 8 s)."""
DECODE_ATTEMPTS = 3
"""Times one batch may fail to decode (after its checksum passed) before the client stops."""
ACK = b"+ACK"
CONNECT_WAIT_S = 0.5
"""Pause between connect attempts, while waiting for NATS and on a reconnect."""
REPLAY_S = 30.0
"""Acknowledgements and ``done`` reports sent within this long before a reconnect are sent
again after it. One sent as the server died is lost with the connection, and a server killed
before it flushed its state restarts with the consumer of a moment earlier: either way the
service would keep the rank at a step it trained, and wait for it forever at the job's end.
Both messages are idempotent (an ack of an acknowledged message does nothing)."""


class _NatsEvents:
    """nats-py's error and disconnect callbacks for one rank's connection: one log line per
    event, never a traceback (nats-py's default logs one for every refused connect, six in
    3 s while a rank waits for its service). A refused or dropped connection while waiting or
    reconnecting is expected: logged once at INFO, its repeats at DEBUG, and not at all after
    ``close`` began. Anything else (authorization, a slow consumer, a protocol error) is a real
    failure: one WARNING line each time its description changes."""

    def __init__(self, url: str):
        self.url = url
        self.closing = False
        self._last = ""

    @staticmethod
    def _expected(err: BaseException) -> bool:
        import nats.errors
        return isinstance(err, (OSError, asyncio.TimeoutError, nats.errors.StaleConnectionError,
                                nats.errors.ConnectionClosedError, nats.errors.NoServersError))

    @staticmethod
    def describe(err: BaseException) -> str:
        text = str(err).strip()
        return f"{type(err).__name__}: {text}" if text else type(err).__name__

    def _once(self, level: int, msg: str, *args) -> None:
        text = msg % args
        log.log(logging.DEBUG if text == self._last else level, "%s", text)
        self._last = text

    async def error(self, err: BaseException) -> None:
        if self.closing:
            log.debug("stream: NATS at %s while closing: %s", self.url, self.describe(err))
        elif self._expected(err):
            self._once(logging.INFO, "stream: NATS at %s unreachable (%s); trying again", self.url,
                       type(err).__name__)
        else:
            self._once(logging.WARNING, "stream: NATS at %s: %s", self.url, self.describe(err))

    async def disconnected(self) -> None:
        if self.closing:
            log.debug("stream: disconnected from NATS at %s (closing)", self.url)
        else:
            self._once(logging.INFO, "stream: disconnected from NATS at %s; reconnecting", self.url)

    def reconnected(self) -> None:
        self._last = ""
        log.info("stream: reconnected to NATS at %s", self.url)


class StreamError(RuntimeError):
    """The service refused the rank, or the stream broke the protocol."""


class ServiceGone(StreamError):
    """The service did not answer within the rank's bound (``wait_s`` for a register,
    ``idle_timeout_s`` for a batch asked for): it is gone, or NATS is unreachable."""


def fetch_size(batch: int, max_bytes: int, max_payload: int) -> int:
    """At most ``batch`` messages and, counting each at ``max_payload``, at most ``max_bytes``;
    at least one."""
    return max(1, min(batch, max_bytes // max(1, max_payload)))


class StreamSource(Source):
    def __init__(self, *, url: str, job: str, dims: ParallelDims, fetch_batch: int = 64,
                 idle_timeout_s: float | None = None, request_timeout_s: float = 30.0, max_reorder: int = 64,
                 ranks: tuple[int, int] | None = None, in_progress_after_s: float = 120.0,
                 fetch_bytes: int = 32 << 20, placement: str | None = None, global_rank: int | None = None,
                 wait_s: float | None = None, fetch_window: int = 4, fetch_timeout_s: float = 10.0,
                 auth: NatsAuth | None = None):
        """``ranks``: this rank's (dp rank, mp rank); default from the process group.
        ``in_progress_after_s``: held chunks get ``+WPI`` this often (well under the consumer's
        5-minute ack_wait), so a slow step or a long prefetch queue never triggers redelivery.
        ``fetch_bytes``: one fetch asks for at most this many bytes' worth of chunks (counted at
        the server's max_payload, at least one chunk). Keep it under the server's max_pending
        (64 MiB by default): a server that queues more for a connection drops it as a slow
        consumer, and the chunks it was sending come back only after ack_wait.
        ``placement``: "colocated" or "modality"; None takes the service's.
        ``global_rank``: this process's rank in a world of ``dims.world_size`` ranks; when set,
        (dp, mp) are taken from the service and ``ranks`` is derived (rank = dp_rank * mp + mp_rank).
        ``wait_s``: how long ``register`` waits for a service that is not up yet or still plans;
        ``idle_timeout_s``: how long the rank waits for a batch it asked for (no accepted chunk
        in that time: ``ServiceGone``). Both default to ``accept.service_timeout_s()``
        (``MMFEED_SERVICE_TIMEOUT_S``, else 600 s).
        ``fetch_window`` (core data plane): batches asked for ahead, fewer when that many of the
        last batch's size would exceed ``fetch_bytes``. ``fetch_timeout_s``: a batch asked for
        and not received within this is asked for again (and at once after a reconnect).
        ``auth``: credentials and TLS (``natsauth.NatsAuth``; paths and user may hold {dp}, {mp})."""
        super().__init__()
        self.url, self.job, self.dims = url, job, dims
        self.dp_rank, self.mp_rank = ranks if ranks is not None else dims.coords()
        self.fetch_batch = fetch_batch
        self.fetch_bytes = fetch_bytes
        self.fetch_window = fetch_window
        self.fetch_timeout_s = fetch_timeout_s
        self.auth = auth
        self._core = False
        self._inbox = None
        self._inbox_q: asyncio.Queue | None = None
        self._reconnects = 0
        self._sent: deque[tuple[float, str, bytes]] = deque()
        """(time, subject, payload) of the acknowledgements and reports of the last ``REPLAY_S``."""
        if idle_timeout_s is None or wait_s is None:
            bound = accept.service_timeout_s()
            idle_timeout_s = bound if idle_timeout_s is None else idle_timeout_s
            wait_s = bound if wait_s is None else wait_s
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_reorder = max_reorder
        self.placement, self.global_rank, self.wait_s = placement, global_rank, wait_s
        if placement not in (None, "colocated", "modality"):
            raise ValueError(f"stream: placement {placement!r}, want colocated or modality")
        self.reply: dict = {}
        self.modality: str | None = None
        """The columns this rank receives (all, vision or text), from the register reply."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mmfeed-nats", daemon=True)
        self._thread.start()
        self._nc = None
        self._events = _NatsEvents(url)
        self._sub = None
        self._epochs: dict[int, dict] = {}
        """Register reply per epoch (steps, micro_batches, plan_hash)."""
        self._held: dict[tuple[int, int], tuple[float, list]] = {}
        """Steps handed out but not acknowledged yet: (epoch, step) -> (since, messages)."""
        self.in_progress_after_s = in_progress_after_s
        self._filter = accept.BatchFilter(job, self.dp_rank, self.mp_rank)
        self._keeper = asyncio.run_coroutine_threadsafe(self._keep_alive(), self._loop)

    # -- plumbing -------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        """Run ``coro`` in the event loop; at most ``timeout`` (default: ``request_timeout_s`` + 5 s),
        then it is cancelled and TimeoutError raised: no call waits forever. After ``close``,
        StreamError; a call ``close`` cut short raises concurrent.futures.CancelledError. Either
        way the coroutine is awaited or closed, never left behind unawaited."""
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed: the coroutine never starts
            coro.close()
            raise StreamError(f"stream: {self._who()} is closed") from None
        try:
            return fut.result(self.request_timeout_s + 5 if timeout is None else timeout)
        except TimeoutError:
            fut.cancel()
            if not self._loop.is_running():
                coro.close()  # the loop stopped (close) before it ran: never started, never awaited
            raise

    def _who(self) -> str:
        """This rank and its service, for errors."""
        return f"rank ({self.dp_rank}, {self.mp_rank}) of job {self.job} (service at {self.url})"

    @property
    def dropped(self) -> dict[str, int]:
        """Chunks this rank refused, by reason (``accept``): another job or rank, an old
        generation, a key it did not ask for, malformed headers."""
        return dict(self._filter.dropped)

    def _subject(self, kind: str) -> str:
        """The rank's own control subject (docs/protocol.md section 2): credentials scoped to
        this rank may publish only there."""
        return keys.subject("rank_control", job=self.job, kind=keys.CONTROL_KINDS[kind], dp=self.dp_rank,
                            mp=self.mp_rank)

    def _publish(self, kind: str, body: dict, *, replay: bool = False) -> None:
        """Publish a control message; ``replay``: it is idempotent and sent again after a
        reconnect within ``REPLAY_S``."""
        self._call(self._send(self._subject(kind), json.dumps(body).encode(), replay), timeout=self.request_timeout_s)

    async def _send(self, subject: str, data: bytes, replay: bool) -> None:
        if replay:
            self._remember(subject, data)
        await self._nc.publish(subject, data)

    def _remember(self, subject: str, data: bytes) -> None:
        """Keep a sent message for ``_replay`` (in the event loop, as ``_replay``)."""
        now = time.monotonic()
        self._sent.append((now, subject, data))
        while self._sent[0][0] < now - REPLAY_S:
            self._sent.popleft()

    async def _replay(self) -> None:
        """Send the remembered acknowledgements and reports again (after a reconnect)."""
        since = time.monotonic() - REPLAY_S
        sent = [(subject, data) for t, subject, data in self._sent if t >= since]
        try:
            for subject, data in sent:
                await self._nc.publish(subject, data)
        except Exception as err:  # disconnected again: the next reconnect sends them
            log.warning("stream: sending recent acknowledgements again after a reconnect: %r", err)
            return
        if sent:
            log.info("stream: reconnected; sent %d recent acknowledgements and reports again", len(sent))

    # -- register ---------------------------------------------------------------------------
    def register(self, position: dict) -> dict:
        """Connect, register this rank at ``position`` ({"epoch", "next_step"}), bind its
        durable consumer; returns the service's reply. ValueError-like StreamError if refused."""
        return self._call(self._register(position.get("epoch", 0), position.get("next_step", 0)),
                          timeout=self._register_timeout())

    def _register_timeout(self) -> float:
        return self.wait_s + self.request_timeout_s * 2

    async def _register(self, epoch: int, resume_step: int) -> dict:
        import nats.errors
        deadline = time.monotonic() + self.wait_s
        adopted, pause = False, 0.2
        while True:
            try:
                body, reply = await self._register_once(epoch, resume_step, deadline)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError, asyncio.TimeoutError,
                    nats.errors.NoServersError) as err:
                reply = None
                why = (f"no service answers yet ({type(err).__name__})" if self._nc is not None else
                       "NATS does not accept connections there yet")
            else:
                why = "the epoch is still being planned" if reply.get("retry") else ""
            if reply is not None and reply.get("ok"):
                break
            if reply is not None and not why:
                ranks = (self.dp_rank, self.mp_rank)
                if not adopted and self._adopt_layout(reply):
                    adopted = True
                    if ranks != (self.dp_rank, self.mp_rank) and self._nc is not None:
                        self._events.closing = True
                        await self._nc.close()  # reconnect as the adopted rank (its credentials, its inbox)
                        self._nc = None
                    continue
                raise StreamError(f"stream: the service refused rank ({self.dp_rank}, {self.mp_rank}) for epoch "
                                  f"{epoch}: {reply.get('error')}")
            if time.monotonic() + pause > deadline:
                raise ServiceGone(f"stream: {self._who()} could not register for epoch {epoch}: no answer on "
                                  f"{self._subject('register')} within {self.wait_s:.0f} s ({why}); is mmfeed serve "
                                  f"running for this job? (bound: wait_s, {accept.SERVICE_TIMEOUT_ENV})")
            # NATS not up yet: _NatsEvents said so once already
            log.log(logging.DEBUG if self._nc is None else logging.INFO, "register: %s; asking again in %.1f s",
                    why, pause)
            await asyncio.sleep(pause)
            pause = min(2 * pause, 5.0)
        want = {"colocated": "all", "modality": "vision" if self.mp_rank == 0 else "text"}[body["placement"]]
        if reply.get("modality", want) != want:
            raise StreamError(f"stream: service sends modality {reply.get('modality')!r}, this rank needs {want!r}")
        self.modality = want
        self._core = reply.get("data_plane") == "core"
        if self._core and self._inbox is None:
            self._inbox_q = asyncio.Queue()
            self._inbox = self._nc.new_inbox()
            await self._nc.subscribe(self._inbox, cb=self._inbox_q.put, pending_msgs_limit=-1, pending_bytes_limit=-1)
        elif not self._core and self._sub is None:
            js = self._nc.jetstream()
            self._sub = await js.pull_subscribe(reply["subject"], durable=reply["consumer"], stream=reply["stream"])
        self.reply = reply
        self._epochs[reply.get("epoch", epoch)] = reply
        self._filter.dp_rank, self._filter.mp_rank = self.dp_rank, self.mp_rank
        gen = reply.get("generation")
        if isinstance(gen, int) and gen > 0:  # a service that names the rank's generation
            self._filter.floor = max(self._filter.floor, gen)
        log.info("registered for epoch %d: %d steps x %d micro-batches, %s", reply.get("epoch", epoch),
                 reply["steps"], reply["micro_batches"],
                 reply.get("fetch_subject") if self._core else f"consumer {reply['consumer']}")
        return reply

    def _placement(self) -> str:
        return self.placement or ("modality" if self.dims.mp == 2 else "colocated")

    async def _register_once(self, epoch: int, resume_step: int, deadline: float) -> tuple[dict, dict]:
        """One register request (connecting first, bounded by ``deadline``): (body, reply)."""
        import nats
        if self._nc is None:
            left = max(deadline - time.monotonic(), 0.1)
            self._events.closing = False  # a new connection (after an adopted layout's close)

            async def reconnected():
                self._reconnects += 1
                self._events.reconnected()
                await self._replay()
            opts = self.auth.options(self.dp_rank, self.mp_rank) if self.auth else {}
            # The first connect tries every 0.5 s until the deadline, then gives up by itself
            # (NoServersError): cancelling nats-py's connect loop is not reliable, it can swallow
            # the cancellation and retry forever. Once connected, it reconnects without limit.
            nc = await asyncio.wait_for(nats.connect(
                self.url, name=f"mmfeed-trainer-{self.dp_rank}-{self.mp_rank}",
                max_reconnect_attempts=max(1, int(left / CONNECT_WAIT_S)), reconnect_time_wait=CONNECT_WAIT_S,
                reconnected_cb=reconnected, error_cb=self._events.error, disconnected_cb=self._events.disconnected,
                inbox_prefix=keys.subject("inbox_prefix", job=self.job, dp=self.dp_rank, mp=self.mp_rank),
                **opts), timeout=left + 2)
            nc.options["max_reconnect_attempts"] = -1  # read at each reconnect
            self._nc = nc
        body = {"job": self.job, "dp_rank": self.dp_rank, "mp_rank": self.mp_rank,
                "dp": self.dims.dp, "mp": self.dims.mp, "placement": self._placement(),
                "epoch": epoch, "resume_step": resume_step}
        if self.dims.pp > 1:  # a pipelined trainer registers from stage 0 only (``pipeline``)
            body["pp"] = self.dims.pp
        msg = await self._nc.request(self._subject("register"), json.dumps(body).encode(),
                                     timeout=self.request_timeout_s)
        return body, json.loads(msg.data)

    def _adopt_layout(self, reply: dict) -> bool:
        """Take the job's layout from a refusal where this rank may (placement None, or
        ``global_rank`` set); True when something changed and registering again may succeed."""
        dp, mp, placement = reply.get("dp"), reply.get("mp"), reply.get("placement")
        if not dp or not mp or not placement:
            return False  # an older service: no layout in its replies
        changed = False
        if self.global_rank is not None and (dp, mp) != (self.dims.dp, self.dims.mp):
            if dp * mp != self.dims.world_size:
                raise StreamError(f"stream: the service runs dp={dp} x mp={mp} = {dp * mp} ranks, this world has "
                                  f"{self.dims.world_size} (WORLD_SIZE)")
            self.dims = ParallelDims(dp=dp, mp=mp, world_size=dp * mp)
            self.dp_rank, self.mp_rank = divmod(self.global_rank, mp)
            changed = True
        if self.placement is None and placement != self._placement() and (dp, mp) == (self.dims.dp, self.dims.mp):
            self.placement = placement
            changed = True
        if changed:
            log.info("taking the service's layout dp=%d mp=%d %s: this is rank (%d, %d)", dp, mp, placement,
                     self.dp_rank, self.mp_rank)
        return changed

    def epoch_info(self, epoch: int) -> dict:
        """The register reply for ``epoch`` (``steps``, ``micro_batches``, ``plan_hash``); {} before."""
        return dict(self._epochs.get(epoch, {}))

    def _next_epoch(self, epoch: int) -> bool:
        """Register for ``epoch`` (the previous one is fully read); False when the job has no
        such epoch (the service refuses it): the end of the data."""
        try:
            self._call(self._register(epoch, 0), timeout=self._register_timeout())
        except ServiceGone:
            raise  # no answer is not the end of the data: the service is gone
        except StreamError as err:
            log.info("no epoch %d to read (%s): end of the stream", epoch, err)
            return False
        return True

    # -- batches ----------------------------------------------------------------------------
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

    # -- core data plane --------------------------------------------------------------------
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

    def steps(self, position: dict) -> Iterator[StepData]:
        """Whole steps in (epoch, step) order from ``position`` to the job's last epoch.

        Batches before the position (already trained) are acknowledged and dropped; at the end
        of an epoch the rank registers for the next one."""
        if not self.reply:
            raise StreamError("stream: register() first")
        epoch, step, mb = position.get("epoch", 0), position.get("next_step", 0), 0
        while step >= self._epochs[epoch]["steps"]:
            if not self._next_epoch(epoch + 1):
                return
            epoch, step = epoch + 1, 0
        held: dict[tuple[int, int, int], tuple[pa.RecordBatch, list]] = {}
        current = StepData(step, [], epoch=epoch)
        batches = self._core_batches((epoch, step, 0)) if self._core else self._batches()
        for key, rec, tags in batches:
            k = (key.epoch, key.step, key.micro_batch)
            if k < (epoch, step, mb):
                self._ack_tags(tags)  # already trained (a checkpoint or an old replay)
                continue
            held[k] = (rec, tags)
            if len(held) > self.max_reorder:
                raise StreamError(f"stream: epoch {epoch} step {step} micro-batch {mb} missing while "
                                  f"{len(held)} later batches arrived (gap in the plan order)")
            while (epoch, step, mb) in held:
                rec, tags = held.pop((epoch, step, mb))
                current.records.append(rec)
                current.handles.extend(tags)
                mb += 1
                if mb < self._epochs[epoch]["micro_batches"]:
                    continue
                self._held[(current.epoch, current.step)] = (time.monotonic(), current.handles)
                yield current
                step, mb = step + 1, 0
                if step >= self._epochs[epoch]["steps"]:
                    if not self._next_epoch(epoch + 1):
                        return
                    epoch, step = epoch + 1, 0
                current = StepData(step, [], epoch=epoch)

    def _ack_tags(self, tags) -> None:
        """Acknowledge JetStream chunks one by one; on the core plane send one ack, of the last
        batch: it means "every batch up to this one is applied" (protocol section 11), so a step
        costs one ack message, not one per micro-batch."""
        core = [m for m in tags if isinstance(m, _CoreAck)]

        async def _ack_all():
            for m in tags:
                if isinstance(m, _CoreAck):
                    continue
                await m.ack()
                if getattr(m, "reply", None):  # a JetStream message (_CoreAck remembers in _send_ack)
                    self._remember(m.reply, ACK)
            if core:
                await max(core, key=lambda m: m.key).ack()
        self._call(_ack_all(), timeout=self.request_timeout_s)

    async def _keep_alive(self) -> None:
        """Send +WPI for chunks held longer than ``in_progress_after_s`` (protocol section 8)."""
        while True:
            await asyncio.sleep(min(self.in_progress_after_s, 30.0))
            now = time.monotonic()
            for key, (since, msgs) in list(self._held.items()):
                if now - since >= self.in_progress_after_s:
                    for m in msgs:
                        await m.in_progress()
                    self._held[key] = (now, msgs)

    def ack(self, data: StepData) -> None:
        """Acknowledge the step's chunks; after an epoch's last step, publish ``done``."""
        self._held.pop((data.epoch, data.step), None)
        self._ack_tags(data.handles)
        super().ack(data)
        steps = self._epochs.get(data.epoch, {}).get("steps")
        if steps is not None and data.step == steps - 1:
            self._publish("done", {"job": self.job, "epoch": data.epoch, "dp_rank": self.dp_rank,
                                   "mp_rank": self.mp_rank, "steps": steps}, replay=True)

    def feedback(self, data: StepData, *, compute_seconds: float, data_wait_seconds: float, samples: int) -> None:
        self._publish("feedback", {"job": self.job, "epoch": data.epoch, "step": data.step,
                                   "dp_rank": self.dp_rank, "mp_rank": self.mp_rank,
                                   "compute_seconds": max(compute_seconds, 0.0),
                                   "data_wait_seconds": max(data_wait_seconds, 0.0), "samples": samples})

    def wait_bound_s(self) -> float:
        """A backstop for the prefetcher (``Source.wait_bound_s``): a register for the next epoch
        (``wait_s``), then the wait for its first batch (``idle_timeout_s``), a resend's
        attempts and a minute's slack. Each of those waits raises its own error first."""
        return self.wait_s + self.idle_timeout_s + RESEND_ATTEMPTS * (self.request_timeout_s + 15) + 60

    def data_vocab(self) -> int | None:
        """The tokenizer's vocabulary size from the register reply (None before ``register`` or
        from a service that does not say)."""
        return self.reply.get("vocab_size") or None

    def position(self) -> Position:
        pos = super().position()
        pos.plan_hash = self._epochs.get(pos.epoch, {}).get("plan_hash", "")
        return pos

    def close(self) -> None:
        """Flush acknowledgements and disconnect. A drain that cannot finish (a pull request
        still parked on the server when training stops early) falls back to a plain close:
        whatever was not acknowledged is redelivered to the next incarnation, nothing is lost."""
        if self._loop.is_closed():
            return
        self._events.closing = True
        self._keeper.cancel()
        if self._nc is not None:
            try:
                self._call(self._nc.drain(), timeout=min(self.request_timeout_s, 5.0))
            except Exception as err:  # concurrent.futures.TimeoutError, nats errors
                log.warning("stream: drain did not finish (%r); closing the connection", err)
                try:
                    self._call(self._nc.close(), timeout=5.0)
                except Exception:
                    pass
            self._nc = None
        try:  # a drain cut short leaves nats-py tasks parked in the loop
            if self._loop.is_running():
                self._call(_cancel_pending(), timeout=5.0)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            # Calls submitted as the loop stopped (the prefetch thread's) are queued or started
            # as tasks that never ran: run them here, cancelled, so that their callers return
            # now and no coroutine is destroyed unawaited.
            for _ in range(3):  # again if a second stop request was queued
                try:
                    self._loop.run_until_complete(_cancel_pending())
                    break
                except RuntimeError:
                    continue
            # Closed here, not left to the garbage collector: destroying a loop with pending
            # tasks logs from whatever code the collector interrupts (once inside ast.parse,
            # which CPython 3.11 then failed with "AST constructor recursion depth mismatch").
            self._loop.close()


async def _cancel_pending() -> None:
    """Cancel every task of the running loop but the caller's, and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _CoreAck:
    """The acknowledgement handle of one batch on the core data plane (what a JetStream message
    is on the other): ``ack`` tells the service every batch up to this one is applied."""

    __slots__ = ("source", "key")

    def __init__(self, source: StreamSource, key: tuple[int, int, int]):
        self.source, self.key = source, key

    async def ack(self) -> None:
        await self.source._send_ack(self.key)

    async def term(self) -> None:
        """Nothing to terminate: a failed batch is asked for again."""

    async def in_progress(self) -> None:
        """Nothing to extend: the service holds a batch until it is acknowledged."""


class Stream:
    """A rank's micro-batches from ``mmfeed serve``, in plan order: the client trainers use.

        with Stream("nats://127.0.0.1:4222", "demo", dp_rank=0, mp_rank=0, dp=2) as stream:
            for mb in stream:
                mb["step"], mb["micro_batch"], mb["id"], mb["weight"], mb["input_ids"], ...

    Each item is the dict form of a ``batches.Batch`` (``Batch.to_dict``; ``batches()`` yields
    the typed ones): ``epoch``, ``step``,
    ``micro_batch`` (ints), ``id`` (list of str), ``weight`` (float tensor), and the tensors
    this rank receives -- ``input_ids`` and ``attention_mask`` padded to the micro-batch's
    longest, and/or ``pixel_values`` in the wire's dtype (uint8 raw pixels, float16,
    bfloat16 or float32 normalized), with ``pixel_mean``/``pixel_std``:
    ``batches.to_device`` makes it normalized float32 on the device. What a rank receives
    follows the service's answer to ``register``: under modality placement mp rank 0 gets
    the vision columns and mp rank 1 the text; colocated ranks (any mp) get all columns.
    ``placement`` (default: the service's) and the other ``options`` go to ``StreamSource``.
    ``mmfeed_trainer.data.StreamDataset`` wraps this class as a torch ``IterableDataset``.

    A background thread (``prefetch.Prefetcher``, host tensors) prefetches ``prefetch`` steps
    ahead. A step's chunks are acknowledged when the iterator moves past its last micro-batch
    (the caller has taken them all), so a crash re-delivers only what was not handed out.
    Iteration ends after ``epochs`` epochs (default: every epoch the service plans). ``position`` resumes at
    {"epoch": e, "next_step": s}; ``feedback(...)`` reports the measured times of the step
    last handed out, for the service's cost-model calibration.
    """

    def __init__(self, url: str, job: str, dp_rank: int, mp_rank: int, *, dp: int, mp: int = 1,
                 epochs: int | None = None, position: dict | None = None, prefetch: int = 2,
                 pad_id: int = 0, **options):
        if not 0 <= dp_rank < dp or not 0 <= mp_rank < mp:
            raise ValueError(f"stream: rank ({dp_rank}, {mp_rank}) outside the layout dp={dp} mp={mp}")
        self.source = StreamSource(url=url, job=job, dims=ParallelDims(dp=dp, mp=mp, world_size=dp * mp),
                                   ranks=(dp_rank, mp_rank), **options)
        self.role = ROLE_FULL  # set from the service's reply by __enter__
        self.position = dict(position or {"epoch": 0, "next_step": 0})
        self.epochs, self.pad_id = epochs, pad_id
        self._depth = max(1, prefetch)
        self._prefetcher: Prefetcher | None = None
        self._last: StepData | None = None
        self._last_complete = False
        """Every micro-batch of ``_last`` was handed out (only then is it acknowledged)."""

    def __enter__(self) -> "Stream":
        """Register the rank and start prefetching (once; a second call does nothing)."""
        if self._prefetcher is not None:
            return self
        self.source.register(self.position)
        self.role = ROLES[self.source.modality]
        self._prefetcher = Prefetcher(self.source, position=self.position, role=self.role, pad_id=self.pad_id,
                                      device=None, depth=self._depth, check_pack=False, epochs=self.epochs,
                                      name="mmfeed-stream-prefetch")
        _open_streams.add(self)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def dims(self) -> ParallelDims:
        """The (dp, mp) layout: as given, or the service's once registered with ``global_rank``."""
        return self.source.dims

    @property
    def ranks(self) -> tuple[int, int]:
        """This rank's (dp rank, mp rank)."""
        return self.source.dp_rank, self.source.mp_rank

    @property
    def dropped(self) -> dict[str, int]:
        """Chunks the rank refused, by reason (``StreamSource.dropped``)."""
        return self.source.dropped

    def __iter__(self) -> Iterator[dict]:
        """The micro-batches as dicts (``Batch.to_dict``: the class doc's keys)."""
        for b in self.batches():
            yield b.to_dict()

    def batches(self) -> Iterator[Batch]:
        """The micro-batches as typed ``batches.Batch`` (``epoch`` set), acknowledged as ``__iter__``."""
        if self._prefetcher is None:
            raise StreamError("stream: iterate inside `with Stream(...)` (it registers the rank)")
        while True:
            try:
                host, _ = self._prefetcher.next()
            except StopIteration:
                self._ack_last()
                return
            except Exception as err:  # raised in the prefetch thread
                self._ack_last()
                raise StreamError(f"stream: {err}") from err
            self._ack_last()
            data = host.data
            self._last, self._last_complete = data, False
            yield from host.micro_batches
            self._last_complete = True

    def _ack_last(self) -> None:
        if self._last is not None and self._last_complete:
            self.source.ack(self._last)
            self._last = None

    def feedback(self, *, compute_seconds: float, data_wait_seconds: float = 0.0, samples: int = 0) -> None:
        """Report the measured times of the step last handed out."""
        if self._last is not None:
            self.source.feedback(self._last, compute_seconds=compute_seconds,
                                 data_wait_seconds=data_wait_seconds, samples=samples)

    def close(self) -> None:
        """Acknowledge the last step if it was handed out whole, stop prefetching, disconnect,
        and wait (5 s at most) for the prefetch thread: a daemon thread still converting a step
        (torch, pyarrow) when the interpreter exits aborts the process with "terminate called
        without an active exception", after training finished."""
        _open_streams.discard(self)
        if self._prefetcher is not None:
            self._prefetcher.stop()
        try:
            self._ack_last()
            self.source.close()
        finally:
            if self._prefetcher is not None:
                self._prefetcher.close()


_open_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()
"""Streams entered and not closed yet; closed at interpreter exit (``_close_open_streams``)."""


@atexit.register
def _close_open_streams() -> None:
    """Close every stream still open when the interpreter exits (a loop that stopped early, as
    Lightning does at ``max_steps``). Otherwise the daemon prefetch thread may still be converting
    a step (torch, pyarrow) when finalization ends it, which aborts the process with "terminate
    called without an active exception" although training finished."""
    for st in list(_open_streams):
        try:
            st.close()
        except Exception as err:  # exiting anyway: say why the acknowledgement may be missing
            log.warning("stream: closing at exit: %r", err)
