"""Per-step compute time of a rank, without the time it waits for other ranks.

The balancer calibrates its cost model from each rank's own compute time; the wall time of a
step is useless for that (collectives make every rank finish together). ``StepClock`` keeps
one timeline per step -- host ``perf_counter`` on CPU, CUDA events on the GPU stream, so no
host sync is needed until ``compute_seconds()``, which the training loop calls only at log
steps (``loop.common.Window``) -- and:

* ``comm()`` brackets every blocking exchange with other ranks the step itself issues (the
  global-weight all-reduce, the contrastive all-gather, the mp feature exchange); its span is
  subtracted;
* ``mark_backward_done()`` is called by a backward pre-hook on the first layer of each tower
  (patch / token embedding): the last call is the end of the rank's local backward compute,
  so the DDP/FSDP gradient-reduction wait after it is excluded.

compute = (end of local backward of the last micro-batch - step start) - comm spans before it.

Under FSDP2 the parameter all-gathers wait for peers in every layer, forward and backward. The
forward ones are bracketed (``begin``/``end`` around FSDP's pre-forward hook), the backward
ones cannot be, so with ``forward_only`` the clock reports 3 x the forward compute (backward
= 2 x forward, the usual matmul FLOP ratio) from the forward windows ``forward()`` marks.
There is no module-level clock: the step creates its ``StepClock`` and passes it to what it
calls (losses, exchange, pipeline links; ``None`` = not timed, ``comm(None)`` is a no-op).
Autograd functions keep the clock of the forward that built them, so their backward (on the
autograd worker threads under CUDA) times into the same step. Hooks registered once at wrap
time (FSDP2's unshard wait, ``bracket_forward_pre_hooks``) and the mp exchange inside a
module's forward reach the step's clock through the ``ClockSlot`` the module holds, which
``ClockSlot.timed`` fills for the duration of one step.
"""

from __future__ import annotations

import contextlib
import time

import torch

class StepClock:
    """The timeline of one step; see the module doc."""

    def __init__(self, device: torch.device, *, forward_only: bool = False):
        self.cuda = device.type == "cuda"
        self.forward_only = forward_only
        self.start = self._now()
        self.spans: list[tuple[object, object]] = []
        self.windows: list[tuple[object, object]] = []
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

    def begin(self):
        """Open a comm span (for hooks that cannot use a ``with`` block)."""
        return self._now()

    def end(self, begin) -> None:
        self.spans.append((begin, self._now()))

    @contextlib.contextmanager
    def forward(self):
        """Mark a micro-batch's forward pass (used with ``forward_only``)."""
        begin = self._now()
        try:
            yield
        finally:
            self.windows.append((begin, self._now()))

    def mark_backward_done(self) -> None:
        self.backward_done = self._now()

    def _compute_between(self, begin, end) -> float:
        inside = [(a, b) for a, b in self.spans if self._elapsed(begin, a) >= 0 and self._elapsed(b, end) >= 0]
        return max(self._elapsed(begin, end) - sum(max(self._elapsed(a, b), 0.0) for a, b in inside), 0.0)

    def compute_seconds(self) -> float:
        """Rank-local compute of the step (syncs the device on CUDA)."""
        end = self.backward_done if self.backward_done is not None else self._now()
        if self.cuda:
            torch.cuda.synchronize()
        if self.forward_only:
            return 3.0 * sum(self._compute_between(a, b) for a, b in self.windows)
        return self._compute_between(self.start, end)


class ClockSlot:
    """Where a module's long-lived hooks find the current step's clock (None between steps)."""

    def __init__(self):
        self.clock: StepClock | None = None

    @contextlib.contextmanager
    def timed(self, clock: StepClock | None):
        """Hold ``clock`` for the duration of a step."""
        previous, self.clock = self.clock, clock
        try:
            yield clock
        finally:
            self.clock = previous


def comm(clock: StepClock | None):
    """Context around a blocking exchange with other ranks (no-op without a clock)."""
    return clock.comm() if clock is not None else contextlib.nullcontext()


def forward(clock: StepClock | None):
    """Context around one micro-batch's forward (no-op without a clock)."""
    return clock.forward() if clock is not None else contextlib.nullcontext()


def bracket_forward_pre_hooks(module: torch.nn.Module, slot: ClockSlot) -> None:
    """Count the module's existing forward pre-hooks (FSDP2's unshard wait) as a comm span of
    the clock in ``slot``: one prepended hook opens the span, one appended hook closes it."""
    def open_span(mod, _args):
        clock = slot.clock
        mod._mmfeed_span = (clock, clock.begin()) if clock is not None else None

    def close_span(mod, _args):
        span = getattr(mod, "_mmfeed_span", None)
        if span is not None:
            span[0].end(span[1])
        mod._mmfeed_span = None

    module.register_forward_pre_hook(open_span, prepend=True)
    module.register_forward_pre_hook(close_span)
