"""One torchrun rank of the e2e benchmark: pin, time, then run mmfeed_trainer unchanged.

torchrun cannot pin ranks to cores, so ``bench/e2e.go`` launches this file with
``torchrun scripts/e2e_rank.py <trainer flags>``. It

* pins this process to core ``LOCAL_RANK`` (modulo the cores it may use) and sets one torch
  thread, so each dp rank computes on its own core;
* wraps ``train_step`` and the source's ``feedback`` to record, per step, the wall time of the
  step (``train_step`` entry to exit: compute plus the waits at the collectives), the
  rank-local compute the trainer reports to the service (waits for other ranks excluded),
  the data wait and the live samples;
* writes them as JSON lines to ``$MMFEED_E2E_LOG/rank-<RANK>.jsonl`` and runs
  ``python -m mmfeed_trainer`` with the remaining arguments.

Nothing in the trainer changes: the wrappers only read what it computes anyway.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def _pin() -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def _instrument(path: str) -> None:
    from mmfeed_trainer import train

    out = open(path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    last = {"wall": 0.0}
    train_step, make_source = train.train_step, train._make_source

    def timed_step(*args, **kwargs):
        t0 = time.perf_counter()
        stats = train_step(*args, **kwargs)
        last["wall"] = time.perf_counter() - t0
        return stats

    def make(cfg, dims):
        source = make_source(cfg, dims)
        feedback = source.feedback

        def record(data, *, compute_seconds, data_wait_seconds, samples):
            out.write(json.dumps({"step": data.step, "epoch": data.epoch, "wall_s": last["wall"],
                                  "compute_s": compute_seconds, "data_wait_s": data_wait_seconds,
                                  "samples": samples}) + "\n")
            return feedback(data, compute_seconds=compute_seconds, data_wait_seconds=data_wait_seconds,
                            samples=samples)

        source.feedback = record
        return source

    train.train_step, train._make_source = timed_step, make


def main() -> None:
    _pin()
    import torch

    torch.set_num_threads(1)
    log_dir = os.environ.get("MMFEED_E2E_LOG")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        _instrument(os.path.join(log_dir, f"rank-{os.environ.get('RANK', '0')}.jsonl"))
    sys.argv = ["mmfeed_trainer", *sys.argv[1:]]
    runpy.run_module("mmfeed_trainer", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
