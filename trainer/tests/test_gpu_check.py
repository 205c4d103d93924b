"""scripts/gpu-check.sh runs only where CUDA is; ``--dry-run`` runs the same stages on CPU
(the tiny model, gloo, torch.compile with the aot_eager backend), so CI keeps every command
of the script runnable: padded, packed, AC + compile, full AC, FSDP2 mixed precision with CPU
offload over 2 processes, checkpoint + resume, elastic resume dp 2 (FSDP2) -> dp 1, and the
dp-8 rank emulation over plans that bin/mmfeed shards for the mmfeed and random strategies.
The script must also pass ``bash -n``, and keep to its time budget: a stage still running at
the budget is stopped, the later ones are skipped, in the documented order (most important
first), and gpu-check.json is still written. A stage that fails is recorded with the tail of
its log and the next one runs; the logs stay beside the JSON; without a virtualenv the script
runs python3 and says so; the report that ends it imports nothing but the standard library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu-check.sh")
ORDER = ["padded", "emulate", "resume_first", "resume", "packed", "ac_full", "ac_compile", "elastic_dp2",
         "elastic", "mixed_precision"]
"""The stages in the order the script runs them (its header and docs/trainer.md say why)."""
STAGES = set(ORDER) - {"emulate"}


def dry_run(tmp_path, timeout: int, **env) -> tuple[subprocess.CompletedProcess, dict]:
    """``gpu-check.sh --dry-run`` writing tmp_path/gpu-check.json: the process and the JSON."""
    report = tmp_path / "gpu-check.json"
    env = {**os.environ, "GPU_CHECK_BATCH": "4", "MMFEED_PYTHON": sys.executable,
           "GPU_CHECK_DATA": str(tmp_path / "none"), **env}
    out = subprocess.run(["bash", SCRIPT, "--dry-run", "--out", str(report)], capture_output=True,
                         text=True, timeout=timeout, env=env, cwd=REPO)
    assert report.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    return out, json.loads(report.read_text())


def test_gpu_check_script_parses():
    out = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_gpu_check_dry_run_on_cpu(mmfeed, tmp_path):
    out, doc = dry_run(tmp_path, 900, GPU_CHECK_STEPS="2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert doc["mode"] == "dry" and doc["skipped"] == {} and doc["failed"] == [], (doc["skipped"], doc["failed"])
    assert doc["torch"] and doc["device"] == "cpu" and {"cuda", "driver", "cuda_driver", "python"} <= set(doc), doc
    stages = doc["stages"]
    assert list(stages) == ORDER, list(stages)
    for name in STAGES:
        assert stages[name]["status"] == "ok" and stages[name]["tail"], (name, stages[name])
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
    stopped at the budget (status stopped), every later stage is skipped, and the report
    still comes out."""
    out, doc = dry_run(tmp_path, 300, GPU_CHECK_STEPS="100000", GPU_CHECK_BUDGET="30", GPU_CHECK_MIN_STAGE="5")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list(doc["stages"]) == ["padded"] and doc["budget_s"] == 30, doc
    padded = doc["stages"]["padded"]
    assert padded["status"] == "stopped" and "stopped at the time budget" in padded["note"], padded
    assert set(doc["skipped"]) == set(ORDER) - {"padded"}, doc["skipped"]
    announced = [line.split()[1].rstrip(":") for line in out.stdout.splitlines() if line.startswith("== ")]
    assert [s for s in dict.fromkeys(announced)] == ORDER, announced


def test_gpu_check_records_a_failed_stage_and_goes_on(tmp_path):
    """resume_first made to fail (GPU_CHECK_FAIL) among four stages: the JSON is still written,
    with that failure (exit status, the tail of its log), resume skipped because of it, and
    the figures of padded (before it) and packed (after it); the logs stay beside the JSON,
    and the script exits 1."""
    out, doc = dry_run(tmp_path, 600, GPU_CHECK_STEPS="2", GPU_CHECK_ONLY="padded,resume_first,resume,packed",
                       GPU_CHECK_FAIL="resume_first")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 stage(s) failed: resume_first" in out.stderr, out.stderr[-3000:]
    stages = doc["stages"]
    assert list(stages) == ["padded", "resume_first", "packed"] and doc["failed"] == ["resume_first"], doc
    failed = stages["resume_first"]
    assert failed["status"] == "failed" and failed["rc"] == 2, failed
    assert any("unrecognized arguments: --gpu-check-forced-failure" in line for line in failed["tail"]), failed
    assert doc["skipped"]["resume"] == "resume_first failed", doc["skipped"]
    assert set(doc["skipped"]) == set(ORDER) - set(stages), doc["skipped"]
    for name in ("padded", "packed"):
        assert stages[name]["status"] == "ok" and stages[name]["step_time_s"] > 0, stages[name]
    logs = tmp_path / doc["logs"]
    assert logs == tmp_path / "gpu-check-logs", doc["logs"]
    for name in stages:
        for log in stages[name]["logs"]:
            assert (tmp_path / log).is_file(), log
    assert "--gpu-check-forced-failure" in (logs / "resume_first.err").read_text()


