"""``Stream``: the client trainers use (a rank's micro-batches in plan order, prefetched)."""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Iterator

from ..batches import Batch
from ...parallel.parallel_dims import ROLE_FULL, ParallelDims
from ..prefetch import Prefetcher
from ..sources import StepData
from .errors import StreamError
from .source import ROLES, StreamSource

log = logging.getLogger("mmfeed_trainer.stream")


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
