"""The training loop under pipeline parallelism (``--pp > 1``): ``train.run`` hands over here.

Stage 0 of each dp replica is the only rank with a data source: it registers with the
service (``pp`` in its layout), prefetches, acknowledges and reports feedback. Every stage
runs the same loop; ``pp.stage.train_step`` tells the later stages how many micro-batches
the step has, or that the data ended. ``--ckpt-dir`` saves every stage and resumes in the same
layout (``pp_checkpoint``; stage 0 keeps the data position). MFU is left out of the summary.
What pp does not support is refused up front by ``validate_pipeline``, naming what it does.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist

from . import checkpoint, pp_checkpoint
from ..models import config
from ..parallel.pp import stage as pp_stage
from ..models.model import MMModel
from ..parallel.optim import build_optimizer
from ..parallel.parallel_dims import ParallelDims
from ..parallel.parallelize import ParallelConfig
from ..data.position import Position
from ..data.prefetch import Prefetcher
from .common import (Meter, RunResult, TrainConfig, Window, append_ids, global_loss, load_pretrained, log,
                     log_progress, make_source, maybe_fault, register, setup_distributed)


def run_pipeline(cfg: TrainConfig) -> RunResult:
    """``train.run`` for pp > 1 (one rank of a dp x pp torchrun world)."""
    world, device = setup_distributed()
    dims = ParallelDims(dp=cfg.dp, mp=cfg.mp, pp=cfg.pp, world_size=world, fsdp=cfg.fsdp)
    dims.build_mesh(device.type)
    bf16 = cfg.bf16 if cfg.bf16 is not None else (device.type == "cuda" and not cfg.mixed_precision)
    mcfg = config.model_config(cfg.model, **({"text_post_norm": True} if cfg.init_text else {}))
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        model = MMModel(mcfg)
    load_pretrained(model, cfg)
    module = pp_stage.parallelize_pipeline(
        model, dims=dims, device=device,
        cfg=ParallelConfig(fsdp=cfg.fsdp, ac=cfg.ac, compile=cfg.compile, compile_backend=cfg.compile_backend,
                           mixed_precision=cfg.mixed_precision, cpu_offload=cfg.cpu_offload))
    runner = pp_stage.Runner(module, dims=dims, device=device,
                             cfg=pp_stage.PipelineConfig(schedule=cfg.pp_schedule, pack=cfg.pack))
    optimizer, scheduler = build_optimizer(module, cfg.optim)
    start, position = 0, Position()
    resume = checkpoint.latest(cfg.ckpt_dir) if cfg.ckpt_dir else None
    if resume:
        extra = pp_checkpoint.load(resume, module=module, optimizer=optimizer, scheduler=scheduler, dims=dims)
        start, position = extra["next_step"], checkpoint.resume_position(extra)
        log.info("resumed from %s at step %d (data position %s)", resume, start, position.to_dict())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    source = prefetcher = None
    if dims.first_stage:  # the only stage that receives data
        source = make_source(cfg, dims)
        register(source, position, resume, cfg.pack)
        prefetcher = Prefetcher(source, position=position.to_dict(), role=dims.role,
                                pad_id=mcfg.pad_token_id, device=device, vocab_size=mcfg.vocab_size,
                                depth=cfg.prefetch, pack=cfg.pack, patch_size=mcfg.patch_size,
                                check_pack=not cfg.synthetic)
    losses, meter, all_meter = [], Meter(), Meter()
    step = start
    window = Window(device)  # one synchronize per log step on CUDA, as train.run

    def report() -> None:  # the figures of the window's steps: feedback (stage 0), meters
        for index, data, done, waited, compute, _ in window.close():
            if data is not None:
                source.feedback(data, compute_seconds=done.compute_seconds, data_wait_seconds=waited,
                                samples=done.samples)
            meter.add(compute, waited, done.samples, 0.0)
            if index - start >= cfg.metrics_skip:
                all_meter.add(compute, waited, done.samples, 0.0)

    try:
        while step < cfg.steps:
            maybe_fault(step)
            host, mbs, waited = None, None, 0.0
            if prefetcher is not None:
                try:
                    host, waited = prefetcher.next()
                    mbs = host.ready()
                except StopIteration:
                    mbs = []  # tells the other stages the data ended
            t0 = time.perf_counter()
            stats = pp_stage.train_step(runner, optimizer, scheduler, mbs, max_grad_norm=cfg.optim.max_grad_norm,
                                        autocast=autocast)
            if stats is None:
                log.info("end of data at step %d", step)
                break
            window.add(step, host.data if host is not None else None, stats, waited, time.perf_counter() - t0, 0.0)
            if host is not None:
                source.ack(host.data)
                if cfg.log_ids:
                    append_ids(cfg.log_ids, dims, host)
            step += 1
            log_step = step % cfg.log_every == 0 or step == cfg.steps
            if window.due(log_step or step - start == cfg.metrics_skip):
                report()
            if log_step:
                loss = global_loss(stats, dims)
                losses.append(loss)
                log_progress(step, loss, stats, meter.summary(dims, device, None), scheduler)
                meter.reset()
            if cfg.ckpt_dir and cfg.ckpt_every and step % cfg.ckpt_every == 0:
                _save(cfg, step, module, optimizer, scheduler, dims, source)
        if window.due(True):  # the end of the data before a log step
            report()
    finally:
        if prefetcher is not None:
            prefetcher.close()
    if cfg.ckpt_dir and step > start and not (cfg.ckpt_every and step % cfg.ckpt_every == 0):
        _save(cfg, step, module, optimizer, scheduler, dims, source)
    if cfg.save_params:
        _save_stage_params(cfg.save_params, module, dims)
    if source is not None:
        source.close()
    return RunResult(steps_done=step - start, final_step=step, losses=losses,
                     metrics=all_meter.summary(dims, device, None))


def _save(cfg: TrainConfig, step: int, module, optimizer, scheduler, dims: ParallelDims, source) -> None:
    pp_checkpoint.save(cfg.ckpt_dir, next_step=step, module=module, optimizer=optimizer, scheduler=scheduler,
                       dims=dims, stream_position=source.position() if source is not None else None)


def _save_stage_params(directory: str, module, dims: ParallelDims) -> None:
    from .checkpoint import full_model_state
    state = full_model_state(module)
    if dims.dp_rank == 0:
        os.makedirs(directory, exist_ok=True)
        torch.save(state, os.path.join(directory, f"params-pp{dims.pp_rank}.pt"))
    if dist.is_initialized():
        dist.barrier()
