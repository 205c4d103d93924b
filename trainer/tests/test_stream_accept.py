"""The core-plane client takes only the batches it asked for, and a rank whose service is gone
fails within its bound (docs/security.md "The trainer accepts only what it asked for",
docs/reliability.md "Service gone"). A real nats-server; this test plays a hostile service.
"""

import asyncio
import concurrent.futures
import json
import threading
import time
from collections import defaultdict

import pyarrow as pa
import pytest

from mmfeed_trainer.data import accept, synthetic, wire
from mmfeed_trainer import keys
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.data.stream import ServiceGone, StreamSource
from test_stream import start_nats

JOB = "acc"
STEPS, MICRO, EPOCHS = 3, 2, 2
RUN_S = 60.0
"""A run that takes longer hangs (the old client never returned)."""


@pytest.fixture
def nats_url(tmp_path):
    yield from start_nats(tmp_path)


def body(epoch, step, mb, *, job=JOB, dp=0, mp=0, seed=4):
    """An Arrow IPC payload whose metadata agrees with the key it is sent under (a well-formed
    batch, just not this rank's); ``seed`` other than 4 gives other rows under the same key."""
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=seed + epoch), step, dp, mb)
    md = {**rec.schema.metadata, keys.META_JOB.encode(): job.encode(), keys.META_EPOCH.encode(): str(epoch).encode(),
          keys.META_DP_RANK.encode(): str(dp).encode(), keys.META_MP_RANK.encode(): str(mp).encode()}
    rec = rec.replace_schema_metadata(md)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rec.schema) as w:
        w.write_batch(rec)
    return sink.getvalue().to_pybytes()


class HostileCoreService:
    """A core-data-plane service for rank (0, 0) that sends, to the inbox of a fetch, the forged
    batches ``forge(key)`` returns -- (BatchKey, generation, payload) -- before the batch asked
    for (sent at generation ``gen``). ``stop_after``: answer that many fetches, then vanish
    (unsubscribe everything: a service that is gone)."""

    def __init__(self, url, *, forge=lambda k: [], gen=0, stop_after=None, reply_extra=None):
        self.url, self.forge, self.gen, self.stop_after = url, forge, gen, stop_after
        self.reply_extra = reply_extra or {}
        self.fetches, self.subs = defaultdict(int), []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _send(self, inbox, key, gen, payload):
        for h, d in wire.make_chunks(key, payload, 4096, gen):
            await self.nc.publish(inbox, d, headers=h)

    async def _start(self):
        import nats
        self.nc = await nats.connect(self.url)

        async def on_register(msg):
            req = json.loads(msg.data)
            ok = req["epoch"] < EPOCHS
            await msg.respond(json.dumps({
                "ok": ok, "error": "" if ok else "epoch outside the job's epochs", "code": "" if ok else "end",
                "plan_hash": f"plan{req['epoch']}", "steps": STEPS if ok else 0, "micro_batches": MICRO if ok else 0,
                "epoch": req["epoch"], "modality": "all", "data_plane": "core",
                "fetch_subject": f"mmfeed.{JOB}.fetch.0.0", "ack_subject": f"mmfeed.{JOB}.ack.0.0",
                **self.reply_extra}).encode())

        async def on_fetch(msg):
            req = json.loads(msg.data)
            k = (req["epoch"], req["step"], req["micro_batch"])
            self.fetches[k] += 1
            if self.fetches[k] == 1:
                for key, gen, payload in self.forge(k):
                    await self._send(msg.reply, key, gen, payload)
            await self._send(msg.reply, wire.BatchKey(JOB, *k, 0, 0), self.gen, body(*k))
            if self.stop_after is not None and sum(self.fetches.values()) >= self.stop_after:
                await self.vanish()

        async def on_ack(msg):
            pass

        self.subs = [await self.nc.subscribe(f"mmfeed.{JOB}.ctl.register.*.*", cb=on_register),
                     await self.nc.subscribe(f"mmfeed.{JOB}.fetch.0.0", cb=on_fetch),
                     await self.nc.subscribe(f"mmfeed.{JOB}.ack.0.0", cb=on_ack)]

    async def vanish(self):
        for sub in self.subs:
            await sub.unsubscribe()
        self.subs = []
        await self.nc.flush()

    def close(self):
        self.call(self.nc.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)


def consume(src, deadline_s=RUN_S):
    """[(epoch, step, [record])] of every step the source yields, acknowledged as trained; in a
    thread, so a client that hangs fails the test instead of blocking it."""
    def run():
        src.register({"epoch": 0, "next_step": 0})
        got = []
        for step in src.steps({"epoch": 0, "next_step": 0}):
            got.append((step.epoch, step.step, step.records))
            src.ack(step)
        return got
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        fut = pool.submit(run)
        if not concurrent.futures.wait([fut], timeout=deadline_s).done:
            pytest.fail(f"the client did not finish within {deadline_s:.0f} s (it hangs)")
        return fut.result()
    finally:
        pool.shutdown(wait=False)


def other_rank(k):
    return [(wire.BatchKey(JOB, *k, 1, 0), 0, body(*k, dp=1, seed=99)),
            (wire.BatchKey(JOB, *k, 0, 1), 0, body(*k, mp=1, seed=99))]


def other_job(k):
    return [(wire.BatchKey("other", *k, 0, 0), 0, body(*k, job="other", seed=99))]


