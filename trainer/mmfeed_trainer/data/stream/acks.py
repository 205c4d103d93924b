"""Acknowledging applied steps on either plane, keeping held chunks in progress, and the
``done`` and ``feedback`` reports."""

from __future__ import annotations

import asyncio
import time

from ..sources import StepData
from .core import _CoreAck

ACK = b"+ACK"


class Acks:
    """``StreamSource``'s acknowledgements and reports (a mixin over the source's state)."""

    def _ack_tags(self, tags) -> None:
        """Acknowledge JetStream chunks one by one; on the core plane send one ack, of the last
        batch: it means "every batch up to this one is applied" (protocol section 11), so a step
        costs one ack message, not one per micro-batch."""
        core = [m for m in tags if isinstance(m, _CoreAck)]

        async def _ack_all():
            for m in tags:
                if isinstance(m, _CoreAck):
                    continue
                await m.ack()
                if getattr(m, "reply", None):  # a JetStream message (_CoreAck remembers in _send_ack)
                    self._remember(m.reply, ACK)
            if core:
                await max(core, key=lambda m: m.key).ack()
        self._call(_ack_all(), timeout=self.request_timeout_s)

    async def _keep_alive(self) -> None:
        """Send +WPI for chunks held longer than ``in_progress_after_s`` (protocol section 8)."""
        while True:
            await asyncio.sleep(min(self.in_progress_after_s, 30.0))
            now = time.monotonic()
            for key, (since, msgs) in list(self._held.items()):
                if now - since >= self.in_progress_after_s:
                    for m in msgs:
                        await m.in_progress()
                    self._held[key] = (now, msgs)

    def ack(self, data: StepData) -> None:
        """Acknowledge the step's chunks; after an epoch's last step, publish ``done``."""
        self._held.pop((data.epoch, data.step), None)
        self._ack_tags(data.handles)
        super().ack(data)
        steps = self._epochs.get(data.epoch, {}).get("steps")
        if steps is not None and data.step == steps - 1:
            self._publish("done", {"job": self.job, "epoch": data.epoch, "dp_rank": self.dp_rank,
                                   "mp_rank": self.mp_rank, "steps": steps}, replay=True)

    def feedback(self, data: StepData, *, compute_seconds: float, data_wait_seconds: float, samples: int) -> None:
        self._publish("feedback", {"job": self.job, "epoch": data.epoch, "step": data.step,
                                   "dp_rank": self.dp_rank, "mp_rank": self.mp_rank,
                                   "compute_seconds": max(compute_seconds, 0.0),
                                   "data_wait_seconds": max(data_wait_seconds, 0.0), "samples": samples})
