"""torch datasets over mmfeed's output, for your own training loop.

    from torch.utils.data import DataLoader
    from mmfeed_trainer.data import StreamDataset, weighted_loss

    ds = StreamDataset("nats://127.0.0.1:4222", "demo")        # RANK / WORLD_SIZE from torchrun
    for batch in DataLoader(ds, batch_size=None):               # one micro-batch per item
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    pixel_values=batch["pixel_values"])
        loss = weighted_loss(per_sample_loss(out), batch["weight"])
        ...
        checkpoint["data"] = ds.state_dict()                     # beside the model's

Contract
--------
* ``StreamDataset(url, job)`` reads this rank's micro-batches from ``mmfeed serve`` through
  one ``stream.Stream`` client; ``ShardDataset(directory)`` reads ``mmfeed shard`` output.
  Both are ``IterableDataset``s of already-batched micro-batches: use
  ``DataLoader(ds, batch_size=None)`` and ``num_workers=0`` (the stream prefetches in its own
  thread; a worker process would register the rank a second time, so it raises). A
  ``batch_size`` other than None raises TypeError saying so (items are ``MicroBatch`` dicts).
* The rank: ``rank`` and ``world_size`` default to the ``RANK`` and ``WORLD_SIZE``
  environment variables torchrun sets (0 and 1 without them). The (dp, mp) layout and the
  placement come from the service's register reply unless given; rank = dp_rank * mp + mp_rank.
* Items are HF-style dicts: ``input_ids`` and ``attention_mask`` (int64, padded to the
  micro-batch's longest with the batch's ``mmfeed.pad_id``, else ``pad_id``), ``pixel_values`` (float32, normalized), ``weight``
  (float32, 0 for padding rows), ``ids`` (list of str), and the ints ``epoch``, ``step``,
  ``micro_batch`` and ``micro_batches`` (per step: the step's last has micro_batch + 1 ==
  micro_batches). A rank gets only its modality's tensors under modality placement.
  With ``mmfeed --keep url,json:label`` an item also has ``keep``: ``item["keep"]["url"]`` is
  the micro-batch's urls, one ``str``/``int``/``float`` or None (missing) per row.
  ``device=`` moves the tensors there and normalizes the pixels on it (uint8 on the wire:
  4x fewer bytes to copy); ``normalize=False`` leaves ``pixel_values`` in the wire dtype and
  adds ``pixel_mean``/``pixel_std``: call ``to_device(batch, device)`` yourself.
* The weight contract: a row of weight 0 is padding (a filled tail, a sample whose pixels
  failed to decode) and must not contribute; ranks hold different sample counts, so the
  loss is Σ weight·loss over the rank's rows divided by the weight summed over every dp
  rank (``weighted_loss`` does both; see its docstring for DDP's gradient averaging).
* ``state_dict()`` is plain picklable values: epoch, plan hash and the position in the plan
  (next step, next micro-batch), the same on every dp rank and independent of the rank, so
  it goes into the model's checkpoint as is. ``load_state_dict`` before iterating: the next
  iteration continues with the first micro-batch not yet handed out; every sample of the
  epoch is seen exactly once across a stop and a restart (the service redelivers what was
  handed out but not acknowledged, and the dataset skips what it had already yielded).
  A loader that fetches ahead of training (Lightning) hands out more than was trained:
  save ``ds.state_after(last_trained_item)`` instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from .batches import Batch, record_to_batch, to_device  # noqa: F401 (to_device: re-exported, module doc)
from ..parallel.parallel_dims import ROLE_FULL, ROLE_TEXT, ROLE_VISION
from .position import STATE_VERSION, Position  # noqa: F401 (STATE_VERSION: re-exported)
from .sources import ShardSource
from .stream import Stream

log = logging.getLogger("mmfeed_trainer.data")

HF_KEYS = ("input_ids", "attention_mask", "pixel_values", "weight")
"""Tensor keys an item carries (those of the rank's modality)."""


class MicroBatch(dict):
    """An item of ``StreamDataset`` and ``ShardDataset``: a plain dict (module doc) of one whole
    micro-batch. Its type lets ``DataLoader(ds, batch_size=N)`` (forgetting
    ``batch_size=None``) fail with what to do instead of a stack error, or, when the
    micro-batches happen to have equal shapes, silently stacking N of them into one."""


def _refuse_collation(batch, *, collate_fn_map=None):
    raise TypeError(f"data: DataLoader(ds, batch_size={len(batch)}) stacks {len(batch)} items into one, but each "
                    f"item of an mmfeed dataset already is a whole micro-batch (its samples planned together): "
                    f"use DataLoader(ds, batch_size=None, num_workers=0)")


default_collate_fn_map[MicroBatch] = _refuse_collation  # the map torch's default_collate consults by type


def env_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): the arguments, else torchrun's RANK / WORLD_SIZE, else (0, 1)."""
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"data: rank {rank} outside a world of {world} (RANK / WORLD_SIZE)")
    return rank, world