def old_generation(k):
    """From the second batch on (the rank has accepted generation 2 by then), a copy of the key
    asked for at generation 1 with other rows (a batch of an older plan)."""
    return [] if k == (0, 0, 0) else [(wire.BatchKey(JOB, *k, 0, 0), 1, body(*k, seed=99))]


def unrequested(k):
    """At the first fetch, 50 well-formed batches of this rank it did not ask for: later keys of
    both epochs (asked for later), and keys outside the plan."""
    if k != (0, 0, 0):
        return []
    later = [(e, s, mb) for e in range(EPOCHS) for s in range(STEPS) for mb in range(MICRO) if (e, s) >= (0, 2)]
    outside = [(0, STEPS + i, 0) for i in range(50 - len(later))]
    return [(wire.BatchKey(JOB, *key, 0, 0), 0, body(*key, seed=99)) for key in later + outside]


@pytest.mark.parametrize("forge, gen, reason, least", [
    (other_rank, 0, accept.ANOTHER_RANK, 2 * EPOCHS * STEPS * MICRO),
    (other_job, 0, accept.ANOTHER_JOB, EPOCHS * STEPS * MICRO),
    (old_generation, 2, accept.OLD_GENERATION, EPOCHS * STEPS * MICRO - 1),
    (unrequested, 0, accept.NOT_REQUESTED, 50),
], ids=["other-rank", "other-job", "old-generation", "50-unrequested"])
def test_core_client_takes_only_what_it_asked_for(nats_url, forge, gen, reason, least, caplog):
    """Before: a batch of another rank (or job, or an old generation) under the key asked for
    was trained on and the real one dropped; 50 unrequested batches marked later keys as
    received, so their real copies were dropped as duplicates and the rank hung."""
    svc = HostileCoreService(nats_url, forge=forge, gen=gen)
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=20, fetch_timeout_s=0.5,
                       fetch_window=3)
    try:
        got = consume(src)
    finally:
        src.close()
        svc.close()
    assert [(e, s) for e, s, _ in got] == [(e, s) for e in range(EPOCHS) for s in range(STEPS)]
    for e, s, records in got:
        for mb, rec in enumerate(records):
            assert rec.equals(pa.ipc.open_stream(body(e, s, mb)).read_next_batch()), (e, s, mb)
    assert src.dropped.get(reason, 0) >= least, src.dropped
    assert set(src.dropped) == {reason}, src.dropped
    assert any("did not ask for" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_register_reply_generation_is_the_floor(nats_url):
    """A service that names the rank's generation in its register reply: an older copy is
    refused from the first batch on."""
    svc = HostileCoreService(nats_url, gen=3, reply_extra={"generation": 3},
                             forge=lambda k: [(wire.BatchKey(JOB, *k, 0, 0), 2, body(*k, seed=99))])
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=20, fetch_timeout_s=0.5)
    try:
        got = consume(src)
    finally:
        src.close()
        svc.close()
    assert all(rec.equals(pa.ipc.open_stream(body(e, s, mb)).read_next_batch())
               for e, s, records in got for mb, rec in enumerate(records))
    assert set(src.dropped) == {accept.OLD_GENERATION}
    assert src.dropped[accept.OLD_GENERATION] >= EPOCHS * STEPS * MICRO  # chunks: a batch has one or more


BOUND_S = 3.0


@pytest.mark.parametrize("stop_after", [3, STEPS * MICRO], ids=["mid-epoch", "at-the-epoch-boundary"])
def test_a_gone_service_is_a_clear_error_within_the_bound(nats_url, stop_after):
    """The service answers some fetches, then vanishes. Before: mid-epoch, every fetch asked
    again drew a no-responders status that counted as activity, so the rank waited forever; at
    an epoch boundary the unanswered register ended the stream as if the job had no more data."""
    svc = HostileCoreService(nats_url, stop_after=stop_after)
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=BOUND_S, wait_s=BOUND_S,
                       fetch_timeout_s=0.5, request_timeout_s=1.0, fetch_window=1)
    t0 = time.monotonic()
    try:
        with pytest.raises(ServiceGone) as err:
            consume(src, deadline_s=30)
    finally:
        src.close()
        svc.close()
    waited = time.monotonic() - t0
    assert waited < BOUND_S + 10, waited
    msg = str(err.value)
    for part in (JOB, "rank (0, 0)", nats_url, f"{BOUND_S:.0f} s", accept.SERVICE_TIMEOUT_ENV):
        assert part in msg, (part, msg)


def test_the_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(accept.SERVICE_TIMEOUT_ENV, "7.5")
    src = StreamSource(url="nats://unused", job=JOB, dims=ParallelDims(), ranks=(0, 0))
    assert (src.wait_s, src.idle_timeout_s) == (7.5, 7.5)
    src.close()
    src = StreamSource(url="nats://unused", job=JOB, dims=ParallelDims(), ranks=(0, 0), wait_s=2.0)
    assert (src.wait_s, src.idle_timeout_s) == (2.0, 7.5)
    src.close()
    monkeypatch.delenv(accept.SERVICE_TIMEOUT_ENV)
    assert accept.service_timeout_s() == accept.SERVICE_TIMEOUT_S
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(accept.SERVICE_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=accept.SERVICE_TIMEOUT_ENV):
            accept.service_timeout_s()
