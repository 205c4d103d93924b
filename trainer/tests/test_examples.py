"""examples/: each training loop runs a few steps on CPU against ``bin/mmfeed serve``.

Every example is under 60 lines, ends with exit 0, and reports a finite loss and its data
position after exactly the steps asked for (the HF one also writes it beside its checkpoint).
"""

import glob
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from _dist import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
BIN = os.path.join(REPO, "bin", "mmfeed")
STEPS = 3


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    if not os.access(BIN, os.X_OK):
        pytest.skip("bin/mmfeed missing (make build)")
    out = tmp_path_factory.mktemp("examples")
    subprocess.run([BIN, "synth", "--out", str(out), "--samples", "80", "--seed", "4"], check=True,
                   capture_output=True, timeout=300)
    return str(out / "manifest.jsonl")


def needs(module):
    if importlib.util.find_spec(module) is None:
        if os.environ.get("MMFEED_REQUIRE_PEERS"):
            pytest.fail(f"{module} is not installed (requirements.txt pins it)")
        pytest.skip(f"{module} is not installed")


def run_example(script, manifest, tmp_path, micro_batches, *extra):
    port = free_port()
    svc = subprocess.Popen([BIN, "serve", "--input", manifest, "--dp", "1", "--global-batch", "8", "--image-size", "32",
                            "--micro-batches", str(micro_batches), "--job", "ex", "--data-dir", str(tmp_path / "serve"),
                            "--nats-listen", f"127.0.0.1:{port}", "--http", ""],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLES, os.environ.get("PYTHONPATH", "")]))
    try:  # started at once: the example waits for the service
        out = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--nats", f"nats://127.0.0.1:{port}",
                              "--job", "ex", "--steps", str(STEPS), *extra], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    finally:
        svc.kill()
        svc.wait()
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_examples_are_short():
    for f in os.listdir(EXAMPLES):
        if f.endswith(".py"):
            n = len(open(os.path.join(EXAMPLES, f)).read().splitlines())
            assert n < 60, f"examples/{f} has {n} lines"


def test_plain_torch(manifest, tmp_path):
    log = run_example("plain_torch.py", manifest, tmp_path, 2)
    steps = re.findall(r"step (\d+) loss ([\d.]+) data (\{.*\})", log)
    assert [int(s) for s, _, _ in steps] == list(range(STEPS)), log
    assert all(math.isfinite(float(l)) for _, l, _ in steps)
    assert "'next_step': 3, 'next_micro_batch': 0" in steps[-1][2]


def test_hf_trainer(manifest, tmp_path):
    needs("transformers")
    log = run_example("hf_trainer.py", manifest, tmp_path, 1, "--out", str(tmp_path / "hf"))
    state = json.load(open(tmp_path / "hf" / f"checkpoint-{STEPS}" / "mmfeed_data.json"))
    assert (state["next_step"], state["next_micro_batch"]) == (STEPS, 0), state
    assert re.search(r"'train_loss': '?[\d.]+", log), log


def test_lightning(manifest, tmp_path):
    needs("lightning")
    log = run_example("lightning_train.py", manifest, tmp_path, 1, "--out", str(tmp_path / "pl"))
    m = re.search(r"trained (\d+) steps, loss ([\d.]+), data (\{.*\})", log)
    assert m and int(m.group(1)) == STEPS and math.isfinite(float(m.group(2))), log
    assert "'next_step': 3, 'next_micro_batch': 0" in m.group(3), "the position after the last trained batch"
    ckpt = glob.glob(str(tmp_path / "pl" / "**" / "*.ckpt"), recursive=True)
    assert len(ckpt) == 1, ckpt
    state = torch.load(ckpt[0], weights_only=False)["mmfeed_data"]
    assert (state["next_step"], state["next_micro_batch"]) == (STEPS, 0), state