def hf_item(batch: Batch, *, micro_batches: int, device: torch.device | str | None = None,
            normalize: bool = True) -> MicroBatch:
    """An HF-style dict from a typed micro-batch (``batches.Batch``; see the module doc): the
    boundary where the trainer's typed batches become the documented dict items."""
    if device is not None or (normalize and batch.pixel_values is not None):
        batch = batch.to(torch.device(device or "cpu"))
    out = {k: getattr(batch, k) for k in HF_KEYS if getattr(batch, k) is not None}
    if batch.pixel_values is not None and not (device is not None or normalize):
        out["pixel_mean"], out["pixel_std"] = batch.pixel_mean, batch.pixel_std
        out["pixel_shape"], out["pixel_dtype"] = batch.pixel_shape, batch.pixel_dtype
    out.update(ids=batch.ids, epoch=batch.epoch, step=batch.step, micro_batch=batch.micro_batch,
               micro_batches=micro_batches)
    if batch.keep is not None:
        out["keep"] = batch.keep
    return MicroBatch(out)


def weighted_loss(per_sample: torch.Tensor, weight: torch.Tensor, *, group=None,
                  grads_averaged: bool = True) -> torch.Tensor:
    """Σ weight·loss over this rank's rows / the weight summed over the dp ranks.

    ``per_sample``: (B,) losses of this rank's micro-batch (rows of weight 0 are masked, so a
    NaN from an all-padding row cannot leak in); ``weight``: the item's ``weight``. The
    denominator is all-reduced over ``group`` (the dp ranks; default: the whole world when
    torch.distributed is initialised) on the device, so ranks with different sample counts
    give the gradient of one process on the global batch. DDP *averages* gradients over dp:
    with ``grads_averaged`` (the default) the loss is multiplied by the dp size to undo it;
    pass False when your gradients are summed (FSDP with a divide factor of 1, the bundled
    trainer). The returned value is this rank's share: sum it over dp to log the step loss.
    For several micro-batches per step, divide by the step's total weight instead
    (``global_weight``) and sum the micro-batch losses."""
    total = global_weight(weight.to(per_sample.device), group=group)
    return rank_share(per_sample, weight, total, group=group, grads_averaged=grads_averaged)


def global_weight(weight: torch.Tensor, *, group=None) -> torch.Tensor:
    """The weight summed over the dp ranks (all-reduced on the tensor's device), at least 1e-12."""
    total = weight.detach().float().sum()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, group=group)
    return total.clamp_min(1e-12)


