"""What the plain loop (``train``) and the pipelined one (``train_pp``) share: the run's
configuration and result, distributed setup, the data source and its registration, fault
injection, the meters and the synchronization window, pretrained weights, step logging.
Both loops import from here; neither imports the other's internals."""

from __future__ import annotations

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

from ..models import config
from ..parallel.pp import stage as pp_stage
from ..models.model import MMModel
from ..data.natsauth import NatsAuth
from ..parallel.parallel_dims import ParallelDims, backend_for
from ..parallel.parallelize import ParallelConfig
from ..data.position import Position
from ..data.sources import ShardSource, Source, SyntheticSource
from ..data.synthetic import SynthConfig

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
    """Pipeline stages (``parallel.pp``): > 1 splits each tower's blocks over pp ranks."""
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


def setup_distributed() -> tuple[int, torch.device]:
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


def make_source(cfg: TrainConfig, dims: ParallelDims) -> Source:
    if cfg.shards:
        return ShardSource(cfg.shards, dims.dp_rank)
    if cfg.synthetic:
        return SyntheticSource(cfg.synth, dims.dp_rank)
    from ..data.stream import StreamSource
    return StreamSource(url=cfg.nats, job=cfg.job, dims=dims, auth=cfg.nats_auth)


def maybe_fault(step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = dict(kv.split("=", 1) for kv in spec.split(","))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if int(parts["rank"]) == rank and int(parts["step"]) == step:
        log.warning("fault injection: rank %d kills itself before step %d", rank, step)
        os.kill(os.getpid(), signal.SIGKILL)


class Meter:
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


class Window:
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


def load_pretrained(model: MMModel, cfg: TrainConfig) -> None:
    """Every rank reads the local checkpoints (same values everywhere, before sharding)."""
    from ..models import pretrained
    for path, load, what in ((cfg.init_vision, pretrained.load_vit, "ViT"), (cfg.init_text, pretrained.load_bert, "BERT")):
        if path:
            report = load(model, path)
            log.info("initialised from %s checkpoint %s: %d tensors loaded, %d checkpoint keys ignored",
                     what, path, len(report.loaded), len(report.ignored))


def global_loss(stats, dims: ParallelDims) -> float | None:
    """The step loss summed over dp (a collective over dp on the loss ranks)."""
    if stats.loss is None:
        return None
    loss = stats.loss.detach().clone()
    if dims.dp_group() is not None:
        dist.all_reduce(loss, group=dims.dp_group())
    return float(loss)


def log_progress(step: int, loss: float | None, stats, summary: dict, scheduler) -> None:
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    lr = scheduler.get_last_lr()[0]
    extra = f" mfu {summary['mfu']:.1%}" if "mfu" in summary else ""
    log.info("step %d loss %s lr %.2e grad_norm %.3f step_time %.1f ms data_wait %.1f%% samples/s (all dp) %.1f%s",
             step, f"{loss:.4f}" if loss is not None and math.isfinite(loss) else loss, lr,
             float(stats.grad_norm), 1e3 * summary["step_time_s"], 100 * summary["data_wait_fraction"],
             summary["samples_per_s"], extra)


def append_ids(directory: str, dims: ParallelDims, host) -> None:
    """Append one JSON line with the live (weight > 0) ids of this rank's consumed step."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    ids = [[i for i, w in zip(mb.ids, mb.weight.tolist()) if w > 0] for mb in host.host_batches]
    line = {"epoch": host.data.epoch, "step": host.data.step, "dp_rank": dims.dp_rank,
            "mp_rank": dims.mp_rank, "ids": ids}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"ids-rank{rank:03d}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


SUPPORTED = ("--fsdp or DDP over dp (with --fsdp: --mixed-precision, --cpu-offload), --ac none|selective|full, "
             "--compile, --bf16, --pack, --pp-schedule 1f1b|gpipe, --ckpt-dir (save and resume in the same layout)")
"""What --pp > 1 supports, for the errors that refuse the rest."""


def validate_pipeline(cfg: TrainConfig) -> None:
    """ValueError for what --pp > 1 does not support (yet), naming what it does."""
    pp_stage.PipelineConfig(schedule=cfg.pp_schedule, pack=cfg.pack).validate()
    unsupported = [flag for flag, on in (("--allow-resize", cfg.allow_resize), ("--resize-vocab", cfg.resize_vocab))
                   if on]
    if unsupported:
        raise ValueError(f"train: {', '.join(unsupported)} not supported with --pp > 1 (supported there: {SUPPORTED})")
