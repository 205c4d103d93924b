"""The stream client's errors."""

from __future__ import annotations

class StreamError(RuntimeError):
    """The service refused the rank, or the stream broke the protocol."""


class ServiceGone(StreamError):
    """The service did not answer within the rank's bound (``wait_s`` for a register,
    ``idle_timeout_s`` for a batch asked for): it is gone, or NATS is unreachable."""
