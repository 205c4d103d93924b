"""``StreamSource``: one rank's state, the plan-order ``steps`` over either data plane, and
``close`` (package doc)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from .. import accept
from ..natsauth import NatsAuth
from ...parallel.parallel_dims import ROLE_FULL, ROLE_TEXT, ROLE_VISION, ParallelDims
from ..position import Position
from ..sources import Source, StepData
from .acks import Acks
from .checks import Checks
from .core import CorePlane
from .errors import StreamError
from .events import _NatsEvents
from .jetstream import RESEND_ATTEMPTS, JetStreamPlane
from .loop import LoopThread, run_in
from .register import Registration
from .replay import Replay

log = logging.getLogger("mmfeed_trainer.stream")


ROLES = {"all": ROLE_FULL, "vision": ROLE_VISION, "text": ROLE_TEXT}
"""The role whose columns ``batches.record_to_batch`` keeps, by the modality a rank receives."""


class StreamSource(Registration, Replay, JetStreamPlane, CorePlane, Checks, Acks, Source):
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
        self._io = LoopThread("mmfeed-nats")
        self._loop, self._thread = self._io.loop, self._io.thread
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

    def _call(self, coro, timeout: float | None = None):
        """Run ``coro`` in the event loop (``loop.run_in``); at most ``timeout`` (default:
        ``request_timeout_s`` + 5 s). After ``close``, StreamError."""
        return run_in(self._loop, coro, self.request_timeout_s + 5 if timeout is None else timeout, self._who())

    def _who(self) -> str:
        """This rank and its service, for errors."""
        return f"rank ({self.dp_rank}, {self.mp_rank}) of job {self.job} (service at {self.url})"

    @property
    def dropped(self) -> dict[str, int]:
        """Chunks this rank refused, by reason (``accept``): another job or rank, an old
        generation, a key it did not ask for, malformed headers."""
        return dict(self._filter.dropped)

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
        self._io.stop()
