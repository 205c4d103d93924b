"""The training loop: set up the mesh, build and parallelize the model, stream steps, train,
report, checkpoint, resume. ``__main__.py`` parses flags into a ``TrainConfig``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings

import torch

from . import checkpoint
from ..models import config
from ..models.model import MMModel, flops_per_sample
from ..data.batches import Batch
from ..parallel.optim import build_optimizer
from ..parallel.parallel_dims import ParallelDims
from ..parallel.parallelize import ParallelConfig, parallelize
from .pp_checkpoint import refuse_pipelined
from ..data.position import Position
from ..data.prefetch import Prefetcher
from ..parallel.step import train_step
from .common import (FAULT_ENV, Meter, RunResult, TrainConfig, Window, append_ids, check_pack, global_loss,
                     load_pretrained, log, log_progress, maybe_fault, register, setup_distributed)
from .common import make_source as _make_source  # the name scripts/e2e_rank.py wraps to time the source


def _check_resizable(cfg: TrainConfig, path: str, saved_dp: int) -> None:
    """ValueError when the data source cannot follow a dp change: shards are planned for one dp."""
    if cfg.shards:
        raise ValueError(f"train: checkpoint {path} was written at dp {saved_dp}, this run has dp {cfg.dp}: "
                         f"shards are planned for one dp (mmfeed shard --dp); resume at another dp from "
                         f"the service (mmfeed serve --allow-resize), or write shards for dp {cfg.dp}")


def _batch_flops(mcfg: config.ModelConfig, micro_batches: list[Batch]) -> float:
    """Model FLOPs of the live samples (host tensors of a rank that sees both modalities)."""
    total = 0.0
    for mb in micro_batches:
        live = (mb.weight > 0).tolist()
        text = mb.lengths.tolist() if mb.lengths is not None else [0] * len(live)
        shape = mb.pixel_shape
        grid = (shape[:, 1] // mcfg.patch_size * (shape[:, 2] // mcfg.patch_size)).tolist() if shape is not None \
            else [0] * len(live)
        total += sum(flops_per_sample(mcfg, t, g) for t, g, ok in zip(text, grid, live) if ok)
    return total


_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def _peak_flops(cfg: TrainConfig, device: torch.device) -> float | None:
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for key, tf in _PEAK_TFLOPS.items() if key in name), None)


def run(cfg: TrainConfig) -> RunResult:
    """Train per ``cfg`` in this process (one rank of a torchrun world); returns a summary."""
    cfg.validate()
    if cfg.pp > 1:
        from .train_pp import run_pipeline
        return run_pipeline(cfg)
    world, device = setup_distributed()
    peak_flops = _peak_flops(cfg, device)
    dims = ParallelDims(dp=cfg.dp, mp=cfg.mp, world_size=world, fsdp=cfg.fsdp)
    dims.build_mesh(device.type)
    # Autocast is redundant under the FSDP2 bf16 policy: "auto" turns it off there.
    bf16 = cfg.bf16 if cfg.bf16 is not None else (device.type == "cuda" and not cfg.mixed_precision)
    start, position = 0, Position()
    resume = checkpoint.latest(cfg.ckpt_dir) if cfg.ckpt_dir else None
    source = _make_source(cfg, dims)
    if resume:
        refuse_pipelined(resume)
        extra = checkpoint.extras(resume, dims, cfg.allow_resize)
        start = extra["next_step"]
        position = checkpoint.resume_position(extra)
        if "resized_from" in extra:
            _check_resizable(cfg, resume, extra["resized_from"])
    register(source, position, resume, cfg.pack)
    mcfg = config.model_config(cfg.model, **({"text_post_norm": True} if cfg.init_text else {}))
    if cfg.resize_vocab:
        mcfg = resized_vocab(mcfg, source.data_vocab())
    torch.manual_seed(cfg.seed)
    with torch.device(device):  # init on the GPU directly (same seed, same values on every rank)
        model = MMModel(mcfg)
    load_pretrained(model, cfg)
    module = parallelize(model, dims=dims, device=device,
                         cfg=ParallelConfig(fsdp=cfg.fsdp, ac=cfg.ac, compile=cfg.compile, compile_backend=cfg.compile_backend,
                                            mixed_precision=cfg.mixed_precision, cpu_offload=cfg.cpu_offload,
                                            exchange_dtype=torch.bfloat16 if bf16 or cfg.mixed_precision
                                            else torch.float32))
    optimizer, scheduler = build_optimizer(module, cfg.optim)
    if resume:
        checkpoint.load(resume, module=module, optimizer=optimizer, scheduler=scheduler, dims=dims,
                        allow_resize=cfg.allow_resize)
        if "resized_from" in extra:
            log.info("resized: checkpoint dp %d, this run dp %d (model and optimizer resharded by DCP)",
                     extra["resized_from"], dims.dp)
        log.info("resumed from %s at step %d (data position %s)", resume, start, position.to_dict())
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext())
    prefetcher = Prefetcher(source, position=position.to_dict(), role=dims.role, pad_id=mcfg.pad_token_id, device=device,
                            vocab_size=mcfg.vocab_size,
                            depth=cfg.prefetch, pack=cfg.pack, patch_size=mcfg.patch_size,
                            check_pack=not cfg.synthetic)
    losses, meter, all_meter = [], Meter(), Meter()
    step, last, warmup_s = start, None, 0.0
    window = Window(device)

    def report() -> None:  # the figures of the window's steps: feedback, meters
        nonlocal warmup_s
        for index, data, done_stats, waited, compute, flops in window.close():
            source.feedback(data, compute_seconds=done_stats.compute_seconds, data_wait_seconds=waited,
                            samples=done_stats.samples)
            meter.add(compute, waited, done_stats.samples, flops)
            if index - start >= cfg.metrics_skip:
                all_meter.add(compute, waited, done_stats.samples, flops)
            else:
                warmup_s += compute + waited

    try:
        while step < cfg.steps:
            maybe_fault(step)
            try:
                host, waited = prefetcher.next()
            except StopIteration:
                log.info("end of data at step %d", step)
                break
            here = (host.data.epoch, host.data.step)
            if last is not None and here <= last:
                raise RuntimeError(f"train: the source gave (epoch, step) {here} after {last}")
            last = here
            t0 = time.perf_counter()
            mbs = host.ready()
            stats = train_step(module, optimizer, scheduler, mbs, dims=dims, device=device,
                               max_grad_norm=cfg.optim.max_grad_norm, autocast=autocast)
            flops = _batch_flops(mcfg, host.host_batches) if peak_flops and dims.mp == 1 else 0.0
            window.add(step, host.data, stats, waited, time.perf_counter() - t0, flops)
            source.ack(host.data)
            if cfg.log_ids:
                append_ids(cfg.log_ids, dims, host)
            step += 1
            log_step = step % cfg.log_every == 0 or step == cfg.steps
            if window.due(log_step or step - start == cfg.metrics_skip):
                report()
            if log_step:
                loss = global_loss(stats, dims)
                if loss is not None:
                    losses.append(loss)
                log_progress(step, loss, stats, meter.summary(dims, device, peak_flops), scheduler)
                meter.reset()
            if cfg.ckpt_dir and cfg.ckpt_every and step % cfg.ckpt_every == 0:
                checkpoint.save(cfg.ckpt_dir, next_step=step, module=module, optimizer=optimizer,
                                scheduler=scheduler, dims=dims, stream_position=source.position())
        if window.due(True):  # the end of the data before a log step
            report()
    finally:
        prefetcher.close()
    if cfg.ckpt_dir and step > start and not (cfg.ckpt_every and step % cfg.ckpt_every == 0):
        checkpoint.save(cfg.ckpt_dir, next_step=step, module=module, optimizer=optimizer,
                        scheduler=scheduler, dims=dims, stream_position=source.position())
    if cfg.save_params:
        _save_params(cfg.save_params, module, dims)
    source.close()
    metrics = all_meter.summary(dims, device, peak_flops)
    # the steps left out (compile, autotuning, allocator warm-up): what the figures do not show
    metrics["warmup_s"] = warmup_s
    if device.type == "cuda":
        metrics["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return RunResult(steps_done=step - start, final_step=step, losses=losses, metrics=metrics)


def resized_vocab(mcfg: config.ModelConfig, data_vocab: int | None) -> config.ModelConfig:
    """``mcfg`` with its vocabulary grown to the data tokenizer's ``data_vocab`` when that is
    larger (``--resize-vocab``); unchanged when it fits or is unknown (with a warning then)."""
    if data_vocab is None:
        warnings.warn("train: --resize-vocab is ignored: the data does not say its tokenizer's vocabulary "
                      "size (schema metadata mmfeed.vocab_size)", stacklevel=2)
        return mcfg
    if data_vocab <= mcfg.vocab_size:
        return mcfg
    log.info("text embedding resized from %d to the data tokenizer's %d ids (--resize-vocab)",
             mcfg.vocab_size, data_vocab)
    return dataclasses.replace(mcfg, vocab_size=data_vocab)


def _save_params(directory: str, module, dims: ParallelDims) -> None:
    state = checkpoint.full_model_state(module)
    if dims.dp_rank == 0:
        os.makedirs(directory, exist_ok=True)
        torch.save(state, os.path.join(directory, f"params-mp{dims.mp_rank}.pt"))
