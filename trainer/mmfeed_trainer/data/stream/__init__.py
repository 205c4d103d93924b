"""NATS stream client of a trainer rank (docs/protocol.md sections 6-9), with nats-py.

``StreamSource`` registers the rank with the service (``register``), then reads its chunks
on the data plane the register reply names: on the core data plane (the default) it asks for
its next batches itself, a window of them ahead, on the rank's fetch subject and acknowledges
applied batches on its ack subject; on the JetStream data plane it pulls them from its durable
consumer. It reassembles and verifies them (``wire.Reassembler``),
decodes each payload to one Arrow record batch, checks it against the chunk headers, and
yields whole steps in (epoch, step, micro-batch) order, registering again for each next
epoch until the service has none. While the service is not up yet or still plans the epoch,
``register`` waits and asks again (up to ``wait_s``). The job's layout comes back in every
register reply: with ``placement=None`` the rank takes the service's placement, and with
``global_rank`` set it also takes (dp, mp) from the service and derives its (dp rank, mp
rank) from the global rank. Chunks are acknowledged only after the step that used them
has been applied (``ack``); failed batches are terminated and re-requested (``resend``);
batches before the resume position are acknowledged and dropped. ``feedback`` is published
after every step, ``done`` once the last step of an epoch is acknowledged.

Only chunks the rank asked for are taken (``accept.BatchFilter``: its job, its ranks, no
older generation and, on the core plane, a key it requested), checked before reassembly and
counted in ``dropped``. Every wait is bounded (``wait_s``, ``idle_timeout_s``, both
``MMFEED_SERVICE_TIMEOUT_S`` by default): a service that is gone is ``ServiceGone``.

nats-py is asyncio: an event loop runs in a daemon thread and the synchronous methods
submit coroutines to it, so the prefetch thread (``steps``) and the training thread
(``ack``, ``feedback``) can both use the source. After ``close`` a call raises StreamError,
and a call ``close`` cut short ends at once; no coroutine is left unawaited.

Logging: connection events are one line each and never a traceback (``_NatsEvents``): a
refused connect while waiting for the service, a disconnect and a reconnect at INFO once
(repeats at DEBUG, nothing while closing); any other NATS error (authorization, slow
consumer) one WARNING line. A service that never answers is one ``ServiceGone`` error.

Layout: ``source`` (``StreamSource``: state, the plan-order ``steps``, close), ``loop`` (the
event loop thread), ``register`` (register and the job's layout), ``replay`` (control
messages, sent again after a reconnect), ``jetstream`` and ``core`` (the two data planes),
``checks`` (what both planes check of a received batch), ``acks`` (acknowledgements,
in-progress, done and feedback), ``events`` (connection logging), ``client`` (``Stream``).
"""

from .acks import ACK
from .checks import DECODE_ATTEMPTS
from .client import Stream
from .errors import ServiceGone, StreamError
from .events import _NatsEvents  # noqa: F401 (test_stream_quiet)
from .jetstream import RESEND_ATTEMPTS, fetch_size
from .register import CONNECT_WAIT_S
from .replay import REPLAY_S
from .source import ROLES, StreamSource

__all__ = ["ACK", "CONNECT_WAIT_S", "DECODE_ATTEMPTS", "REPLAY_S", "RESEND_ATTEMPTS", "ROLES", "ServiceGone",
           "Stream", "StreamError", "StreamSource", "fetch_size"]
