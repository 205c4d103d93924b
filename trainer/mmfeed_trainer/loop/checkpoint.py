"""Checkpoints: model + optimizer + scheduler + stream position; resume from the latest.

Layout under ``ckpt_dir``::

    step-00000040/mp0/            torch.distributed.checkpoint (DCP) of mp rank 0's stage,
    step-00000040/mp1/            saved collectively over its dp group (shards or replicas)
    step-00000040/rank-00003.json per global rank: next step, stream position, scheduler
    latest                        "step-00000040", written by global rank 0 after a barrier

A checkpoint directory is complete once ``latest`` names it (atomic rename), so a rank killed
mid-save leaves the previous checkpoint in force. Every rank must call ``save``/``load``.

Resuming needs the same (dp, mp) layout and the same FSDP/DDP choice, unless the resize is
asked for (``allow_resize``, the trainer's ``--allow-resize``): then dp and the FSDP/DDP choice
may differ and DCP reshards model and optimizer state (a DCP checkpoint stores every tensor by
its global shape and FQN, so DDP replicas and FSDP2 shards load into any dp). mp must stay the
same (the checkpoint holds one DCP directory per mp stage). The per-rank JSON read on a resize
is that of dp rank 0 of this mp rank: its step, stream position and scheduler are the same on
every dp rank.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..parallel.parallel_dims import ParallelDims
from ..parallel.parallelize import unwrap
from ..data.position import Position

LATEST = "latest"


def _step_dir(ckpt_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir, f"step-{step:08d}")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _dcp_kwargs(dims: ParallelDims) -> dict:
    group = dims.dp_group()
    return {"process_group": group} if group is not None else {"no_dist": True}


def save(ckpt_dir: str, *, next_step: int, module: nn.Module, optimizer: torch.optim.Optimizer,
         scheduler, dims: ParallelDims, stream_position: Position | dict, keep: int = 2) -> str:
    """Write the checkpoint of all ranks for resuming at ``next_step``; returns its directory.
    ``stream_position`` is stored in its dict form (``Position.to_dict``). Keeps the ``keep``
    newest checkpoints."""
    path = _step_dir(ckpt_dir, next_step)
    msd, osd = get_state_dict(module, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(path, f"mp{dims.mp_rank}"),
             **_dcp_kwargs(dims))
    if isinstance(stream_position, Position):
        stream_position = stream_position.to_dict()
    extra = {"next_step": next_step, "stream": stream_position, "scheduler": scheduler.state_dict(),
             "dp": dims.dp, "mp": dims.mp, "fsdp": dims.fsdp}
    _write_atomic(os.path.join(path, f"rank-{_rank():05d}.json"), json.dumps(extra))
    _barrier()
    if _rank() == 0:
        _write_atomic(os.path.join(ckpt_dir, LATEST), os.path.basename(path))
        _prune(ckpt_dir, keep)
    _barrier()
    return path


def _prune(ckpt_dir: str, keep: int) -> None:
    """Delete all but the ``keep`` newest complete checkpoints (never the one ``latest`` names)."""
    current = os.path.basename(latest(ckpt_dir) or "")
    names = sorted(n for n in os.listdir(ckpt_dir) if n.startswith("step-") and n <= current)
    for name in names[:-keep] if keep > 0 else []:
        if name != current:
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def latest(ckpt_dir: str) -> str | None:
    """Directory of the newest complete checkpoint, or None."""
    try:
        with open(os.path.join(ckpt_dir, LATEST)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(ckpt_dir, name)


def layout(path: str) -> dict:
    """The layout a checkpoint was written with: ``{"dp", "mp", "fsdp"}`` (global rank 0's JSON)."""
    with open(os.path.join(path, f"rank-{0:05d}.json")) as f:
        extra = json.load(f)
    return {"dp": extra["dp"], "mp": extra["mp"], "fsdp": extra["fsdp"]}


def resume_position(extra: dict) -> Position:
    """The data position to resume at from a checkpoint's extras: the stored stream position
    (``Position.from_dict``), its step defaulting to the checkpoint's ``next_step``."""
    return Position.from_dict({"epoch": 0, "next_step": extra["next_step"], **(extra.get("stream") or {})})


def extras(path: str, dims: ParallelDims, allow_resize: bool = False) -> dict:
    """This rank's extras of the checkpoint at ``path`` (``next_step``, ``stream``, and
    ``resized_from``: the checkpoint's dp when it differs from this run's), read without the
    model: the data position is known before the model is built.

    ValueError when the layout differs and ``allow_resize`` is off, or when mp differs."""
    saved = layout(path)
    here = {"dp": dims.dp, "mp": dims.mp, "fsdp": dims.fsdp}
    if saved != here:
        if not allow_resize or saved["mp"] != dims.mp:
            hint = ("mp cannot change on resume (one DCP directory per mp stage)" if saved["mp"] != dims.mp
                    else "pass --allow-resize to reshard model and optimizer onto this layout")
            raise ValueError(f"checkpoint {path} was written with dp, mp, fsdp = "
                             f"{(saved['dp'], saved['mp'], saved['fsdp'])}; this run has "
                             f"{(dims.dp, dims.mp, dims.fsdp)}: {hint}")
    own = os.path.join(path, f"rank-{_rank():05d}.json")
    if saved["dp"] != dims.dp or not os.path.exists(own):
        own = os.path.join(path, f"rank-{dims.mp_rank:05d}.json")  # dp rank 0 of this mp rank
    with open(own) as f:
        extra = json.load(f)
    if saved["dp"] != dims.dp:
        extra["resized_from"] = saved["dp"]
    return extra


def load(path: str, *, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
         dims: ParallelDims, allow_resize: bool = False) -> dict:
    """Restore this rank's state from ``path`` (resharded by DCP when the dp differs and
    ``allow_resize`` is on); returns its extras (see ``extras``)."""
    extra = extras(path, dims, allow_resize)
    msd, osd = get_state_dict(module, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(path, f"mp{dims.mp_rank}"), **_dcp_kwargs(dims))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(extra["scheduler"])
    return extra


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU copy of this rank's stage parameters, named as in ``MMModel``.

    Collective over dp under FSDP2 (every dp rank must call it)."""
    out = {}
    for name, value in unwrap(module).state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        out[name] = value.detach().cpu().clone()
    return out


def _write_atomic(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

