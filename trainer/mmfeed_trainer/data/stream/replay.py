"""Control messages of a rank, and the idempotent ones sent again after a reconnect."""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("mmfeed_trainer.stream")

REPLAY_S = 30.0
"""Acknowledgements and ``done`` reports sent within this long before a reconnect are sent
again after it. One sent as the server died is lost with the connection, and a server killed
before it flushed its state restarts with the consumer of a moment earlier: either way the
service would keep the rank at a step it trained, and wait for it forever at the job's end.
Both messages are idempotent (an ack of an acknowledged message does nothing)."""


class Replay:
    """``StreamSource``'s control messages (a mixin: the state is the source's ``_sent``)."""

    def _publish(self, kind: str, body: dict, *, replay: bool = False) -> None:
        """Publish a control message; ``replay``: it is idempotent and sent again after a
        reconnect within ``REPLAY_S``."""
        self._call(self._send(self._subject(kind), json.dumps(body).encode(), replay), timeout=self.request_timeout_s)

    async def _send(self, subject: str, data: bytes, replay: bool) -> None:
        if replay:
            self._remember(subject, data)
        await self._nc.publish(subject, data)

    def _remember(self, subject: str, data: bytes) -> None:
        """Keep a sent message for ``_replay`` (in the event loop, as ``_replay``)."""
        now = time.monotonic()
        self._sent.append((now, subject, data))
        while self._sent[0][0] < now - REPLAY_S:
            self._sent.popleft()

    async def _replay(self) -> None:
        """Send the remembered acknowledgements and reports again (after a reconnect)."""
        since = time.monotonic() - REPLAY_S
        sent = [(subject, data) for t, subject, data in self._sent if t >= since]
        try:
            for subject, data in sent:
                await self._nc.publish(subject, data)
        except Exception as err:  # disconnected again: the next reconnect sends them
            log.warning("stream: sending recent acknowledgements again after a reconnect: %r", err)
            return
        if sent:
            log.info("stream: reconnected; sent %d recent acknowledgements and reports again", len(sent))
