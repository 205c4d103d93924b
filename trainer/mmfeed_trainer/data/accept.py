"""Which batch chunks a rank accepts (docs/security.md, "The trainer accepts only what it asked
for"), and how long it waits for a service that does not answer (docs/reliability.md).

``BatchFilter`` checks a chunk's full key -- job, epoch, step, micro-batch, dp rank, mp rank,
generation -- against what the rank requested, before the chunk reaches the reassembler, so
an unrequested message never marks a key as received. Everything it refuses is counted by
reason and reported with a rate-limited warning. Not thread-safe (one per rank, used by the
thread that reads the batches).

``service_timeout_s()`` is the default bound of every wait of the stream client: the
``MMFEED_SERVICE_TIMEOUT_S`` environment variable, else ``SERVICE_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

from .wire import ChunkHeader

log = logging.getLogger("mmfeed_trainer.stream")

SERVICE_TIMEOUT_ENV = "MMFEED_SERVICE_TIMEOUT_S"
SERVICE_TIMEOUT_S = 600.0
"""How long a rank waits for the service by default: for a register answer (a service that is
starting or still plans), and for the next batch it asked for."""
WARN_EVERY_S = 10.0
"""At most one warning about dropped chunks this often (the first of each reason at once)."""

ANOTHER_JOB = "another job"
ANOTHER_RANK = "another rank"
OLD_GENERATION = "an old generation"
NOT_REQUESTED = "not requested"
MALFORMED = "malformed headers"


def service_timeout_s() -> float:
    """``MMFEED_SERVICE_TIMEOUT_S`` (seconds, > 0), else ``SERVICE_TIMEOUT_S``. ValueError for a
    value that is not a positive number."""
    raw = os.environ.get(SERVICE_TIMEOUT_ENV, "").strip()
    if not raw:
        return SERVICE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{SERVICE_TIMEOUT_ENV}={raw!r}: want a positive number of seconds")
    return value


class BatchFilter:
    """The chunks one rank (``job``, ``dp_rank``, ``mp_rank``) accepts.

    A chunk is refused when its job or ranks are not this rank's, when its generation is below
    ``floor`` (the highest generation of a batch the rank accepted, or the register reply's
    ``generation``: the service bumps a rank's generation on every rewind and purges what it
    held, so nothing it still sends is older), or, where the caller says so, when the rank did
    not ask for its key."""

    def __init__(self, job: str, dp_rank: int, mp_rank: int, *, floor: int = 0):
        self.job, self.dp_rank, self.mp_rank = job, dp_rank, mp_rank
        self.floor = floor
        self.dropped: Counter[str] = Counter()
        """Chunks refused, by reason."""
        self._warned: set[str] = set()
        self._last_warning = 0.0

    def reason(self, h: ChunkHeader, *, requested: bool = True) -> str | None:
        """Why the chunk is refused, or None when it is accepted."""
        k = h.key
        if k.job != self.job:
            return ANOTHER_JOB
        if (k.dp_rank, k.mp_rank) != (self.dp_rank, self.mp_rank):
            return ANOTHER_RANK
        if h.gen < self.floor:
            return OLD_GENERATION
        if not requested:
            return NOT_REQUESTED
        return None

    def accepted(self, h: ChunkHeader) -> None:
        """A batch with this header was delivered: raise the generation floor to it."""
        self.floor = max(self.floor, h.gen)

    def drop(self, reason: str, what: str) -> None:
        """Count a refused chunk (``what`` describes it) and warn, rate-limited."""
        self.dropped[reason] += 1
        now = time.monotonic()
        if reason in self._warned and now - self._last_warning < WARN_EVERY_S:
            return
        self._warned.add(reason)
        self._last_warning = now
        counts = ", ".join(f"{n} {r}" for r, n in sorted(self.dropped.items()))
        log.warning("stream: rank (%d, %d) of job %s dropped a chunk it did not ask for (%s: %s); dropped so far: %s",
                    self.dp_rank, self.mp_rank, self.job, reason, what, counts)

    def total(self) -> int:
        return sum(self.dropped.values())
