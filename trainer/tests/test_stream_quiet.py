"""StreamSource's plumbing stays quiet on expected events: no NATS traceback while it waits
for a service that is not up yet, and no coroutine left unawaited when it is closed."""

import asyncio
import gc
import logging
import threading
import time
import warnings

import pytest

from _dist import free_port
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.data.stream import ServiceGone, StreamError, StreamSource


def source(url: str, wait_s: float = 30.0) -> StreamSource:
    return StreamSource(url=url, job="quiet", dims=ParallelDims(dp=1, mp=1, world_size=1), ranks=(0, 0),
                        wait_s=wait_s, idle_timeout_s=5.0, request_timeout_s=1.0)


def unawaited(fn) -> list[str]:
    """The 'never awaited' RuntimeWarnings fn leaves behind (collected at once)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
        gc.collect()
    return [str(w.message) for w in caught if "never awaited" in str(w.message)]


def test_a_call_after_close_raises_and_awaits_nothing():
    src = source("nats://127.0.0.1:1")
    src.close()

    def call():
        with pytest.raises(StreamError, match="closed"):
            src._call(src._take(1.0))
    assert unawaited(call) == []


def test_close_ends_a_call_the_stopped_loop_never_ran():
    """A call submitted as the loop stops (the prefetch thread, while close runs) ends when close
    does, not after its timeout, and its coroutine is awaited (cancelled), not left behind."""
    src = source("nats://127.0.0.1:1")
    src._inbox_q = asyncio.Queue()  # what register sets up on the core data plane
    busy, release, done = threading.Event(), threading.Event(), []
    src._loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(5)))
    busy.wait(5)

    def call():
        try:
            src._call(src._take(30.0), timeout=30.0)
        except BaseException as err:  # noqa: B036 - recorded for the assertion
            done.append((type(err).__name__, time.monotonic()))
    t = threading.Thread(target=call)

    def stop_and_close():
        t.start()
        time.sleep(0.2)  # the call's callback is queued behind the busy one
        src._loop.call_soon_threadsafe(src._loop.stop)
        release.set()
        src._thread.join(5)
        start = time.monotonic()
        src.close()
        t.join(10)
        assert done and done[0][1] - start < 3, (done, start)
    assert unawaited(stop_and_close) == []


def test_waiting_for_a_service_logs_one_line_and_no_traceback(caplog, capfd):
    port = free_port()  # nothing listens: every connect attempt is refused
    src = source(f"nats://127.0.0.1:{port}", wait_s=3.0)
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(ServiceGone, match="could not register .*NATS does not accept connections"):
            src.register({"epoch": 0, "next_step": 0})
    finally:
        src.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionRefusedError" not in err, err
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]
    nats_lines = [r.getMessage() for r in records if r.name.startswith("nats")]
    assert nats_lines == [], nats_lines
    waiting = [r.getMessage() for r in records if "NATS" in r.getMessage()]
    assert len(waiting) == 1 and f"127.0.0.1:{port}" in waiting[0], [r.getMessage() for r in records]


def test_a_real_failure_is_one_warning_line_and_closing_is_quiet(caplog):
    import nats.errors
    from mmfeed_trainer.data.stream import _NatsEvents
    events = _NatsEvents("nats://127.0.0.1:4222")
    caplog.set_level(logging.DEBUG, logger="mmfeed_trainer.stream")
    for err in (nats.errors.AuthorizationError(), nats.errors.AuthorizationError(), nats.errors.SlowConsumerError(
            subject="s", reply="", sid=1, sub=None), ConnectionRefusedError(111, "refused")):
        asyncio.run(events.error(err))
    events.closing = True
    asyncio.run(events.disconnected())
    asyncio.run(events.error(nats.errors.UnexpectedEOF()))
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in got] == ["WARNING", "DEBUG", "WARNING", "INFO", "DEBUG", "DEBUG"], got
    assert "authorization" in got[0][1].lower() and "slow consumer" in got[2][1].lower(), got
    assert all(r.exc_info is None for r in caplog.records)
