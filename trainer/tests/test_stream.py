"""StreamSource against a real nats-server with JetStream; this test plays the service.

The server binary comes from $MMFEED_NATS_SERVER, PATH, or <repo>/build/nats-server (built
here from the Go module's nats-server dependency when Go is available); otherwise skipped.
"""

import asyncio
import concurrent.futures
import json
import os
import shutil
import socket
import sys
import subprocess
import threading
import time
from collections import defaultdict

import pyarrow as pa
import pytest

from _dist import free_port
from mmfeed_trainer.data import stream, synthetic, wire
import mmfeed_trainer.data.stream.jetstream
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.data.sources import StepData
from mmfeed_trainer.data.stream import StreamError, StreamSource, fetch_size

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = "t1"
STEPS, MICRO, EPOCHS = 3, 2, 2


def nats_server_binary():
    for path in (os.environ.get("MMFEED_NATS_SERVER"), shutil.which("nats-server"),
                 os.path.join(REPO, "build", "nats-server")):
        if path and os.access(path, os.X_OK):
            return path
    if shutil.which("go"):
        out = os.path.join(REPO, "build", "nats-server")
        done = subprocess.run(["go", "build", "-o", out, "github.com/nats-io/nats-server/v2"], cwd=REPO,
                              capture_output=True, timeout=600)
        if done.returncode == 0:
            return out
    return None


def wait_for_port(port, deadline_s=20.0, proc=None):
    """Until something listens on port; RuntimeError at once if proc (the server) has exited."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"nats-server for port {port} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on {port} within {deadline_s} s")


def start_nats(tmp_path, extra_conf: str = ""):
    """A nats-server with JetStream on a free loopback port (``extra_conf``: more config
    lines); yields its URL and stops it afterwards. Skips without a nats-server binary."""
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("no nats-server binary (set MMFEED_NATS_SERVER)")
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:{port}"\n{extra_conf}jetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def nats_url(tmp_path):
    yield from start_nats(tmp_path)


BIG = {"grids": ((32, 32),), "min_samples": 5, "max_samples": 5}
"""Micro-batches of 5 float32 512x512 images: 15 MiB, two chunks at an 8 MiB max_payload."""


def payload(step, mb, epoch=0, shape=None):
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=4 + epoch, **(shape or {})), step, 0, mb)
    rec = rec.replace_schema_metadata({**rec.schema.metadata, b"mmfeed.job": JOB.encode(),
                                       b"mmfeed.epoch": str(epoch).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rec.schema) as w:
        w.write_batch(rec)
    return sink.getvalue().to_pybytes()


class FakeService:
    """Answers register, creates the stream and consumer, publishes chunks, records control."""

    def __init__(self, url):
        self.url = url
        self.control = {"feedback": [], "resend": [], "done": []}
        self.registers = []
        self.answer = True
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self):
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig
        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()
        await self.js.add_stream(StreamConfig(name=f"MMFEED_{JOB}", subjects=[f"mmfeed.{JOB}.batch.>"],
                                              retention=RetentionPolicy.WORK_QUEUE))
        await self.js.add_consumer(f"MMFEED_{JOB}", ConsumerConfig(
            durable_name=f"mmfeed_{JOB}_0_0", filter_subject=f"mmfeed.{JOB}.batch.0.0",
            ack_policy=AckPolicy.EXPLICIT, ack_wait=300, max_ack_pending=1024))

        async def on_register(msg):
            req = json.loads(msg.data)
            self.registers.append(req)
            ok = (req["dp"], req["mp"]) == (1, 1) and req["epoch"] < EPOCHS
            error = "" if ok else ("layout mismatch" if req["epoch"] < EPOCHS else "epoch outside the job's epochs")
            await msg.respond(json.dumps({
                "ok": ok, "error": error, "plan_hash": f"plan{req['epoch']}", "steps": STEPS if ok else 0,
                "micro_batches": MICRO if ok else 0, "epoch": req["epoch"], "modality": "all",
                "stream": f"MMFEED_{JOB}", "vocab_size": 128256,
                "consumer": f"mmfeed_{JOB}_0_0", "subject": f"mmfeed.{JOB}.batch.0.0"}).encode())
        await self.nc.subscribe(f"mmfeed.{JOB}.ctl.register.*.*", cb=on_register)
        for kind in self.control:
            async def record(msg, kind=kind):
                self.control[kind].append(json.loads(msg.data))
                if msg.reply and self.answer:  # the service answers a resend sent as a request
                    await msg.respond(json.dumps({"ok": True}).encode())
            await self.nc.subscribe(f"mmfeed.{JOB}.ctl.{kind}.0.0", cb=record)

    def publish(self, step, mb, *, gen=0, corrupt=False, garbage=False, epoch=0, shape=None, chunk=4096):
        """Publish a micro-batch; ``corrupt`` breaks its checksum, ``garbage`` sends bytes that
        pass the checksum but are not Arrow IPC."""
        async def go():
            key = wire.BatchKey(JOB, epoch, step, mb, 0, 0)
            body = b"not an arrow stream " * 50 if garbage else payload(step, mb, epoch, shape)
            for h, d in wire.make_chunks(key, body, chunk, gen):
                if corrupt and h["Mmfeed-Chunk"].startswith("0/"):
                    d = bytes([d[0] ^ 0xFF]) + d[1:]
                await self.js.publish(f"mmfeed.{JOB}.batch.0.0", d, headers=h)
        self.call(go())

    def close(self):
        self.call(self.nc.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)

    def pending(self):
        async def go():
            return (await self.js.stream_info(f"MMFEED_{JOB}")).state.messages
        return self.call(go())


@pytest.fixture
def nats_url_8mb(tmp_path):
    """A nats-server with the service's max_payload (8 MiB) and the default max_pending (64 MiB)."""
    yield from start_nats(tmp_path, "max_payload: 8MB\n")


