"""Background prefetch: convert the next steps' records to (pinned) host tensors while the
current step computes; measure how long the training thread waits for data."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from . import batches
from .sources import Source, StepData

_END = object()


@dataclass(slots=True)
class HostStep:
    data: StepData
    micro_batches: list[dict]


class Prefetcher:
    """Iterates ``source.steps(start_step)`` in a daemon thread, ``depth`` steps ahead.

    ``next()`` returns (HostStep, seconds waited) or raises StopIteration at the end of the
    data; an exception in the thread is re-raised in the caller.
    """

    def __init__(self, source: Source, *, start_step: int, role: str, pad_id: int, pin: bool, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source.steps(start_step), role, pad_id, pin),
                                        name="mmfeed-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, steps: Iterator[StepData], role: str, pad_id: int, pin: bool) -> None:
        try:
            for data in steps:
                mbs = [batches.record_to_batch(r, role=role, pad_id=pad_id, pin=pin) for r in data.records]
                if not self._put(HostStep(data, mbs)):
                    return
            self._put(_END)
        except BaseException as err:  # handed to the training thread
            self._put(err)

    def next(self) -> tuple[HostStep, float]:
        start = time.perf_counter()
        item = self._queue.get()
        waited = time.perf_counter() - start
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item, waited

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
