"""Checkpoints under pipeline parallelism (``--pp > 1``): save and resume every stage.

Layout under ``ckpt_dir`` (the same step directories and ``latest`` as ``checkpoint``)::

    step-00000040/pp/             one DCP checkpoint written by the whole dp x pp world
    step-00000040/rank-00003.json per global rank: next step, stream position (stage 0 only),
                                  scheduler, and the layout {dp, mp, pp, fsdp}
    latest                        "step-00000040", written by global rank 0 after a barrier

One DCP checkpoint holds every stage: a stage's parameter names are those of ``MMModel``
(``parallel.pp.stage.PipelineStage``), so the stages' names are disjoint, and dp replicas (or FSDP2
shards) of a stage write one copy. The optimizer state is flattened to one entry per
parameter name (``flatten_optimizer_state_dict``) so that the stages' param groups, which name
different parameters, do not collide either.

Resuming needs the same layout (dp, pp, fsdp; mp is 1 under pp): a change is refused with the
layout of both, as is a pipelined checkpoint in a run without ``--pp`` (``refuse_pipelined``)
and the other way round. The data position is stage 0's (the only stage with a source).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from .checkpoint import _prune, _step_dir, _write_atomic, latest  # noqa: F401 (latest: re-exported)
from ..parallel.parallel_dims import ParallelDims
from ..data.position import Position

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
_DCP_DIR = "pp"


def _layout(dims: ParallelDims) -> dict:
    return {"dp": dims.dp, "mp": dims.mp, "pp": dims.pp, "fsdp": dims.fsdp}


def _rank_file(path: str, rank: int) -> str:
    return os.path.join(path, f"rank-{rank:05d}.json")


def save(ckpt_dir: str, *, next_step: int, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
         dims: ParallelDims, stream_position: Position | dict | None, keep: int = 2) -> str:
    """Write every stage's checkpoint for resuming at ``next_step`` (all ranks call it);
    ``stream_position``: stage 0's source position (None on the other stages)."""
    path = _step_dir(ckpt_dir, next_step)
    msd, osd = get_state_dict(module, optimizer, options=_OPTIONS)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(path, _DCP_DIR))
    if isinstance(stream_position, Position):
        stream_position = stream_position.to_dict()
    extra = {"next_step": next_step, "stream": stream_position, "scheduler": scheduler.state_dict(), **_layout(dims)}
    _write_atomic(_rank_file(path, dist.get_rank()), json.dumps(extra))
    dist.barrier()
    if dist.get_rank() == 0:
        _write_atomic(os.path.join(ckpt_dir, "latest"), os.path.basename(path))
        _prune(ckpt_dir, keep)
    dist.barrier()
    return path


def _saved_layout(path: str) -> dict:
    with open(_rank_file(path, 0)) as f:
        extra = json.load(f)
    return {"dp": extra["dp"], "mp": extra["mp"], "pp": extra.get("pp", 1), "fsdp": extra["fsdp"]}


def refuse_pipelined(path: str) -> None:
    """ValueError when the checkpoint at ``path`` was written with --pp > 1 (for a run without pp)."""
    saved = _saved_layout(path)
    if saved["pp"] > 1:
        raise ValueError(f"checkpoint {path} was written with --pp {saved['pp']}: resume it with the same "
                         f"--dp {saved['dp']} --pp {saved['pp']}{' --fsdp' if saved['fsdp'] else ''} "
                         f"(a pipelined checkpoint does not load into another layout)")


def extras(path: str, dims: ParallelDims) -> dict:
    """This rank's extras (``next_step``, ``stream``, ``scheduler``); ValueError unless the
    checkpoint's layout is this run's."""
    saved, here = _saved_layout(path), _layout(dims)
    if saved != here:
        raise ValueError(f"checkpoint {path} was written with dp, mp, pp, fsdp = "
                         f"{tuple(saved.values())}; this run has {tuple(here.values())}: under --pp a checkpoint "
                         f"resumes only in the layout it was written with (--allow-resize is not supported with "
                         f"--pp > 1)")
    with open(_rank_file(path, dist.get_rank())) as f:
        return json.load(f)


def load(path: str, *, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
         dims: ParallelDims) -> dict:
    """Restore this stage's model, optimizer and scheduler from ``path``; returns its extras."""
    extra = extras(path, dims)
    msd, osd = get_state_dict(module, optimizer, options=_OPTIONS)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(path, _DCP_DIR))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_OPTIONS)
    scheduler.load_state_dict(extra["scheduler"])
    return extra