@pytest.fixture
def svc(nats_url):
    service = FakeService(nats_url)
    yield service
    service.close()


def test_stream_source_delivers_steps_in_order_and_acks_after_use(nats_url, svc):
    svc.publish(0, 1)  # out of order: micro-batch 1 before 0
    svc.publish(0, 0)
    svc.publish(1, 0, corrupt=True)  # fails the checksum -> resend, then the replay arrives
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=30)
    assert src.data_vocab() is None  # not registered yet
    reply = src.register({"epoch": 0, "next_step": 0})
    assert reply["steps"] == STEPS
    assert src.data_vocab() == 128256  # the register reply's, for --resize-vocab
    it = src.steps({"epoch": 0, "next_step": 0})
    first = next(it)
    assert first.step == 0 and [r.column("micro_batch")[0].as_py() for r in first.records] == [0, 1]
    assert first.records[1].equals(pa.ipc.open_stream(payload(0, 1)).read_next_batch())
    before = svc.pending()
    src.ack(first)
    deadline = time.monotonic() + 10
    while svc.pending() >= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.pending() < before, "acked chunks must leave the work-queue stream"

    svc.publish(1, 1)
    svc.publish(2, 0)
    svc.publish(2, 1)
    pending_next = concurrent.futures.ThreadPoolExecutor(1).submit(next, it)  # as the prefetcher does
    deadline = time.monotonic() + 10
    while not svc.control["resend"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.control["resend"] and svc.control["resend"][0]["step"] == 1
    assert "crc32c" in svc.control["resend"][0]["reason"]
    svc.publish(1, 0, gen=1)
    second, third = pending_next.result(timeout=30), next(it)
    assert (second.step, third.step) == (1, 2)
    for s in (second, third):
        src.ack(s)
        src.feedback(s, compute_seconds=0.5, data_wait_seconds=0.01, samples=3)
    assert src.position().to_dict() == {"epoch": 0, "next_step": 3, "plan_hash": "plan0"}
    for step in range(STEPS):  # epoch 1: the source registers for it after epoch 0
        for mb in range(MICRO):
            svc.publish(step, mb, epoch=1)
    rest = list(it)  # ends when the service refuses epoch 2
    assert [(s.epoch, s.step) for s in rest] == [(1, 0), (1, 1), (1, 2)]
    assert [r["epoch"] for r in svc.registers] == [0, 1, 2]
    for s in rest:
        src.ack(s)
    src.close()
    deadline = time.monotonic() + 10
    while (len(svc.control["feedback"]) < 2 or len(svc.control["done"]) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [f["step"] for f in svc.control["feedback"]] == [1, 2]
    assert svc.control["done"] == [{"job": JOB, "epoch": e, "dp_rank": 0, "mp_rank": 0, "steps": STEPS}
                                   for e in range(EPOCHS)]


def test_refused_registration_is_an_error(nats_url, svc):
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(dp=2, mp=1, world_size=2),
                       ranks=(1, 0))
    with pytest.raises(Exception, match="layout mismatch"):
        src.register({"epoch": 0, "next_step": 0})
    src.close()


def test_close_leaves_no_task_for_the_garbage_collector(nats_url):
    """A drain cut short (a server restart) left nats-py tasks in a stopped loop; destroying them
    later, inside whatever code the collector interrupted, once failed an unrelated ast.parse."""
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims())
    parked = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), src._loop)
    src.close()
    assert src._loop.is_closed()
    assert parked.cancelled()
    src.close()  # a second close (the exit hook after the with block) does nothing


