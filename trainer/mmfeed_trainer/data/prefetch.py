"""Background prefetch: convert the next steps' records to tensors and move them to the device
while the current step computes; measure how long the training thread waits for data.

On CUDA the host tensors are pinned and copied on a separate stream (``non_blocking``), so the
copy of step s+1 overlaps the compute of step s; ``HostStep.ready()`` makes the compute stream
wait for that copy and tells the caching allocator the tensors are used there. Without a
device (``device=None``) the steps stay host tensors (``stream.Stream`` builds on this).

JPEG micro-batches (``jpegwire``) are decoded here, a whole micro-batch at once, on the
trainer's device: on CUDA by ``Batch.to`` on the copy stream (nvJPEG; ``host_batches`` keep the
encoded rows), otherwise on the CPU in this thread; either way the step gets the pixels the uint8
path gives, normalised on the device. A JPEG that breaks the wire's limits or does not decode
raises ``BatchError`` in the training thread, like any malformed batch."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from . import batches
from .sources import Source, StepData

_END = object()


class PrefetchTimeout(TimeoutError):
    """The prefetch thread produced nothing within its source's bound."""


@dataclass(slots=True)
class HostStep:
    data: StepData
    host_batches: list[batches.Batch]
    """Host tensors (pinned on CUDA); pixel values still in the wire dtype."""
    micro_batches: list[batches.Batch]
    """On the device, pixels normalised: what the step consumes (after ``ready()``)."""
    copied: object = None
    """CUDA event recorded after the copies, or None."""

    def ready(self) -> list[batches.Batch]:
        if self.copied is not None:
            stream = torch.cuda.current_stream()
            stream.wait_event(self.copied)
            for mb in self.micro_batches:
                for v in mb.tensors():
                    if v.is_cuda:
                        v.record_stream(stream)
        return self.micro_batches


class Prefetcher:
    """Iterates ``source.steps(position)`` in a daemon thread, ``depth`` steps ahead.

    ``next()`` returns (HostStep, seconds waited) or raises StopIteration at the end of the
    data; an exception in the thread is re-raised in the caller. When the source has a bound
    (``Source.wait_bound_s``, the stream's: its own waits time out first), ``next()`` waits at
    most that long for the thread and raises ``PrefetchTimeout``: the training thread never
    waits forever for a thread that is stuck.
    """

    def __init__(self, source: Source, *, position: dict, role: str, pad_id: int, device: torch.device | None,
                 depth: int = 2, pack: bool = False, patch_size: int = 16, check_pack: bool = True,
                 vocab_size: int | None = None, epochs: int | None = None, name: str = "mmfeed-prefetch"):
        """device: where the step's micro-batches go (None: they stay on the host, unpinned);
        pack: the device batches are packed (``batches.pack`` with ``patch_size``);
        check_pack: every record's ``mmfeed.pack`` metadata must agree (BatchError);
        vocab_size: the model's vocabulary, at least every record's ``mmfeed.vocab_size``
        (BatchError); records pad with their ``mmfeed.pad_id`` when they carry one;
        epochs: stop after this many epochs from the position's (None: the source's end)."""
        self._pack, self._patch, self._check, self._vocab = pack, patch_size, check_pack, vocab_size
        self._wait_s, self._name = source.wait_bound_s(), name
        steps = source.steps(position)
        if epochs is not None:
            steps = _first_epochs(steps, position.get("epoch", 0) + epochs)
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._device = device
        self._copy_stream = torch.cuda.Stream(device) if device is not None and device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, args=(steps, role, pad_id), name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _convert(self, data: StepData, role: str, pad_id: int) -> HostStep:
        cuda = self._copy_stream is not None
        want = self._pack if self._check else None
        host = [batches.record_to_batch(r, role=role, pad_id=pad_id, pin=cuda, pack=want,
                                        vocab_size=self._vocab).replace(epoch=data.epoch) for r in data.records]
        if not cuda:  # JPEG micro-batches decode here, on the CPU (under CUDA: in ``to``, on the device)
            host = [mb.decoded("cpu") for mb in host]
        if self._device is None:
            return HostStep(data, host, host)
        if not cuda:  # pack first: normalise and copy only the real pixels
            return HostStep(data, host, [self._packed(mb).to(self._device) for mb in host])
        with torch.cuda.stream(self._copy_stream):
            dev = [self._packed(mb.to(self._device, non_blocking=True)) for mb in host]
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        return HostStep(data, host, dev, event)

    def _packed(self, mb: batches.Batch) -> batches.Batch:
        return batches.pack(mb, self._patch) if self._pack else mb

    def _run(self, steps: Iterator[StepData], role: str, pad_id: int) -> None:
        try:
            if self._copy_stream is not None:
                torch.cuda.set_device(self._device)
            for data in steps:
                if not self._put(self._convert(data, role, pad_id)):
                    return
            self._put(_END)
        except BaseException as err:  # handed to the training thread
            self._put(err)

    def next(self) -> tuple[HostStep, float]:
        start = time.perf_counter()
        try:
            item = self._queue.get(timeout=self._wait_s)
        except queue.Empty:
            raise PrefetchTimeout(f"prefetch: thread {self._name} produced no step for {self._wait_s:g} s "
                                  f"(its source's bound)") from None
        waited = time.perf_counter() - start
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item, waited

    def stop(self) -> None:
        """Stop prefetching without waiting for the thread (it ends at its next queue put)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _first_epochs(steps: Iterator[StepData], end: int) -> Iterator[StepData]:
    """``steps`` up to (without) the first step of epoch ``end``."""
    for data in steps:
        if data.epoch >= end:
            return
        yield data
