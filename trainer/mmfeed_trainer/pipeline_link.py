"""Point-to-point messages between pipeline stages (``pipeline``): a forward message is a
fixed-size int64 header (micro-batch index, padded/packed, then dtype code, ndim and shape of
each tensor in ``PADDED_KEYS`` / ``PACKED_KEYS`` order) followed by those tensors; a backward
message is the gradients of ``GRAD_KEYS``, whose shapes the receiver sent itself.

Sends are queued and posted together with the stage's next receive in one
``batch_isend_irecv`` group (or by ``flush``), so two neighbouring stages never both block
in a send (NCCL runs a pair's sends and receives in order on one stream).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import timing

PADDED_KEYS = ("vx", "vmask", "tx", "lengths", "weight", "neg_text", "neg_image")
"""What a padded micro-batch carries between stages, in header order."""
PACKED_KEYS = ("vx", "vcu", "tx", "lengths", "weight", "neg_text", "neg_image")
"""Packed: the vision token offsets instead of the padded mask (text: lengths)."""
GRAD_KEYS = ("vx", "tx")
"""The activations whose gradients travel back."""
WIRE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
               torch.uint8, torch.bool)
"""Header dtype codes (index in this tuple); bool travels as uint8."""
_MAX_DIMS = 3
_FIELD = 2 + _MAX_DIMS  # dtype code, ndim, dims


class Link:
    """The sends and receives of one stage with its neighbours (global ranks ``prev`` and
    ``next``; None at the ends). Sends are queued and posted together with the next receive
    (or by ``flush``), in one ``batch_isend_irecv`` group."""

    def __init__(self, *, prev: int | None, next: int | None, device: torch.device, packed: bool):
        self.prev, self.next, self.device = prev, next, device
        self.keys = PACKED_KEYS if packed else PADDED_KEYS
        self.packed = packed
        self._pending: list[dist.P2POp] = []
        self._keep: list[torch.Tensor] = []  # send buffers alive until their group completes

    def send_forward(self, index: int, carry: dict) -> None:
        header = torch.zeros(2 + _FIELD * len(self.keys), dtype=torch.int64)
        header[0], header[1] = index, int(self.packed)
        tensors = []
        for k, key in enumerate(self.keys):
            t = carry[key].detach()
            if t.dim() > _MAX_DIMS:
                raise ValueError(f"pipeline: {key} has {t.dim()} dims (> {_MAX_DIMS})")
            at = 2 + k * _FIELD
            header[at], header[at + 1] = WIRE_DTYPES.index(t.dtype), t.dim()
            header[at + 2:at + 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
            tensors.append(_wire(t))
        self._queue_send([header.to(self.device)] + tensors, self.next)

    def recv_forward(self, index: int, clock: timing.StepClock | None = None) -> dict:
        """The carry of micro-batch ``index``; its activations are leaves that require grad.
        (Here and below, the waits are comm spans of ``clock``; None: not timed.)"""
        header = torch.empty(2 + _FIELD * len(self.keys), dtype=torch.int64, device=self.device)
        self._exchange([dist.P2POp(dist.irecv, header, self.prev)], clock)
        header = header.cpu()
        if int(header[0]) != index or bool(header[1]) != self.packed:
            raise RuntimeError(f"pipeline: expected micro-batch {index} ({'packed' if self.packed else 'padded'}) "
                               f"from stage rank {self.prev}, got {int(header[0])} "
                               f"({'packed' if header[1] else 'padded'}): the stages run different schedules")
        bufs = {}
        for k, key in enumerate(self.keys):
            at = 2 + k * _FIELD
            dtype, ndim = WIRE_DTYPES[int(header[at])], int(header[at + 1])
            shape = header[at + 2:at + 2 + ndim].tolist()
            bufs[key] = (torch.empty(shape, dtype=torch.uint8 if dtype == torch.bool else dtype, device=self.device),
                         dtype)
        self._exchange([dist.P2POp(dist.irecv, b, self.prev) for b, _ in bufs.values()], clock)
        carry = {key: (b.bool() if dtype == torch.bool else b) for key, (b, dtype) in bufs.items()}
        for key in GRAD_KEYS:
            carry[key].requires_grad_(True)
        return carry

    def send_backward(self, grads: list[torch.Tensor]) -> None:
        self._queue_send([g.contiguous() for g in grads], self.prev)

    def recv_backward(self, like: list[torch.Tensor], clock: timing.StepClock | None = None) -> list[torch.Tensor]:
        """Gradients for the tensors ``like`` this stage sent forward."""
        grads = [torch.empty_like(t, device=self.device) for t in like]
        self._exchange([dist.P2POp(dist.irecv, g, self.next) for g in grads], clock)
        return grads

    def flush(self, clock: timing.StepClock | None = None) -> None:
        """Post and wait for the queued sends (end of a step, or no receive follows)."""
        if self._pending:
            self._exchange([], clock)

    def _queue_send(self, tensors: list[torch.Tensor], peer: int | None) -> None:
        if peer is None:
            raise RuntimeError("pipeline: no stage to send to")
        self._keep += tensors
        self._pending += [dist.P2POp(dist.isend, t, peer) for t in tensors]

    def _exchange(self, recvs: list[dist.P2POp], clock: timing.StepClock | None) -> None:
        ops, self._pending = self._pending + recvs, []
        if ops:
            with timing.comm(clock):
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
        self._keep = []


def _wire(t: torch.Tensor) -> torch.Tensor:
    return (t.to(torch.uint8) if t.dtype == torch.bool else t).contiguous()
