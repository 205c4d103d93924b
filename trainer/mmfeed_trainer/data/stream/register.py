"""Registering a rank with the service, and taking the job's layout from its replies."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from .. import accept
from ... import keys
from ...parallel.parallel_dims import ParallelDims
from .errors import ServiceGone, StreamError

log = logging.getLogger("mmfeed_trainer.stream")

CONNECT_WAIT_S = 0.5
"""Pause between connect attempts, while waiting for NATS and on a reconnect."""


class Registration:
    """``StreamSource``'s register side (a mixin over the source's state)."""

    def _subject(self, kind: str) -> str:
        """The rank's own control subject (docs/protocol.md section 2): credentials scoped to
        this rank may publish only there."""
        return keys.subject("rank_control", job=self.job, kind=keys.CONTROL_KINDS[kind], dp=self.dp_rank,
                            mp=self.mp_rank)

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
        if self.dims.pp > 1:  # a pipelined trainer registers from stage 0 only (``parallel.pp``)
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
