"""Connection events of a rank's NATS connection, one log line each (package doc, "Logging")."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("mmfeed_trainer.stream")


class _NatsEvents:
    """nats-py's error and disconnect callbacks for one rank's connection: one log line per
    event, never a traceback (nats-py's default logs one for every refused connect, six in
    3 s while a rank waits for its service). A refused or dropped connection while waiting or
    reconnecting is expected: logged once at INFO, its repeats at DEBUG, and not at all after
    ``close`` began. Anything else (authorization, a slow consumer, a protocol error) is a real
    failure: one WARNING line each time its description changes."""

    def __init__(self, url: str):
        self.url = url
        self.closing = False
        self._last = ""

    @staticmethod
    def _expected(err: BaseException) -> bool:
        import nats.errors
        return isinstance(err, (OSError, asyncio.TimeoutError, nats.errors.StaleConnectionError,
                                nats.errors.ConnectionClosedError, nats.errors.NoServersError))

    @staticmethod
    def describe(err: BaseException) -> str:
        text = str(err).strip()
        return f"{type(err).__name__}: {text}" if text else type(err).__name__

    def _once(self, level: int, msg: str, *args) -> None:
        text = msg % args
        log.log(logging.DEBUG if text == self._last else level, "%s", text)
        self._last = text

    async def error(self, err: BaseException) -> None:
        if self.closing:
            log.debug("stream: NATS at %s while closing: %s", self.url, self.describe(err))
        elif self._expected(err):
            self._once(logging.INFO, "stream: NATS at %s unreachable (%s); trying again", self.url,
                       type(err).__name__)
        else:
            self._once(logging.WARNING, "stream: NATS at %s: %s", self.url, self.describe(err))

    async def disconnected(self) -> None:
        if self.closing:
            log.debug("stream: disconnected from NATS at %s (closing)", self.url)
        else:
            self._once(logging.INFO, "stream: disconnected from NATS at %s; reconnecting", self.url)

    def reconnected(self) -> None:
        self._last = ""
        log.info("stream: reconnected to NATS at %s", self.url)