def test_gpu_check_without_a_virtualenv_runs_python3(tmp_path):
    """A clone with no .venv and no MMFEED_PYTHON (the lent GPU machine): the script says it
    runs the machine's python3, and a stage runs with it."""
    clone = tmp_path / "clone"
    shutil.copytree(os.path.join(REPO, "scripts"), clone / "scripts")
    shutil.copytree(os.path.join(REPO, "trainer", "mmfeed_trainer"), clone / "trainer" / "mmfeed_trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MMFEED_PYTHON", "PYTHONPATH")}
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", GPU_CHECK_STEPS="1", GPU_CHECK_BATCH="4",
               GPU_CHECK_ONLY="padded", GPU_CHECK_DATA=str(tmp_path / "none"))
    report = tmp_path / "out" / "gpu-check.json"
    report.parent.mkdir()
    out = subprocess.run(["bash", str(clone / "scripts" / "gpu-check.sh"), "--dry-run", "--out", str(report)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"no virtualenv (.venv/bin/python) here: using this machine's python3 ({bindir / 'python3'})" \
        in out.stdout, out.stdout
    doc = json.loads(report.read_text())
    assert doc["stages"]["padded"]["status"] == "ok" and doc["stages"]["padded"]["steps"] == 1, doc


def test_gpu_check_report_imports_only_the_standard_library(tmp_path):
    """The report written at the end reads the logs folder alone: a stage that ran ok gives its
    figures, a failed one its exit status and tail; torch, numpy and mmfeed_trainer are never
    imported (a broken torch still gets its report)."""
    logs = tmp_path / "gpu-check-logs"
    logs.mkdir()
    (logs / "env.json").write_text(json.dumps({"torch": "2.11.0", "cuda": "13.0", "driver": "580.159.03"}))
    (logs / "stages.tsv").write_text("padded\tok\t0\t31\t\npacked\tfailed\t1\t9\texit status 1\n")
    (logs / "skipped.tsv").write_text("ac_full\tover the time budget (290 s of 300 s spent)\n")
    (logs / "padded.json").write_text(json.dumps({"step_time_s": 0.12, "samples_per_s": 1800.0}))
    (logs / "packed.err").write_text("".join(f"line {i}\n" for i in range(30)) + "RuntimeError: boom\n")
    script = os.path.join(REPO, "scripts", "gpu_check_report.py")
    probe = (f"import runpy, sys\nsys.argv = [{script!r}] + sys.argv[1:]\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'numpy', 'pyarrow', 'mmfeed_trainer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(logs), str(tmp_path / "gpu-check.json")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "MODE": "gpu"})
    assert out.returncode == 0 and out.stdout.strip().endswith("[]"), out.stdout + out.stderr
    doc = json.loads((tmp_path / "gpu-check.json").read_text())
    assert doc["torch"] == "2.11.0" and doc["driver"] == "580.159.03" and doc["logs"] == "gpu-check-logs", doc
    assert doc["stages"]["padded"] == {"status": "ok", "rc": 0, "seconds": 31, "step_time_s": 0.12,
                                       "samples_per_s": 1800.0,
                                       "logs": ["gpu-check-logs/padded.out", "gpu-check-logs/padded.err"],
                                       "tail": []}, doc["stages"]["padded"]
    packed = doc["stages"]["packed"]
    assert packed["status"] == "failed" and packed["note"] == "exit status 1" and doc["failed"] == ["packed"], packed
    assert len(packed["tail"]) == 20 and packed["tail"][-1] == "RuntimeError: boom", packed["tail"]
    assert doc["skipped"] == {"ac_full": "over the time budget (290 s of 300 s spent)"}, doc["skipped"]