def rank_share(per_sample: torch.Tensor, weight: torch.Tensor, total: torch.Tensor, *, group=None,
               grads_averaged: bool = True) -> torch.Tensor:
    """Σ weight·loss over this rank's rows / ``total`` (× dp size with ``grads_averaged``)."""
    w = weight.to(per_sample.device, per_sample.dtype)
    masked = torch.where(w > 0, per_sample, torch.zeros_like(per_sample))
    loss = (masked * w).sum() / total.to(per_sample.dtype)
    if grads_averaged and dist.is_available() and dist.is_initialized():
        loss = loss * dist.get_world_size(group)
    return loss


def state_after(item: dict, plan_hash: str = "") -> dict:
    """The state that resumes right after ``item`` (a yielded micro-batch): for loaders
    that fetch ahead of training (Lightning prefetches one batch), save this for the last
    *trained* item rather than the dataset's ``state_dict()``, which counts what was handed
    out."""
    pos = Position(plan_hash=plan_hash)
    pos.handed_out(item, item["micro_batches"])
    return pos.state()


def _no_workers(kind: str) -> None:
    if get_worker_info() is not None:
        raise RuntimeError(f"data: {kind} must be iterated in the main process: DataLoader(ds, batch_size=None, "
                           f"num_workers=0) (it prefetches in a thread of its own)")


class StreamDataset(IterableDataset):
    """This rank's micro-batches from ``mmfeed serve`` (module doc). ``dp``/``mp``/``placement``
    default to the service's; ``options`` go to ``stream.Stream`` (``prefetch``,
    ``request_timeout_s``, ``wait_s``: how long to wait for a service that is still planning)."""

    def __init__(self, url: str, job: str, *, rank: int | None = None, world_size: int | None = None,
                 dp: int | None = None, mp: int | None = None, placement: str | None = None,
                 device: torch.device | str | None = None, normalize: bool = True, pad_id: int = 0, **options):
        super().__init__()
        self.url, self.job = url, job
        self.rank, self.world_size = env_rank(rank, world_size)
        if dp is None and mp is not None:
            dp = self.world_size // mp
        elif mp is None and dp is not None:
            mp = self.world_size // dp
        if dp is not None and dp * mp != self.world_size:
            raise ValueError(f"data: dp={dp} x mp={mp} != world size {self.world_size}")
        self.dp, self.mp, self.placement = dp, mp, placement
        self.device, self.normalize, self.pad_id, self.options = device, normalize, pad_id, options
        self._pos = Position()
        self._ended = False
        """The last iteration read the job to its end: a new one yields nothing (the service
        may be gone) instead of waiting for it."""
        self.stream: Stream | None = None
        """The client of the running iteration (its ``feedback`` reports step times)."""

    def _open(self) -> Stream:
        opts = dict(self.options, placement=self.placement)
        if self.dp is None:  # layout from the service; guess dp = world until it answers
            dp_rank, mp_rank, dp, mp = self.rank, 0, self.world_size, 1
            opts["global_rank"] = self.rank
        else:
            (dp_rank, mp_rank), dp, mp = divmod(self.rank, self.mp), self.dp, self.mp
        return Stream(self.url, self.job, dp_rank, mp_rank, dp=dp, mp=mp, pad_id=self.pad_id,
                      position=Position(self._pos.epoch, self._pos.next_step).to_dict(), **opts)

    def __iter__(self) -> Iterator[dict]:
        _no_workers("StreamDataset")
        if self._ended:
            return
        stream = self.stream = self._open()
        with stream:
            self._check_plan(stream.source.reply)
            for mb in stream.batches():
                if self._pos.skips(mb.slot):
                    continue  # handed out before the restart; the service redelivered its step
                info = stream.source.epoch_info(mb.epoch)
                self._pos.plan_hash = info.get("plan_hash", "")
                self._pos.handed_out(mb.slot, info["micro_batches"])
                yield hf_item(mb, micro_batches=info["micro_batches"], device=self.device, normalize=self.normalize)
            self._ended = True

    def _check_plan(self, reply: dict) -> None:
        got = reply.get("plan_hash", "")
        if self._pos.plan_hash and got and got != self._pos.plan_hash and reply.get("epoch") == self._pos.epoch:
            log.warning("data: epoch %d's plan changed since the state was saved (plan %s, saved %s: another dp "
                        "size, dataset or configuration); continuing at global step %d", self._pos.epoch, got[:12],
                        self._pos.plan_hash[:12], self._pos.next_step)
        self._pos.plan_hash = got or self._pos.plan_hash

    def close(self) -> None:
        """Stop the running iteration's client (acknowledging the last step if it was handed out
        whole); for a loop that stops before the stream ends."""
        if self.stream is not None:
            self.stream.close()

    def state_dict(self) -> dict:
        """Where the next iteration continues (module doc); plain values."""
        return self._pos.state()

    def state_after(self, item: dict) -> dict:
        """The state that resumes right after ``item`` (see the function ``state_after``)."""
        return state_after(item, self._pos.plan_hash)

    def load_state_dict(self, state: dict) -> None:
        self._pos = Position.from_state(state)
        self._ended = False