def test_close_waits_for_the_prefetch_thread(nats_url, svc, monkeypatch):
    """A loop that stops early (Lightning at max_steps) closes the stream while the prefetch
    thread converts the next step; left running, that daemon thread was inside torch when the
    interpreter exited, which aborted the example with "terminate called without an active
    exception" after it had trained (test_lightning, CI of stop 18)."""
    from mmfeed_trainer.data import batches
    convert = batches.record_to_batch

    def slow(*a, **kw):
        time.sleep(0.5)
        return convert(*a, **kw)
    monkeypatch.setattr(batches, "record_to_batch", slow)
    for step in range(STEPS):
        for mb in range(MICRO):
            svc.publish(step, mb)
    st = stream.Stream(nats_url, JOB, 0, 0, dp=1, epochs=1, request_timeout_s=5.0)
    with st:
        next(iter(st))  # step 0 handed out; the thread now converts step 1
        assert st._prefetcher._thread.is_alive()
    assert not st._prefetcher._thread.is_alive(), "close returned while the prefetch thread still converts"


def test_reconnect_sends_recent_acks_and_done_again(nats_url, svc):
    """An ack sent as the server dies is lost, and a server killed before it flushed restarts
    with the consumer of a moment earlier: the service then kept the rank at a step it had
    trained and never ended the job (test_nats_server_restart_mid_epoch[jetstream], CI of stop
    18). After a reconnect the client sends its recent acks and done again."""
    for step in range(STEPS):
        for mb in range(MICRO):
            svc.publish(step, mb)
    seen = []

    async def watch():
        async def on_ack(msg):
            seen.append(msg.subject)
        await svc.nc.subscribe(f"$JS.ACK.MMFEED_{JOB}.>", cb=on_ack)
        await svc.nc.flush()
    svc.call(watch())
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=30)
    src.register({"epoch": 0, "next_step": 0})
    it = src.steps({"epoch": 0, "next_step": 0})
    handles = []
    for _ in range(STEPS):
        data = next(it)
        handles += [m.reply for m in data.handles]
        src.ack(data)
    deadline = time.monotonic() + 10
    while (len(seen) < len(handles) or not svc.control["done"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(seen) == sorted(handles) and len(svc.control["done"]) == 1
    src._call(src._nc.force_reconnect())
    deadline = time.monotonic() + 10
    while (len(seen) < 2 * len(handles) or len(svc.control["done"]) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(seen) == sorted(handles * 2), "every recent ack is sent again once"
    assert svc.control["done"][1] == svc.control["done"][0]
    src.close()


def test_held_steps_get_in_progress_until_acked():
    """+WPI for chunks of steps handed out but not acknowledged (no server needed)."""
    class Msg:
        def __init__(self):
            self.wpi = 0

        async def in_progress(self):
            self.wpi += 1

        async def ack(self):
            pass

    src = StreamSource(url="nats://unused", job=JOB, dims=ParallelDims(), ranks=(0, 0), in_progress_after_s=0.05)
    held = StepData(0, [], [Msg(), Msg()])
    src._held[(0, 0)] = (time.monotonic(), held.handles)
    deadline = time.monotonic() + 5
    while held.handles[0].wpi < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(m.wpi >= 2 for m in held.handles)
    src.ack(held)
    count = held.handles[0].wpi
    time.sleep(0.2)
    assert held.handles[0].wpi == count, "acknowledged chunks get no more +WPI"
    src.close()


def test_cli_trains_from_the_stream_and_reports_feedback(nats_url, svc):
    """python -m mmfeed_trainer --nats: register, train every step, feedback per step, done."""
    for epoch in range(EPOCHS):
        for step in range(STEPS):
            for mb in range(MICRO):
                svc.publish(step, mb, epoch=epoch)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "mmfeed_trainer", "--nats", nats_url, "--job", JOB,
                           "--steps", "10", "--log-every", "1"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == EPOCHS * STEPS, "2 epochs of 3 steps: the run stops at the end of the data"
    deadline = time.monotonic() + 10
    while len(svc.control["done"]) < EPOCHS and time.monotonic() < deadline:
        time.sleep(0.05)
    feedback = svc.control["feedback"]
    assert [(f["epoch"], f["step"]) for f in feedback] == [(e, s) for e in range(EPOCHS) for s in range(STEPS)]
    assert all(f["compute_seconds"] > 0 and f["samples"] > 0 for f in feedback)
    assert svc.control["done"] and svc.pending() == 0, "every chunk acknowledged"


def test_large_chunks_do_not_stall_until_ack_wait(nats_url_8mb):
    """A fetch of 64 messages of 8 MiB made the server queue far more than its max_pending
    (64 MiB) for the trainer's connection: it dropped the connection as a slow consumer and
    the fetched chunks came back only after ack_wait (5 minutes, the stall seen in
    ``make demo``). The client bounds each fetch in bytes."""
    svc = FakeService(nats_url_8mb)
    try:
        for step in range(STEPS):  # about 90 MiB waiting in the stream
            for mb in range(MICRO):
                svc.publish(step, mb, shape=BIG, chunk=8 * 1024 * 1024 - 1024)
        src = StreamSource(url=nats_url_8mb, job=JOB, dims=ParallelDims(), idle_timeout_s=20)
        src.register({"epoch": 0, "next_step": 0})
        it = src.steps({"epoch": 0, "next_step": 0})
        for want in range(STEPS):
            step = next(it)  # StreamError after 20 s without a batch (ack_wait is 300 s)
            assert step.step == want
            assert step.records[0].equals(pa.ipc.open_stream(payload(want, 0, 0, BIG)).read_next_batch())
            src.ack(step)
        src.close()
    finally:
        svc.close()


@pytest.mark.parametrize("batch, max_bytes, max_payload, want", [
    (64, 32 << 20, 8 << 20, 4),      # the service's 8 MiB max_payload: 32 MiB per fetch
    (64, 32 << 20, 1 << 20, 32),     # the NATS default 1 MiB
    (64, 32 << 20, 64 << 10, 64),    # small payloads: the message count limits
    (64, 32 << 20, 64 << 20, 1),     # a payload above the byte budget: still one at a time
    (64, 0, 8 << 20, 1),
])
def test_fetch_size_bounds_bytes_per_fetch(batch, max_bytes, max_payload, want):
    assert fetch_size(batch, max_bytes, max_payload) == want


class FakeCoreService:
    """A service on the core data plane: answers register with ``data_plane: core`` and each
    fetch with the batch's chunks, except that it ignores the first fetch of ``drop`` keys and
    corrupts its first answer for ``corrupt`` keys; records fetches and acks."""

    def __init__(self, url, *, drop=(), corrupt=()):
        self.url, self.drop, self.corrupt = url, set(drop), set(corrupt)
        self.fetches, self.acks = defaultdict(int), []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self):
        import nats
        self.nc = await nats.connect(self.url)

        async def on_register(msg):
            req = json.loads(msg.data)
            ok = req["epoch"] < EPOCHS
            await msg.respond(json.dumps({
                "ok": ok, "error": "" if ok else "epoch outside the job's epochs", "plan_hash": f"plan{req['epoch']}",
                "steps": STEPS if ok else 0, "micro_batches": MICRO if ok else 0, "epoch": req["epoch"],
                "modality": "all", "data_plane": "core", "fetch_subject": f"mmfeed.{JOB}.fetch.0.0",
                "ack_subject": f"mmfeed.{JOB}.ack.0.0"}).encode())

        async def on_fetch(msg):
            req = json.loads(msg.data)
            k = (req["epoch"], req["step"], req["micro_batch"])
            self.fetches[k] += 1
            first = self.fetches[k] == 1
            if first and k in self.drop:
                return
            key = wire.BatchKey(JOB, *k, 0, 0)
            for h, d in wire.make_chunks(key, payload(k[1], k[2], k[0]), 4096):
                if first and k in self.corrupt and h["Mmfeed-Chunk"].startswith("0/"):
                    d = bytes([d[0] ^ 0xFF]) + d[1:]
                await self.nc.publish(msg.reply, d, headers=h)

        async def on_ack(msg):
            req = json.loads(msg.data)
            self.acks.append((req["epoch"], req["step"], req["micro_batch"]))

        await self.nc.subscribe(f"mmfeed.{JOB}.ctl.register.*.*", cb=on_register)
        await self.nc.subscribe(f"mmfeed.{JOB}.fetch.0.0", cb=on_fetch)
        await self.nc.subscribe(f"mmfeed.{JOB}.ack.0.0", cb=on_ack)

    def close(self):
        self.call(self.nc.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_core_data_plane_asks_again_and_acks_in_plan_order(nats_url):
    """On the core data plane the client asks for a window of batches, asks again for one whose
    fetch was lost (after fetch_timeout_s) or whose payload failed its checksum (at once),
    yields every step in plan order across both epochs, and acknowledges each step it applied
    with one ack, of its last micro-batch ("every batch up to this one", protocol section 11)."""
    svc = FakeCoreService(nats_url, drop=[(0, 1, 0)], corrupt=[(0, 2, 1)])
    try:
        src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=30, fetch_timeout_s=0.5,
                           fetch_window=3)
        src.register({"epoch": 0, "next_step": 0})
        got = []
        for step in src.steps({"epoch": 0, "next_step": 0}):
            got.append((step.epoch, step.step))
            for mb, rec in enumerate(step.records):
                assert rec.equals(pa.ipc.open_stream(payload(step.step, mb, step.epoch)).read_next_batch())
            src.ack(step)
        src.close()
        assert got == [(e, s) for e in range(EPOCHS) for s in range(STEPS)]
        assert svc.fetches[(0, 1, 0)] >= 2 and svc.fetches[(0, 2, 1)] >= 2
        deadline = time.monotonic() + 10
        want = [(e, s, MICRO - 1) for e in range(EPOCHS) for s in range(STEPS)]
        while len(svc.acks) < len(want) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.acks == want
    finally:
        svc.close()


def test_undecodable_batch_is_asked_for_again(nats_url, svc):
    """A batch that passes its checksum but is not Arrow IPC is resent (request-reply), not a crash."""
    svc.publish(0, 0)
    svc.publish(0, 1, garbage=True)
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=30)
    src.register({"epoch": 0, "next_step": 0})
    it = src.steps({"epoch": 0, "next_step": 0})
    first = concurrent.futures.ThreadPoolExecutor(1).submit(next, it)
    deadline = time.monotonic() + 10
    while not svc.control["resend"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.control["resend"] and svc.control["resend"][0]["micro_batch"] == 1
    assert svc.control["resend"][0]["reason"].startswith("decode:")
    svc.publish(0, 1, gen=1)
    step = first.result(timeout=30)
    assert step.step == 0 and len(step.records) == 2
    src.close()


def test_unanswered_resend_is_a_clear_error(nats_url, svc, monkeypatch):
    """A resend nobody answers is retried, then the rank stops with an error instead of waiting."""
    monkeypatch.setattr(stream.jetstream, "RESEND_ATTEMPTS", 2)
    svc.answer = False
    svc.publish(0, 0, corrupt=True)
    src = StreamSource(url=nats_url, job=JOB, dims=ParallelDims(), idle_timeout_s=30, request_timeout_s=0.5)
    src.register({"epoch": 0, "next_step": 0})
    with pytest.raises(StreamError, match="unanswered after 2 attempts"):
        next(src.steps({"epoch": 0, "next_step": 0}))
    assert len(svc.control["resend"]) == 2
    src.close()


def test_a_call_the_stopped_loop_never_ran_closes_its_coroutine():
    """A call timed out because the loop stopped (``close`` raced the prefetch thread) closes
    its coroutine, instead of leaving it to warn 'coroutine ... was never awaited' at exit."""
    from mmfeed_trainer.data.stream.loop import run_in

    loop = asyncio.new_event_loop()  # never run: as after close
    try:
        async def take():
            return 1

        coro = take()
        with pytest.raises(TimeoutError):
            run_in(loop, coro, 0.05, "a test")
        assert coro.cr_frame is None, "the coroutine was left unstarted and open"
    finally:
        loop.close()
