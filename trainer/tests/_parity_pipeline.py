"""Parity harness for pipeline parallelism: a dp x pp world (gloo, one process per rank)
trains every scenario in turn and saves each stage's full parameters; the reference is
``_parity.reference_run`` on the same synthetic global batches."""

from __future__ import annotations

import dataclasses
import os

import torch
from mmfeed_trainer.parallel import blockwrap, optim
from mmfeed_trainer.parallel.pp import stage as pp_stage
from mmfeed_trainer.data import synthetic
from mmfeed_trainer.loop.checkpoint import full_model_state
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ParallelConfig

import _parity

MICRO_BATCHES = 3
"""Three slots: 1F1B on 2 stages then has a warm-up, a steady phase and a cool-down."""
OPTIONS = {"": {}, "offload-acfull": {"cpu_offload": True, "ac": "full"}, "bf16-acsel": {"mixed_precision": True,
                                                                                       "ac": "selective"}}
"""A scenario's optional fifth element: ``ParallelConfig`` options on top of its fsdp."""


def synth_cfg(dp: int) -> synthetic.SynthConfig:
    return dataclasses.replace(_parity.synth_cfg(dp), micro_batches=MICRO_BATCHES)


def scenario_name(schedule: str, fsdp: bool, dtype: torch.dtype, pack: bool, options: str = "") -> str:
    return (f"{schedule}-{'fsdp' if fsdp else 'ddp'}-{str(dtype).removeprefix('torch.')}{'-packed' if pack else ''}"
            f"{'-' + options if options else ''}")


def worker(rank: int, world: int, dp: int, pp: int, scenarios: list[tuple], outdir: str) -> None:
    """Train every scenario (schedule, fsdp, dtype, pack[, options]) on a dp x pp world."""
    cpu = _parity.CPU
    for schedule, fsdp, dtype, pack, *rest in scenarios:
        options = rest[0] if rest else ""
        dims = ParallelDims(dp=dp, pp=pp, world_size=world, fsdp=fsdp)
        dims.build_mesh("cpu")
        torch.manual_seed(_parity.SEED)
        model = MMModel(_parity.model_cfg()).to(dtype)
        module = pp_stage.parallelize_pipeline(model, dims=dims, cfg=ParallelConfig(fsdp=fsdp, **OPTIONS[options]),
                                               device=cpu)
        block_dtypes = []
        for block in blockwrap.blocks(module):
            block.register_forward_pre_hook(lambda _m, args: block_dtypes.append(str(args[0].dtype)))
        runner = pp_stage.Runner(module, dims=dims, cfg=pp_stage.PipelineConfig(schedule=schedule, pack=pack),
                                 device=cpu)
        ocfg = _parity.optim_cfg()
        opt, sched = optim.build_optimizer(module, ocfg)
        scfg = synth_cfg(dp)
        step_losses, norms = [], []
        for step in range(_parity.STEPS):
            mbs = None
            if dims.first_stage:  # only stage 0 reads data
                mbs = [_parity._batch(r, "full", dtype, pack) for r in synthetic.step_records(scfg, step, dims.dp_rank)]
            stats = pp_stage.train_step(runner, opt, sched, mbs, max_grad_norm=ocfg.max_grad_norm)
            loss = stats.loss.clone()
            torch.distributed.all_reduce(loss, group=dims.dp_group())
            step_losses.append(float(loss))
            norms.append(float(stats.grad_norm))
        assert pp_stage.train_step(runner, opt, sched, [] if dims.first_stage else None,
                                   max_grad_norm=ocfg.max_grad_norm) is None, "end of data must stop every stage"
        param_dtypes = sorted({str(p.dtype) for p in module.parameters()})
        state = full_model_state(module)
        if dims.dp_rank == 0:
            torch.save({"params": state, "losses": step_losses, "grad_norms": norms,
                        "block_dtypes": sorted(set(block_dtypes)), "param_dtypes": param_dtypes},
                       os.path.join(outdir, f"{scenario_name(schedule, fsdp, dtype, pack, options)}-pp{dims.pp_rank}.pt"))
        torch.distributed.barrier()


def load_run(outdir: str, pp: int, schedule: str, fsdp: bool, dtype: torch.dtype, pack: bool, options: str = "",
             dtypes: dict | None = None):
    """The stages' parameters merged (each must hold a disjoint part), the losses of stage 0
    and the grad norms of every stage; ``dtypes`` (a dict) receives every stage's
    ``block_dtypes`` (what the blocks computed in) and ``param_dtypes`` (the sharded parameters)."""
    params: dict[str, torch.Tensor] = {}
    step_losses, norms = None, []
    for s in range(pp):
        saved = torch.load(os.path.join(outdir, f"{scenario_name(schedule, fsdp, dtype, pack, options)}-pp{s}.pt"))
        if dtypes is not None:
            for key in ("block_dtypes", "param_dtypes"):
                dtypes[key] = sorted(set(dtypes.get(key, [])) | set(saved[key]))
        overlap = set(params) & set(saved["params"])
        assert not overlap, f"stages {s} and an earlier one both hold {sorted(overlap)[:3]}"
        params.update(saved["params"])
        step_losses = step_losses or saved["losses"]
        norms.append(saved["grad_norms"])
    return params, step_losses, norms
