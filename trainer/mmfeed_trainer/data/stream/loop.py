"""The asyncio event loop a ``StreamSource`` runs nats-py in, on a daemon thread; the
synchronous methods submit coroutines to it (``run_in``) and ``stop`` ends it without leaving
a coroutine unawaited."""

from __future__ import annotations

import asyncio
import threading

from .errors import StreamError


class LoopThread:
    """An event loop running in a daemon thread of ``name``."""

    def __init__(self, name: str = "mmfeed-nats"):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Cancel what is pending, stop the loop, join the thread and close the loop."""
        try:  # a drain cut short leaves nats-py tasks parked in the loop
            if self.loop.is_running():
                run_in(self.loop, _cancel_pending(), 5.0, "the event loop")
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            # Calls submitted as the loop stopped (the prefetch thread's) are queued or started
            # as tasks that never ran: run them here, cancelled, so that their callers return
            # now and no coroutine is destroyed unawaited.
            for _ in range(3):  # again if a second stop request was queued
                try:
                    self.loop.run_until_complete(_cancel_pending())
                    break
                except RuntimeError:
                    continue
            # Closed here, not left to the garbage collector: destroying a loop with pending
            # tasks logs from whatever code the collector interrupts (once inside ast.parse,
            # which CPython 3.11 then failed with "AST constructor recursion depth mismatch").
            self.loop.close()


def run_in(loop: asyncio.AbstractEventLoop, coro, timeout: float, who: str):
    """Run ``coro`` in ``loop``; at most ``timeout``, then it is cancelled and TimeoutError
    raised: no call waits forever. On a closed loop, StreamError naming ``who``; a call the
    loop's stop cut short raises concurrent.futures.CancelledError. Either way the coroutine
    is awaited or closed, never left behind unawaited."""
    try:
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: the coroutine never starts
        coro.close()
        raise StreamError(f"stream: {who} is closed") from None
    try:
        return fut.result(timeout)
    except TimeoutError:
        fut.cancel()
        if not loop.is_running():
            coro.close()  # the loop stopped (close) before it ran: never started, never awaited
        raise


async def _cancel_pending() -> None:
    """Cancel every task of the running loop but the caller's, and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
