"""The training loop: set up the mesh, build and parallelize the model, stream steps, train,
report, checkpoint, resume. ``__main__.py`` parses flags into a ``TrainConfig``."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import checkpoint, config
from .synthetic import SynthConfig
from .model import MMModel, flops_per_sample
from .batches import Batch
from .natsauth import NatsAuth
from .optim import build_optimizer
from .parallel_dims import ParallelDims, backend_for
from .parallelize import ParallelConfig, parallelize
from .pipeline_ckpt import refuse_pipelined
from .position import Position
from .prefetch import Prefetcher
from .sources import ShardSource, Source, SyntheticSource
from .step import train_step

log = logging.getLogger("mmfeed_trainer")

FAULT_ENV = "MMFEED_FAULT"
"""Test hook: "rank=R,step=S" makes global rank R kill itself (SIGKILL) before step S."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything a run needs; flags of ``python -m mmfeed_trainer`` map 1:1 onto fields."""

    model: str = "tiny"
    """Model preset: tiny (CPU) or base (GPU)."""
    dp: int = 1
    mp: int = 1
    pp: int = 1
    """Pipeline stages (``pipeline``): > 1 splits each tower's blocks over pp ranks."""
    pp_schedule: str = "1f1b"
    """Pipeline schedule: 1f1b or gpipe."""
    fsdp: bool = False
    """Shard parameters over dp with FSDP2 instead of DDP."""
    pack: bool = False
    """Pack every micro-batch (``batches.pack``) instead of padding it. The service's or the
    shards' plan must say the same (register reply / ``mmfeed.pack`` schema metadata)."""
    steps: int = 100
    """Steps to train (stops earlier at the end of the data)."""
    seed: int = 0
    """Seed of the model init (and of the synthetic data)."""
    nats: str | None = None
    """NATS URL of the service; the stream source."""
    job: str = "demo"
    """Job name on the service."""
    nats_auth: NatsAuth | None = None
    """Credentials and TLS for the NATS connection (``natsauth``; paths may hold {dp}, {mp})."""
    shards: str | None = None
    """Directory of ``mmfeed shard`` output; the shard source."""
    synthetic: bool = False
    """Train on generated batches (benchmarks, gpu-check)."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    ckpt_dir: str | None = None
    """Checkpoint directory; the run resumes from its latest checkpoint when there is one."""
    ckpt_every: int = 0
    """Checkpoint every N steps (0: only at the end when ckpt_dir is set)."""
    allow_resize: bool = False
    """Resume a checkpoint written at another dp (or with the other FSDP/DDP choice): DCP
    reshards model and optimizer; the service replans the rest of the epoch for the new dp
    (``mmfeed serve --allow-resize``). Without it a layout change is refused."""
    log_every: int = 10
    bf16: bool | None = None
    """bf16 autocast; None = on when CUDA is available."""
    optim: config.OptimConfig = field(default_factory=config.OptimConfig)
    prefetch: int = 2
    """Steps converted ahead of the current one."""
    save_params: str | None = None
    """Write the final full parameters of each mp rank to this directory (tests, parity)."""
    metrics_skip: int = 0
    """Leave the first N steps (warm-up, autotuning) out of the run's summary metrics; their
    seconds are its ``warmup_s``."""
    peak_tflops: float | None = None
    """Peak dense bf16 TFLOP/s of one device, for MFU; None = guess from the CUDA device name."""
    ac: str = "none"
    """Activation checkpointing per block: none, selective or full (``blockwrap``)."""
    compile: bool = False
    """torch.compile every transformer block."""
    compile_backend: str = "inductor"
    """torch.compile backend (the CPU dry run of gpu-check uses eager: tracing only)."""
    mixed_precision: bool = False
    """FSDP2 MixedPrecisionPolicy (bf16 compute, fp32 reduce and master weights); needs fsdp, dp > 1."""
    cpu_offload: bool = False
    """FSDP2 CPUOffloadPolicy (parameters, gradients, optimizer state in host memory)."""
    init_vision: str | None = None
    """HuggingFace ViT safetensors checkpoint to initialise the vision tower from (``pretrained``)."""
    init_text: str | None = None
    """HuggingFace BERT safetensors checkpoint for the text tower (makes its blocks post-norm)."""
    resize_vocab: bool = False
    """Grow the text embedding to the data tokenizer's vocabulary (``mmfeed.vocab_size`` schema
    metadata; the register reply on the stream) when it is larger than the model's; the new rows
    are initialised like the others (after ``init_text``'s rows where a checkpoint is loaded)."""
    log_ids: str | None = None
    """Append the live sample ids of every consumed step to ``<dir>/ids-rank<R>.jsonl`` (one
    JSON line per step and rank: epoch, step, dp_rank, mp_rank, ids per micro-batch)."""

    def validate(self) -> None:
        sources = sum(x is not None and x is not False for x in (self.nats, self.shards, self.synthetic or None))
        if sources != 1:
            raise ValueError("train: give exactly one data source: --nats URL, --shards DIR or --synthetic")
        if self.steps <= 0:
            raise ValueError(f"train: --steps must be > 0, got {self.steps}")
        if self.ckpt_every < 0 or self.log_every <= 0:
            raise ValueError("train: --ckpt-every must be >= 0 and --log-every > 0")
        config.model_config(self.model)
        self.optim.validate()
        ParallelDims(dp=self.dp, mp=self.mp, pp=self.pp, world_size=self.dp * self.pp * self.mp)  # the layout alone
        if self.pp > 1:
            from .train_pipeline import validate_pipeline
            validate_pipeline(self)
        ParallelConfig(fsdp=self.fsdp, ac=self.ac, mixed_precision=self.mixed_precision,
                       cpu_offload=self.cpu_offload).validate(self.dp)
        if self.fsdp and self.dp == 1:
            warnings.warn("train: --fsdp is ignored with dp = 1 (nothing to shard over)", stacklevel=2)
        if self.ckpt_every and not self.ckpt_dir:
            warnings.warn("train: --ckpt-every is ignored without --ckpt-dir", stacklevel=2)
        if self.job != "demo" and not self.nats:
            warnings.warn("train: --job is ignored without --nats", stacklevel=2)


@dataclass(slots=True)
class RunResult:
    steps_done: int
    final_step: int
    losses: list[float]
    metrics: dict


def _setup_distributed() -> tuple[int, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend_for(device), timeout=datetime.timedelta(seconds=300),
                                device_id=device if device.type == "cuda" else None)
    return world, device


def check_pack(planned: bool, packing: bool, who: str) -> None:
    """ValueError unless the plan's --pack (``planned``) equals this trainer's."""
    if planned != packing:
        mode = {True: "packed", False: "padded"}
        raise ValueError(f"train: {who} planned {mode[planned]} micro-batches (mmfeed --pack={str(planned).lower()}), "
                         f"this trainer runs {mode[packing]} ones: pass --pack to both or to neither")


def register(source: Source, position: Position, resume: str | None, pack: bool) -> None:
    """Register with the service (a source that has one) at ``position``; ValueError when the
    service's plan is not the one the checkpoint ``resume`` was taken on, or its --pack differs."""
    if not hasattr(source, "register"):
        return
    reply = source.register(position.to_dict())
    saved_hash = position.plan_hash
    if saved_hash and saved_hash != reply.get("plan_hash"):
        raise ValueError(f"train: checkpoint {resume} was taken on plan {saved_hash}, the service now "
                         f"serves plan {reply.get('plan_hash')}: same dataset, seed and layout needed")
    check_pack(bool(reply.get("pack", False)), pack, "the service")


def _make_source(cfg: TrainConfig, dims: ParallelDims) -> Source:
    if cfg.shards:
        return ShardSource(cfg.shards, dims.dp_rank)
    if cfg.synthetic:
        return SyntheticSource(cfg.synth, dims.dp_rank)
    from .stream import StreamSource
    return StreamSource(url=cfg.nats, job=cfg.job, dims=dims, auth=cfg.nats_auth)


def _check_resizable(cfg: TrainConfig, path: str, saved_dp: int) -> None:
    """ValueError when the data source cannot follow a dp change: shards are planned for one dp."""
    if cfg.shards:
        raise ValueError(f"train: checkpoint {path} was written at dp {saved_dp}, this run has dp {cfg.dp}: "
                         f"shards are planned for one dp (mmfeed shard --dp); resume at another dp from "
                         f"the service (mmfeed serve --allow-resize), or write shards for dp {cfg.dp}")


def _maybe_fault(step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = dict(kv.split("=", 1) for kv in spec.split(","))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if int(parts["rank"]) == rank and int(parts["step"]) == step:
        log.warning("fault injection: rank %d kills itself before step %d", rank, step)
        os.kill(os.getpid(), signal.SIGKILL)


class _Meter:
    """Per-step timings and throughput, averaged between log lines."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.steps, self.compute, self.wait, self.samples, self.flops = 0, 0.0, 0.0, 0, 0.0

    def add(self, compute: float, wait: float, samples: int, flops: float):
        self.steps += 1
        self.compute += compute
        self.wait += wait
        self.samples += samples
        self.flops += flops

    def summary(self, dims: ParallelDims, device: torch.device, peak_flops: float | None) -> dict:
        """Averages of this rank; samples/s and MFU over all dp ranks (a collective over dp).

        MFU = model FLOPs of the live samples / (time x peak x devices); mp = 1 only, since a
        modality rank does not see the other modality's token counts."""
        total = self.compute + self.wait
        agg = torch.tensor([float(self.samples), self.flops], dtype=torch.float64, device=device)
        if dims.dp_group() is not None:
            dist.all_reduce(agg, group=dims.dp_group())
        samples, flops = agg.tolist()
        out = {"step_time_s": total / max(self.steps, 1), "compute_s": self.compute / max(self.steps, 1),
               "data_wait_fraction": self.wait / total if total else 0.0,
               "samples_per_s": samples / total if total else 0.0}
        if peak_flops and dims.mp == 1:
            out["mfu"] = flops / total / (peak_flops * dims.dp) if total else 0.0
        return out


class _Window:
    """The steps trained since the device was last synchronized. On CUDA a step's figures --
    its wall time and the clock's events (``StepStats.compute_seconds``) -- need a
    synchronize, so the loop closes the window only at log steps, at the end of the warm-up
    (``metrics_skip``) and at the end, one synchronize for all its steps; the step itself
    never waits for the device (docs/trainer.md, "No host syncs in the step"). On the CPU
    every step closes at once (nothing to wait for). A step's wall time is the host time of
    its ``train_step`` call plus an equal share of the wait in that synchronize."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.steps: list[tuple] = []

    def add(self, index: int, data, stats, waited: float, seconds: float, flops: float) -> None:
        """Step ``index`` (its ``StepData``, stats, data wait, host seconds, model FLOPs); no
        tensors of its batches are kept."""
        self.steps.append((index, data, stats, waited, seconds, flops))

    def due(self, boundary: bool) -> bool:
        """Whether to close now: always on the CPU, at a ``boundary`` step on CUDA."""
        return bool(self.steps) and (boundary or not self.cuda)

    def close(self) -> list[tuple]:
        """(step index, data, stats, data wait, wall seconds, FLOPs) of every step, in order."""
        t = time.perf_counter()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        share = (time.perf_counter() - t) / max(len(self.steps), 1)
        out = [(i, data, stats, waited, seconds + share, flops) for i, data, stats, waited, seconds, flops in self.steps]
        self.steps = []
        return out


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
        from .train_pipeline import run_pipeline
        return run_pipeline(cfg)
    world, device = _setup_distributed()
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
    _load_pretrained(model, cfg)
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
    losses, meter, all_meter = [], _Meter(), _Meter()
    step, last, warmup_s = start, None, 0.0
    window = _Window(device)

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
            _maybe_fault(step)
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
                _log_ids(cfg.log_ids, dims, host)
            step += 1
            log_step = step % cfg.log_every == 0 or step == cfg.steps
            if window.due(log_step or step - start == cfg.metrics_skip):
                report()
            if log_step:
                loss = _global_loss(stats, dims)
                if loss is not None:
                    losses.append(loss)
                _log_step(step, loss, stats, meter.summary(dims, device, peak_flops), scheduler)
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


def _load_pretrained(model: MMModel, cfg: TrainConfig) -> None:
    """Every rank reads the local checkpoints (same values everywhere, before sharding)."""
    from . import pretrained
    for path, load, what in ((cfg.init_vision, pretrained.load_vit, "ViT"), (cfg.init_text, pretrained.load_bert, "BERT")):
        if path:
            report = load(model, path)
            log.info("initialised from %s checkpoint %s: %d tensors loaded, %d checkpoint keys ignored",
                     what, path, len(report.loaded), len(report.ignored))


def _global_loss(stats, dims: ParallelDims) -> float | None:
    """The step loss summed over dp (a collective over dp on the loss ranks)."""
    if stats.loss is None:
        return None
    loss = stats.loss.detach().clone()
    if dims.dp_group() is not None:
        dist.all_reduce(loss, group=dims.dp_group())
    return float(loss)


def _log_step(step: int, loss: float | None, stats, summary: dict, scheduler) -> None:
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    lr = scheduler.get_last_lr()[0]
    extra = f" mfu {summary['mfu']:.1%}" if "mfu" in summary else ""
    log.info("step %d loss %s lr %.2e grad_norm %.3f step_time %.1f ms data_wait %.1f%% samples/s (all dp) %.1f%s",
             step, f"{loss:.4f}" if loss is not None and math.isfinite(loss) else loss, lr,
             float(stats.grad_norm), 1e3 * summary["step_time_s"], 100 * summary["data_wait_fraction"],
             summary["samples_per_s"], extra)


def _log_ids(directory: str, dims: ParallelDims, host) -> None:
    """Append one JSON line with the live (weight > 0) ids of this rank's consumed step."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    ids = [[i for i, w in zip(mb.ids, mb.weight.tolist()) if w > 0] for mb in host.host_batches]
    line = {"epoch": host.data.epoch, "step": host.data.step, "dp_rank": dims.dp_rank,
            "mp_rank": dims.mp_rank, "ids": ids}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"ids-rank{rank:03d}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _save_params(directory: str, module, dims: ParallelDims) -> None:
    state = checkpoint.full_model_state(module)
    if dims.dp_rank == 0:
        os.makedirs(directory, exist_ok=True)
        torch.save(state, os.path.join(directory, f"params-mp{dims.mp_rank}.pt"))
