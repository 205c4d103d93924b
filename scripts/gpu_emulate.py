"""Emulate a dp-rank world on one device: time every rank's micro-batches of a plan in turn.

For each strategy folder under ``--plans`` (``mmfeed shard --dp N --strategy S --out DIR/S``),
every step's N ranks run forward + backward of their micro-batches one after another on this
device (the trainer's own prefetcher, batch conversion and step code, CUDA-event timed); the
emulated step time is the slowest rank's, as under a synchronous all-reduce. No collective is
run or timed: it is an emulation of the compute skew, not of a cluster.

Also fits the plan's predicted rank cost (the sum of the ``cost`` column of a rank's rows) to
the measured rank time through the origin and reports R² and the mean relative error.

    python scripts/gpu_emulate.py --plans DIR --model base --steps 8 --out emulate.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import numpy as np
import torch

from mmfeed_trainer import config
from mmfeed_trainer.model import MMModel
from mmfeed_trainer.parallel_dims import ParallelDims
from mmfeed_trainer.parallelize import ParallelConfig, parallelize
from mmfeed_trainer.prefetch import Prefetcher
from mmfeed_trainer.shardset import ShardSet
from mmfeed_trainer.sources import ShardSource
from mmfeed_trainer.step import forward_backward


def _timer(device: torch.device):
    """Start/stop of a CUDA-event timer on CUDA, perf_counter elsewhere; stop returns seconds."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop() -> float:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return stop
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def rank_times(folder: str, module, mcfg, device, autocast, steps: int, pack: bool) -> tuple[np.ndarray, np.ndarray]:
    """(steps, dp) measured seconds and predicted cost of every rank's step."""
    dp = ShardSet(folder).manifest["dp"]
    dims = ParallelDims(dp=1, mp=1, world_size=1)
    measured, predicted = [], []
    for r in range(dp):
        source = ShardSource(folder, r)
        pre = Prefetcher(source, position={"epoch": source.epochs()[0], "next_step": 0}, role=dims.role,
                         pad_id=mcfg.pad_token_id, device=device, vocab_size=mcfg.vocab_size, pack=pack,
                         patch_size=mcfg.patch_size)
        times, costs = [], []
        try:
            for _ in range(steps):
                try:
                    host, _ = pre.next()
                except StopIteration:
                    break
                mbs = host.ready()
                stop = _timer(device)
                forward_backward(module, mbs, dims=dims, device=device, autocast=autocast)
                times.append(stop())
                module.zero_grad(set_to_none=True)
                costs.append(sum(float(np.sum(rec.column(rec.schema.get_field_index("cost")).to_numpy()))
                                 for rec in host.data.records))
        finally:
            pre.close()
        measured.append(times)
        predicted.append(costs)
    n = min(len(t) for t in measured)
    return np.array([t[:n] for t in measured]).T, np.array([c[:n] for c in predicted]).T


def fit(pred: np.ndarray, meas: np.ndarray) -> dict:
    """Least squares meas ~ a * pred through the origin: a, R², mean relative error."""
    x, y = pred.ravel(), meas.ravel()
    a = float(x @ y / (x @ x)) if x @ x > 0 else 0.0
    res = y - a * x
    ss = float(((y - y.mean()) ** 2).sum())
    return {"scale": a, "r2": 1 - float((res ** 2).sum()) / ss if ss > 0 else 0.0,
            "mean_rel_err": float(np.mean(np.abs(res) / np.maximum(y, 1e-12))), "n": int(x.size)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plans", required=True, help="folder of mmfeed shard outputs, one per strategy")
    p.add_argument("--model", default="base")
    p.add_argument("--steps", type=int, default=8, help="steps of each plan to time")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of rank 0 first (allocator, kernels)")
    p.add_argument("--pack", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    mcfg = config.model_config(a.model)
    with torch.device(device):
        model = MMModel(mcfg)
    module = parallelize(model, dims=ParallelDims(dp=1, mp=1, world_size=1), device=device, cfg=ParallelConfig())
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    strategies = sorted(d for d in os.listdir(a.plans) if os.path.isdir(os.path.join(a.plans, d)))
    rank_times(os.path.join(a.plans, strategies[0]), module, mcfg, device, autocast, a.warmup, a.pack)
    out = {"emulation": "each of the plan's dp ranks run in turn on one device; step time = slowest rank; "
                        "no collectives timed", "device": torch.cuda.get_device_name(0) if device.type == "cuda"
           else "cpu", "model": a.model, "strategies": {}}
    for s in strategies:
        meas, pred = rank_times(os.path.join(a.plans, s), module, mcfg, device, autocast, a.steps, a.pack)
        step = meas.max(axis=1)
        out["strategies"][s] = {"dp": int(meas.shape[1]), "steps": int(meas.shape[0]),
                                "step_time_s": float(step.mean()),
                                "mean_rank_time_s": float(meas.mean()),
                                "imbalance": float((step / meas.mean(axis=1)).mean() - 1),
                                "cost_model": fit(pred, meas)}
    if "random" in out["strategies"] and len(strategies) > 1:
        other = next(s for s in strategies if s != "random")
        out["random_over_" + other] = out["strategies"]["random"]["step_time_s"] / out["strategies"][other]["step_time_s"]
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
