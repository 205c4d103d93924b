"""scripts/gpu-check.sh runs only where CUDA is; its CPU dry run (GPU_CHECK_CPU=4: the tiny
model on 4 gloo processes) keeps every trainer command of the script runnable in CI:
DDP over dp 4, the same with selective AC and per-block torch.compile (eager backend), then
FSDP2 with the bf16 mixed-precision policy, full AC and modality parallelism over dp 2 x mp 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_dry_run_on_cpu():
    env = {**os.environ, "GPU_CHECK_CPU": "4", "GPU_CHECK_STEPS": "3", "GPU_CHECK_BATCH": "16",
           "MMFEED_PYTHON": sys.executable}
    out = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-check.sh")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    stages = [line for line in out.stdout.splitlines() if line.startswith("== ")]
    assert [s.split(":")[0] for s in stages] == [
        "== DDP", "== DDP + AC selective + compile", "== FSDP2 bf16 policy + AC full + modality parallel"], stages
    summaries = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [s["steps"] for s in summaries] == [3, 3, 3], summaries
