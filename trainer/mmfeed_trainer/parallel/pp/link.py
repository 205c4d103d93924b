"""Point-to-point messages between pipeline stages (``stage``): a forward message is a
fixed-size int64 header (micro-batch index, padded/packed, then dtype code, ndim and shape of
each tensor in ``PADDED_KEYS`` / ``PACKED_KEYS`` order) followed by those tensors; a backward
message is the gradients of ``GRAD_KEYS``, whose shapes the receiver sent itself.

The headers (and the micro-batch's host ``Layout``: the segment sizes the next stages'
attention masks and the fusion need) travel on the pipeline's host group (``ParallelDims.host_group(PP)``: a gloo
twin of the pp group on CUDA, the pp group itself on the CPU), so a receiver reads the
shapes it must allocate without a device sync; the tensors on the device group. A send
whose stage receives next (the 1F1B steady state: send forward + receive backward, as
Megatron-LM pairs them) is posted together with that receive in one ``batch_isend_irecv``
group, so two neighbouring stages never both block in a send (NCCL runs a pair's sends and
receives in order on one stream); a send followed by another forward (the warm-up, and every
forward of the first stage, which receives no activations) is posted at once, so the next
stage starts on micro-batch 0 while this one computes micro-batch 1.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from ... import timing
from ...data.layout import Layout

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
_MAX_LAYOUT = 1 << 20
"""Largest layout message (bytes of JSON) a stage accepts."""


class Link:
    """The sends and receives of one stage with its neighbours (global ranks ``prev`` and
    ``next``; None at the ends). Tensor sends are queued until ``post`` or the next receive;
    headers go at once on ``host`` (a gloo group; None: the default group)."""

    def __init__(self, *, prev: int | None, next: int | None, device: torch.device, packed: bool, host=None):
        self.prev, self.next, self.device, self.host = prev, next, device, host
        self.keys = PACKED_KEYS if packed else PADDED_KEYS
        self.packed = packed
        self._pending: list[dist.P2POp] = []
        self._inflight: list = []  # posted sends (works) not waited for yet
        self._headers: list = []  # (work, header) of header sends not waited for yet
        self._keep: list[torch.Tensor] = []  # send buffers alive until their group completes

    def send_forward(self, index: int, carry: dict, *, post: bool = False) -> None:
        """Send micro-batch ``index``'s carry: its header now, its tensors with the next
        receive, or at once with ``post`` (the stage's next action is another forward)."""
        header = torch.zeros(self._header_len(), dtype=torch.int64)
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
        if self.next is None:
            raise RuntimeError("pipeline: no stage to send to")
        host = [header]
        if carry.get("layout") is not None:
            host.append(encode_layout(carry["layout"]))
            header[-1] = host[1].numel()
        self._headers += [(w, host) for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, self.next, self.host) for t in host])]
        self._queue_send(tensors, self.next)
        if post:
            self.post()

    def recv_forward(self, index: int, clock: timing.StepClock | None = None) -> dict:
        """The carry of micro-batch ``index``; its activations are leaves that require grad.
        (Here and below, the waits are comm spans of ``clock``; None: not timed.)"""
        header = torch.empty(self._header_len(), dtype=torch.int64)
        with timing.comm(clock):
            dist.recv(header, self.prev, group=self.host)
        layout = None
        if not 0 <= int(header[-1]) <= _MAX_LAYOUT:
            raise RuntimeError(f"pipeline: a layout of {int(header[-1])} bytes from stage rank {self.prev}")
        if int(header[-1]):
            raw = torch.empty(int(header[-1]), dtype=torch.uint8)
            with timing.comm(clock):
                dist.recv(raw, self.prev, group=self.host)
            layout = decode_layout(raw)
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
        carry["layout"] = layout
        for key in GRAD_KEYS:
            carry[key].requires_grad_(True)
        return carry

    def _header_len(self) -> int:
        """Micro-batch index, packed flag, a field per tensor, the layout's byte count."""
        return 3 + _FIELD * len(self.keys)

    def send_backward(self, grads: list[torch.Tensor]) -> None:
        self._queue_send([g.contiguous() for g in grads], self.prev)

    def recv_backward(self, like: list[torch.Tensor], clock: timing.StepClock | None = None) -> list[torch.Tensor]:
        """Gradients for the tensors ``like`` this stage sent forward."""
        grads = [torch.empty_like(t, device=self.device) for t in like]
        self._exchange([dist.P2POp(dist.irecv, g, self.next) for g in grads], clock)
        return grads

    def post(self) -> None:
        """Post the queued sends now, without waiting for them (the next receive or ``flush``
        does)."""
        if self._pending:
            ops, self._pending = self._pending, []
            self._inflight += dist.batch_isend_irecv(ops)

    def flush(self, clock: timing.StepClock | None = None) -> None:
        """Post and wait for every send (the end of a step)."""
        if self._pending or self._inflight:
            self._exchange([], clock)
        with timing.comm(clock):
            for work, _ in self._headers:
                work.wait()
        self._headers = []

    def _queue_send(self, tensors: list[torch.Tensor], peer: int | None) -> None:
        if peer is None:
            raise RuntimeError("pipeline: no stage to send to")
        self._keep += tensors
        self._pending += [dist.P2POp(dist.isend, t, peer) for t in tensors]

    def _exchange(self, recvs: list[dist.P2POp], clock: timing.StepClock | None) -> None:
        ops, self._pending = self._pending + recvs, []
        works, self._inflight = self._inflight, []
        with timing.comm(clock):
            if ops:
                works += dist.batch_isend_irecv(ops)
            for work in works:
                work.wait()
        self._keep = []


def encode_layout(layout: Layout) -> torch.Tensor:
    """A micro-batch's host ``Layout`` as a uint8 host tensor (JSON of its fields)."""
    return torch.frombuffer(bytearray(json.dumps(layout._asdict()).encode()), dtype=torch.uint8)


def decode_layout(raw: torch.Tensor) -> Layout:
    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v
    fields = json.loads(bytes(raw.tolist()))
    if not isinstance(fields, dict) or not set(fields) <= set(Layout._fields):
        raise RuntimeError(f"pipeline: a layout with fields {sorted(fields) if isinstance(fields, dict) else fields!r}")
    return Layout(**{k: tuples(v) for k, v in fields.items()})


def _wire(t: torch.Tensor) -> torch.Tensor:
    return (t.to(torch.uint8) if t.dtype == torch.bool else t).contiguous()
