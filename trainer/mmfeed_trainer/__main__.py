"""Train the mmfeed image-text model (ITC + ITM) on batches from the service, shards or synthetic.

One process per device; torchrun sets RANK/WORLD_SIZE/LOCAL_RANK. dp x mp must equal the
number of processes; mp = 2 puts the vision tower (+ fusion) on even ranks and the text tower
on odd ranks. NCCL on CUDA, gloo on CPU. Run from the repository root with the trainer on the
path (``PYTHONPATH=trainer`` or ``pip install -e trainer``):

4 CPU processes, 2 dp x 2 mp, streaming from the service (``mmfeed serve --job demo``)::

    torchrun --nproc-per-node 4 -m mmfeed_trainer --nats nats://127.0.0.1:4222 --job demo \\
        --dp 2 --mp 2 --model tiny --steps 50

The same, reading ``mmfeed shard --out shards/`` files, FSDP2 instead of DDP, with checkpoints
every 10 steps (rerun the same command to resume from the latest one)::

    torchrun --nproc-per-node 4 -m mmfeed_trainer --shards shards/ --dp 2 --mp 2 --fsdp \\
        --model tiny --steps 50 --ckpt-dir ckpt/ --ckpt-every 10

One 8-GPU node, base model (ViT-B/16 + BERT-base), bf16 autocast, 4 dp x 2 mp::

    torchrun --nproc-per-node 8 -m mmfeed_trainer --nats nats://127.0.0.1:4222 --job demo \\
        --dp 4 --mp 2 --model base --steps 10000 --lr 1e-4 --warmup 1000 --ckpt-dir ckpt/ --ckpt-every 500

Memory savers for a larger model: FSDP2 with the bf16 mixed-precision policy, full activation
checkpointing, torch.compile per block, towers initialised from local HuggingFace checkpoints::

    torchrun --nproc-per-node 8 -m mmfeed_trainer --shards shards/ --dp 8 --fsdp --mixed-precision \\
        --ac full --compile --model base --init-vision vit-base-patch16-224/ --init-text bert-base-uncased/

The 8-GPU streaming job above (4 dp x 2 mp), resumed on 4 GPUs (dp 2) after restarting the service with ``--dp 2 --allow-resize``:
DCP reshards model and optimizer, the service replans the rest of the epoch for dp 2::

    torchrun --nproc-per-node 4 -m mmfeed_trainer --nats nats://127.0.0.1:4222 --job demo \\
        --dp 2 --mp 2 --model base --steps 10000 --lr 1e-4 --warmup 1000 --ckpt-dir ckpt/ --ckpt-every 500 --allow-resize

Single process on synthetic data (smoke test)::

    python -m mmfeed_trainer --synthetic --steps 20
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from .models import config
from .data import natsauth, synthetic
from .loop.train import TrainConfig, run


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage: a wrong flag prints its error and where the help is,
    not the usage of every flag (40 lines that scrolled the error away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the flags)\n")


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    p = _Parser(prog="python -m mmfeed_trainer", description=__doc__.split("\n")[0],
                usage="%(prog)s (--nats URL | --shards DIR | --synthetic) [flags]",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_argument_group("data source (exactly one)")
    src.add_argument("--nats", help="NATS URL of the mmfeed service, e.g. nats://127.0.0.1:4222")
    src.add_argument("--shards", help="folder or URL (s3://, gs://, file://) written by `mmfeed shard`: every epoch it planned")
    src.add_argument("--synthetic", action="store_true", help="generated batches (benchmarks)")
    p.add_argument("--job", default="demo", help="job name on the service")
    natsauth.add_arguments(p)
    p.add_argument("--model", default="tiny",
                   help=f"model preset {sorted(config.PRESETS)} or a FILE.json in the preset schema (the service's --model)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree (default world size / mp)")
    p.add_argument("--mp", type=int, default=1, help="modality-parallel degree: 1 or 2 (vision | text)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages: each tower's blocks split over pp ranks (needs mp 1; mmfeed serve --pp too)")
    p.add_argument("--pp-schedule", default="1f1b", choices=("1f1b", "gpipe"), help="pipeline schedule (with --pp > 1)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard over dp instead of DDP")
    mem = p.add_argument_group("memory and speed")
    mem.add_argument("--ac", default="none", choices=("none", "selective", "full"),
                     help="activation checkpointing per transformer block (selective: keep matmul/attention outputs)")
    mem.add_argument("--compile", action="store_true", help="torch.compile every transformer block")
    mem.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    mem.add_argument("--mixed-precision", action="store_true",
                     help="FSDP2 MixedPrecisionPolicy: bf16 params in compute, fp32 reduce (needs --fsdp, dp > 1)")
    mem.add_argument("--cpu-offload", action="store_true",
                     help="FSDP2 CPUOffloadPolicy: params, grads, optimizer state in host memory (needs --fsdp, dp > 1)")
    p.add_argument("--init-vision", metavar="PATH",
                   help="HuggingFace ViT checkpoint (.safetensors file or directory) for the vision tower")
    p.add_argument("--init-text", metavar="PATH",
                   help="HuggingFace BERT checkpoint for the text tower (its blocks become post-norm, like BERT)")
    p.add_argument("--resize-vocab", action="store_true",
                   help="grow the text embedding to the data tokenizer's vocabulary when it is larger than the "
                        "model's (from the batches' schema metadata; default: refuse such data)")
    p.add_argument("--pack", action="store_true",
                   help="pack micro-batches (no padding; attention within each sample); the service or "
                        "shards must be planned with mmfeed --pack too")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps to train (across epochs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initialisation and of --synthetic data")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate of AdamW (warmup, then cosine)")
    p.add_argument("--warmup", type=int, default=10, help="warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=1.0, help="max global grad norm (<= 0: off)")
    p.add_argument("--ckpt-dir", help="checkpoint directory; resumes from its latest checkpoint")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps (0: at the end)")
    p.add_argument("--allow-resize", action="store_true",
                   help="resume a checkpoint written at another dp (or FSDP/DDP choice): DCP reshards it, the "
                        "service (mmfeed serve --allow-resize) replans the rest of the epoch for this dp")
    p.add_argument("--log-every", type=int, default=10, help="log (and synchronise the device) every N steps")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="log lines as text or as one JSON object each (time, level, rank, logger, msg)")
    p.add_argument("--bf16", choices=("auto", "on", "off"), default="auto", help="bf16 autocast (auto: on CUDA)")
    p.add_argument("--prefetch", type=int, default=2, help="steps converted ahead")
    p.add_argument("--save-params", help="write the final parameters of each mp rank here")
    p.add_argument("--log-ids", metavar="DIR",
                   help="append each consumed step's live sample ids to DIR/ids-rank<R>.jsonl (tests, audits)")
    p.add_argument("--metrics-skip", type=int, default=0, help="leave the first N steps out of the summary")
    p.add_argument("--peak-tflops", type=float, help="peak bf16 TFLOP/s per device for MFU (default: by name)")
    p.add_argument("--synth-samples", type=int, nargs=2, default=(2, 5), metavar=("MIN", "MAX"),
                   help="synthetic: samples per rank and micro-batch")
    p.add_argument("--synth-grids", default="1x1,1x2,2x1,2x2", help="synthetic: patch grids, e.g. 14x14,16x12")
    p.add_argument("--synth-text", type=int, nargs=2, default=(3, 12), metavar=("MIN", "MAX"),
                   help="synthetic: caption tokens per sample")
    p.add_argument("--synth-micro-batches", type=int, default=2, help="synthetic: micro-batches per step")
    p.add_argument("--synth-dtype", default="float16", choices=("float16", "float32", "bfloat16", "uint8"),
                   help="synthetic: pixel dtype on the wire")
    p.add_argument("--synth-distinct", type=int, default=0,
                   help="synthetic: cycle through this many generated steps (0: all new)")
    a = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = a.dp if a.dp is not None else max(world // (a.mp * a.pp), 1)
    grids = tuple(tuple(int(v) for v in g.split("x")) for g in a.synth_grids.split(","))
    return TrainConfig(
        model=a.model, dp=dp, mp=a.mp, pp=a.pp, pp_schedule=a.pp_schedule, fsdp=a.fsdp, pack=a.pack, ac=a.ac, compile=a.compile,
        compile_backend=a.compile_backend, mixed_precision=a.mixed_precision, cpu_offload=a.cpu_offload,
        init_vision=a.init_vision, init_text=a.init_text, resize_vocab=a.resize_vocab, steps=a.steps, seed=a.seed, nats=a.nats, job=a.job,
        nats_auth=natsauth.from_args(a),
        shards=a.shards, synthetic=a.synthetic, ckpt_dir=a.ckpt_dir, ckpt_every=a.ckpt_every,
        allow_resize=a.allow_resize,
        log_every=a.log_every, bf16={"auto": None, "on": True, "off": False}[a.bf16], prefetch=a.prefetch,
        save_params=a.save_params, log_ids=a.log_ids, metrics_skip=a.metrics_skip, peak_tflops=a.peak_tflops,
        optim=config.OptimConfig(lr=a.lr, warmup_steps=a.warmup, total_steps=max(a.steps, 1),
                                 weight_decay=a.weight_decay, max_grad_norm=a.clip),
        synth=synthetic.SynthConfig(seed=a.seed, dp=dp, micro_batches=a.synth_micro_batches,
                                    min_samples=a.synth_samples[0], max_samples=a.synth_samples[1],
                                    min_text=a.synth_text[0], max_text=a.synth_text[1], grids=grids,
                                    dtype=a.synth_dtype, distinct_steps=a.synth_distinct))


class JSONFormatter(logging.Formatter):
    """One JSON object per log line: time, level, rank, logger, msg (and exc when set)."""

    def __init__(self, rank: str):
        super().__init__()
        self.rank = int(rank)

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
               "level": record.levelname, "rank": self.rank, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str, rank: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter(rank) if fmt == "json" else
                         logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def _log_format(args: list[str]) -> str:
    """--log-format's value, read before the full parse so that parsing is logged in it too."""
    for i, arg in enumerate(args):
        if arg == "--log-format" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--log-format="):
            return arg.split("=", 1)[1]
    return "text"


def main(argv: list[str] | None = None) -> int:
    """Train, print rank 0's result line, and return the exit code (see cli for the process exit)."""
    rank = os.environ.get("RANK", "0")
    setup_logging(_log_format(sys.argv[1:] if argv is None else argv), rank)
    import torch.distributed as dist
    try:
        cfg = parse_args(argv)
        result = run(cfg)
    except ValueError as err:
        print(f"mmfeed_trainer: {err}", file=sys.stderr)
        return 2
    if dist.is_initialized():
        dist.barrier()  # let every rank finish its collectives before tearing the group down
        dist.destroy_process_group()
    if rank == "0":
        print(json.dumps({"steps": result.steps_done, "final_step": result.final_step,
                          "losses": result.losses, **result.metrics}))
    return 0


def cli() -> None:
    """Process entry point: run main, then leave without interpreter teardown.

    Once the process group is destroyed and the result printed, nothing is left to do; but
    finalizing the interpreter can still abort the process (SIGABRT, "terminate called without an
    active exception") when a torch C++ thread is joined against a half-torn-down interpreter, which
    torchrun reports as a failed run although every step finished. os._exit after flushing skips
    that teardown; errors before this point still surface as exceptions and exit codes.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