class ShardDataset(IterableDataset):
    """This rank's micro-batches from ``mmfeed shard`` output (``rank-NNNNN.arrow`` per dp rank).

    ``mp``/``placement`` say how the world is split (both mp ranks of a dp rank read the same
    file; under modality placement each keeps its modality). ``epochs`` is how many epochs to
    run: by default every epoch the set was planned for (``mmfeed shard --epochs N`` writes one
    index per epoch); more epochs than the set holds run its plans again in turn. Items and
    state as ``StreamDataset``."""

    def __init__(self, directory: str, *, rank: int | None = None, world_size: int | None = None, mp: int = 1,
                 placement: str = "colocated", epochs: int | None = None, device: torch.device | str | None = None,
                 normalize: bool = True, pad_id: int = 0):
        super().__init__()
        self.rank, self.world_size = env_rank(rank, world_size)
        if mp < 1 or self.world_size % mp:
            raise ValueError(f"data: world size {self.world_size} is not a multiple of mp={mp}")
        if placement not in ("colocated", "modality") or (placement == "modality" and mp != 2):
            raise ValueError(f"data: placement {placement!r} with mp={mp}: want colocated, or modality with mp=2")
        self.dp_rank, mp_rank = divmod(self.rank, mp)
        self.role = ROLE_FULL if placement == "colocated" else (ROLE_VISION if mp_rank == 0 else ROLE_TEXT)
        self.source = ShardSource(directory, self.dp_rank)
        self.stored = self.source.epochs()
        self.epochs = len(self.stored) if epochs is None else epochs
        self.device, self.normalize, self.pad_id = device, normalize, pad_id
        self._pos = Position()

    def __iter__(self) -> Iterator[dict]:
        _no_workers("ShardDataset")
        while self._pos.epoch < self.epochs:
            e = self._pos.epoch
            planned = e if e in self.stored else self.stored[e % len(self.stored)]
            for data in self.source.steps(Position(planned, self._pos.next_step).to_dict()):
                if data.epoch != planned:
                    break  # the source goes on into the next stored epoch: one at a time here
                for rec in data.records:
                    mb = record_to_batch(rec, role=self.role, pad_id=self.pad_id).replace(epoch=self._pos.epoch)
                    mb = mb.decoded(self.device or "cpu")  # JPEG sets: on the item's device
                    if self._pos.skips(mb.slot):
                        continue
                    self._pos.handed_out(mb.slot, len(data.records))
                    yield hf_item(mb, micro_batches=len(data.records), device=self.device,
                                  normalize=self.normalize)
            self._pos = Position(self._pos.epoch + 1, plan_hash=self._pos.plan_hash)

    def state_dict(self) -> dict:
        return self._pos.state()

    def state_after(self, item: dict) -> dict:
        return state_after(item)

    def load_state_dict(self, state: dict) -> None:
        self._pos = Position.from_state(state)
