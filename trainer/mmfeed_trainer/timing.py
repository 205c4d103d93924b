"""Per-step compute time of a rank, without the time it waits for other ranks.

The balancer calibrates its cost model from each rank's own compute time; the wall time of a
step is useless for that (collectives make every rank finish together). ``StepClock`` keeps
one timeline per step -- host ``perf_counter`` on CPU, CUDA events on the GPU stream, so no
host sync is needed until ``compute_seconds()`` -- and:

* ``comm()`` brackets every blocking exchange with other ranks the step itself issues (the
  global-weight all-reduce, the contrastive all-gather, the mp feature exchange); its span is
  subtracted;
* ``mark_backward_done()`` is called by a backward pre-hook on the first layer of each tower
  (patch / token embedding): the last call is the end of the rank's local backward compute,
  so the DDP/FSDP gradient-reduction wait after it is excluded.

compute = (end of local backward of the last micro-batch - step start) - comm spans before it.
One clock is active per process (the training thread's step; CUDA backward runs on autograd
worker threads, so it is not thread-local); without one ``comm()`` is a no-op.
"""

from __future__ import annotations

import contextlib
import time

import torch

_active: StepClock | None = None


class StepClock:
    """The timeline of one step; see the module doc."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.start = self._now()
        self.spans: list[tuple[object, object]] = []
        self.backward_done = None

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _elapsed(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a

    @contextlib.contextmanager
    def comm(self):
        begin = self._now()
        try:
            yield
        finally:
            self.spans.append((begin, self._now()))

    def mark_backward_done(self) -> None:
        self.backward_done = self._now()

    def compute_seconds(self) -> float:
        """Rank-local compute of the step (syncs the device on CUDA)."""
        end = self.backward_done if self.backward_done is not None else self._now()
        if self.cuda:
            torch.cuda.synchronize()
        total = self._elapsed(self.start, end)
        waits = sum(max(self._elapsed(a, b), 0.0) for a, b in self.spans if self._elapsed(b, end) >= 0)
        return max(total - waits, 0.0)


def active() -> StepClock | None:
    return _active


@contextlib.contextmanager
def step_clock(device: torch.device):
    """Make a new StepClock the active one for the duration of a step."""
    global _active
    clock = StepClock(device)
    previous, _active = _active, clock
    try:
        yield clock
    finally:
        _active = previous


def comm():
    """Context around a blocking exchange with other ranks (no-op without an active clock)."""
    clock = active()
    return clock.comm() if clock is not None else contextlib.nullcontext()
