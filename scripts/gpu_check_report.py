"""The two Python steps of scripts/gpu-check.sh that are not stages.

    python scripts/gpu_check_report.py --env LOGS/env.json   the interpreter, torch, CUDA, driver, devices
    python scripts/gpu_check_report.py LOGS OUT.json          gpu-check.json from the stage logs

``--env`` imports torch (the one import it needs) and never fails on a missing driver tool:
a version it cannot read is null. The report imports the standard library only, so it is
written whatever the stages did: every stage of ``LOGS/stages.tsv`` (name, status, exit
status, seconds, note; one line per stage, written as it ended) gets its status, the tail of
its log and, when it ran ok, its figures (``LOGS/<stage>.json``); every stage of
``LOGS/skipped.tsv`` (name, reason) its reason for not running.
"""

from __future__ import annotations

import json
import os
import sys
import time

TAIL_LINES = 20
"""Lines of a stage's log kept in gpu-check.json (its whole log stays in the logs folder)."""
TAIL_WIDTH = 400
"""Characters kept of each of those lines."""


def _driver_version() -> str | None:
    """The NVIDIA kernel driver's version (nvidia-smi, else /proc/driver/nvidia/version)."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
    except OSError:
        return None
    return next((w for w in words if w[:1].isdigit() and "." in w), None)


def _cuda_driver_version() -> str | None:
    """The CUDA version the driver supports (cuDriverGetVersion of libcuda), e.g. "13.0"."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def environment() -> dict:
    """What the figures were measured with; CUDA fields are null where no device is visible."""
    import platform

    import torch
    env = {"python": sys.executable, "python_version": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": None, "driver": None, "cuda_driver": None,
           "devices": 0, "device": "cpu", "capability": None}
    if torch.cuda.is_available():
        env.update(devices=torch.cuda.device_count(), device=torch.cuda.get_device_name(0),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   cudnn=torch.backends.cudnn.version(), driver=_driver_version(),
                   cuda_driver=_cuda_driver_version())
    return env


def tail(logs: str, name: str) -> list[str]:
    """The last lines of a stage's stderr (its stdout when stderr is empty)."""
    for ext in (".err", ".out"):
        try:
            with open(os.path.join(logs, name + ext), errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        if lines:
            return [line[:TAIL_WIDTH] for line in lines[-TAIL_LINES:]]
    return []


def _rows(logs: str, name: str) -> list[str]:
    """The lines of a tab-separated file of the logs folder (none when it is missing)."""
    try:
        with open(os.path.join(logs, name)) as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []


def _figures(logs: str, name: str) -> dict:
    try:
        with open(os.path.join(logs, name + ".json")) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return {}


def stages(logs: str, out_dir: str) -> dict:
    """Every stage that ran, in the order it ran: status, rc, seconds, note, figures, log paths, tail."""
    result = {}
    rel = os.path.relpath(logs, out_dir)
    for row in _rows(logs, "stages.tsv"):
        name, status, rc, secs, note = row.split("\t")
        st = {"status": status, "rc": int(rc), "seconds": int(secs)}
        if note:
            st["note"] = note
        if status == "ok":
            st.update(_figures(logs, name))
        st["logs"] = [os.path.join(rel, name + ext) for ext in (".out", ".err")]
        st["tail"] = tail(logs, name)
        result[name] = st
    return result


def report(logs: str, out: str) -> dict:
    try:
        with open(os.path.join(logs, "env.json")) as f:
            env = json.load(f)
    except (OSError, ValueError):
        env = {"error": tail(logs, "env")}
    skipped = dict(row.split("\t", 1) for row in _rows(logs, "skipped.tsv"))
    ran = stages(logs, os.path.dirname(os.path.abspath(out)))
    failed = [name for name, st in ran.items() if st["status"] == "failed"]
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": os.environ.get("MODE"),
            **env, "budget_s": int(os.environ.get("BUDGET", 0)), "elapsed_s": int(os.environ.get("ELAPSED", 0)),
            "logs": os.path.relpath(logs, os.path.dirname(os.path.abspath(out))),
            "failed": failed, "stages": ran, "skipped": skipped}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--env"]:
        env = environment()
        with open(argv[1], "w") as f:
            json.dump(env, f)
        print(f"gpu-check: {env['devices']} x {env['device']}, python {env['python_version']} ({env['python']}), "
              f"torch {env['torch']}, CUDA {env['cuda']}, driver {env['driver']} (CUDA {env['cuda_driver']})")
        return 0
    logs, out = argv
    doc = report(logs, out)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"gpu-check: wrote {out} ({len(doc['stages'])} stages, {len(doc['failed'])} failed, "
          f"{len(doc['skipped'])} skipped, {doc['elapsed_s']} s of a {doc['budget_s']} s budget before it; "
          f"logs in {doc['logs']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
