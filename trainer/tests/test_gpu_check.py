"""scripts/gpu-check.sh runs only where CUDA is; ``--dry-run`` runs the same stages on CPU
(the tiny model, gloo, torch.compile with the aot_eager backend), so CI keeps every command
of the script runnable: padded, packed, AC + compile, full AC, FSDP2 mixed precision with CPU
offload over 2 processes, checkpoint + resume, elastic resume dp 2 (FSDP2) -> dp 1, and the
dp-8 rank emulation over plans that bin/mmfeed shards for the mmfeed and random strategies.
The script must also pass ``bash -n``, and keep to its time budget: a stage still running at
the budget is stopped, the later ones are skipped, in the documented order (most important
first), and gpu-check.json is still written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu-check.sh")
ORDER = ["padded", "packed", "emulate", "resume_first", "resume", "ac_full", "ac_compile", "elastic_dp2",
         "elastic", "mixed_precision"]
"""The stages in the order the script runs them (its header and docs/trainer.md say why)."""
STAGES = set(ORDER) - {"emulate"}


def test_gpu_check_script_parses():
    out = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_gpu_check_dry_run_on_cpu(mmfeed, tmp_path):
    report = tmp_path / "gpu-check.json"
    env = {**os.environ, "GPU_CHECK_STEPS": "2", "GPU_CHECK_BATCH": "4", "MMFEED_PYTHON": sys.executable,
           "GPU_CHECK_DATA": str(tmp_path / "none")}
    out = subprocess.run(["bash", SCRIPT, "--dry-run", "--out", str(report)], capture_output=True,
                         text=True, timeout=900, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["mode"] == "dry" and doc["skipped"] == {}, doc["skipped"]
    stages = doc["stages"]
    assert STAGES | {"emulate"} == set(stages), sorted(stages)
    for name in STAGES:
        assert stages[name]["step_time_s"] > 0 and stages[name]["samples_per_s"] > 0, (name, stages[name])
    assert stages["resume"]["steps"] == 1 and stages["elastic"]["steps"] == 3, (stages["resume"], stages["elastic"])
    # both steps are in the warm-up, whose learning rates do not depend on --steps: the resumed
    # run ends where the uninterrupted one did
    assert stages["resume"]["losses"][-1] == stages["padded"]["losses"][-1], (stages["resume"], stages["padded"])
    emu = stages["emulate"]
    assert set(emu["strategies"]) == {"mmfeed", "random"} and emu["random_over_mmfeed"] > 0, emu
    for s in emu["strategies"].values():
        assert s["dp"] == 8 and s["steps"] >= 1 and s["step_time_s"] >= s["mean_rank_time_s"] > 0, s


def test_gpu_check_stops_at_its_budget(tmp_path):
    """A 30 s budget (15 s kept for the JSON) and a padded stage far too long to finish: it is
    stopped after 15 s, every later stage is skipped, and the report still comes out."""
    report = tmp_path / "gpu-check.json"
    env = {**os.environ, "GPU_CHECK_STEPS": "100000", "GPU_CHECK_BATCH": "4", "MMFEED_PYTHON": sys.executable,
           "GPU_CHECK_DATA": str(tmp_path / "none"), "GPU_CHECK_BUDGET": "30", "GPU_CHECK_MIN_STAGE": "5"}
    out = subprocess.run(["bash", SCRIPT, "--dry-run", "--out", str(report)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["stages"] == {} and doc["budget_s"] == 30, doc
    assert "stopped at the time budget" in doc["skipped"]["padded"], doc["skipped"]
    assert set(doc["skipped"]) == set(ORDER), doc["skipped"]
    announced = [line.split()[1].rstrip(":") for line in out.stdout.splitlines() if line.startswith("== ")]
    assert [s for s in dict.fromkeys(announced)] == [s for s in ORDER if s not in ("resume", "elastic")], announced
