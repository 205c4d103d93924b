"""Differentiable point-to-point exchange of text features between the two mp ranks.

mp rank 1 (text) sends, per micro-batch, the text tower output to mp rank 0 (vision +
fusion); the gradient of those features comes back in the backward pass:

    text rank                                   vision rank
    send [B, L, lengths...]  (int64)   ---->    recv, checks B
    send payload (hidden, emb)         ---->    recv -> TextFeatures (requires grad)
                  ... loss.backward() on the vision rank ...
    recv d payload  (backward of the   <----    send d payload (backward of the recv)
    send, then the text tower backward)

Both ranks run the same micro-batches in the same order, so the messages pair up. The
payload travels in ``dtype`` (float32 on CPU, bfloat16 under CUDA autocast). Every blocking
send and receive, forward and backward, is a comm span of the ``timing.StepClock`` the caller
passes (None: not timed).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import timing
from ..models.model import TextFeatures


class _SendWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, payload: torch.Tensor, peer: int, group, clock: timing.StepClock | None) -> torch.Tensor:
        ctx.peer, ctx.group, ctx.clock = peer, group, clock
        ctx.shape, ctx.dtype = payload.shape, payload.dtype
        with timing.comm(clock):
            dist.send(payload.contiguous(), dst=peer, group=group)
        return payload.new_zeros(())

    @staticmethod
    def backward(ctx, _grad: torch.Tensor):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=_grad.device)
        with timing.comm(ctx.clock):
            dist.recv(grad, src=ctx.peer, group=ctx.group)
        return grad, None, None, None


class _RecvWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor: torch.Tensor, numel: int, dtype: torch.dtype, peer: int, group,
                clock: timing.StepClock | None) -> torch.Tensor:
        ctx.peer, ctx.group, ctx.clock = peer, group, clock
        buf = torch.empty(numel, dtype=dtype, device=anchor.device)
        with timing.comm(clock):
            dist.recv(buf, src=peer, group=group)
        return buf

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with timing.comm(ctx.clock):
            dist.send(grad.contiguous(), dst=ctx.peer, group=ctx.group)
        return None, None, None, None, None, None


class Exchange:
    """One end of the text-feature exchange between mp ranks of a dp replica."""

    def __init__(self, *, peer: int, group, device: torch.device, dtype: torch.dtype,
                 hidden_dim: int, embed_dim: int, host_group=None):
        """``host_group``: the mp group's twin for host tensors (``ParallelDims.host_group``),
        which carries the header (None: ``group``, whose backend then takes host tensors)."""
        self.peer = peer
        self.group = group
        self.host_group = group if host_group is None else host_group
        self.device = device
        self.dtype = dtype
        self.hidden_dim = hidden_dim
        self.embed_dim = embed_dim

    def send_text(self, txt: TextFeatures, clock: timing.StepClock | None = None,
                  lengths: tuple[int, ...] | None = None) -> torch.Tensor:
        """Send the features; returns a scalar whose ``backward()`` pulls their gradient.
        Packed features (``hidden`` of shape (tokens, D)) travel as they are, flagged in the
        header. The header is a host tensor (over ``host_group``) built from ``lengths``, the
        caption lengths on the host (the batch's ``layout``; None: read from ``txt``)."""
        packed = txt.hidden.dim() == 2
        b = txt.lengths.shape[0]
        length = txt.hidden.shape[0] if packed else txt.hidden.shape[1]
        lengths = txt.lengths.tolist() if lengths is None else list(lengths)
        header = torch.tensor([b, length, int(packed), *lengths], dtype=torch.int64)
        with timing.comm(clock):
            dist.send(header, dst=self.peer, group=self.host_group)
        payload = torch.cat([txt.hidden.reshape(-1), txt.emb.reshape(-1)]).to(self.dtype)
        return _SendWithGrad.apply(payload, self.peer, self.group, clock)

    def recv_text(self, batch_size: int, clock: timing.StepClock | None = None
                  ) -> tuple[TextFeatures, tuple[int, ...]]:
        """Receive the features of a micro-batch of ``batch_size`` samples, with gradient, and
        their caption lengths on the host (from the header: nothing is read from the device)."""
        header = torch.empty(batch_size + 3, dtype=torch.int64)
        with timing.comm(clock):
            dist.recv(header, src=self.peer, group=self.host_group)
        b, length, packed = (int(v) for v in header[:3].tolist())
        if b != batch_size:
            raise RuntimeError(f"exchange: text rank sent {b} samples, vision rank has {batch_size}: "
                               "the mp ranks consume different micro-batches")
        shape = (length, self.hidden_dim) if packed else (b, length, self.hidden_dim)
        n_hidden = math.prod(shape)
        anchor = torch.empty(0, device=self.device, requires_grad=True)
        buf = _RecvWithGrad.apply(anchor, n_hidden + b * self.embed_dim, self.dtype, self.peer, self.group,
                                  clock)
        hidden = buf[:n_hidden].view(shape)
        emb = buf[n_hidden:].view(b, self.embed_dim).clone()  # not a view: it leaves the FSDP root
        host = header[3:]
        if self.device.type == "cuda":  # an asynchronous copy: from pinned memory
            host = host.pin_memory()
        lengths = host.to(self.device, non_blocking=True)
        return TextFeatures(hidden, lengths, emb), tuple(header[3:].tolist())
