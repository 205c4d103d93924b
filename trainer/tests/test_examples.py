"""examples/: each training loop runs a few steps on CPU against ``bin/mmfeed serve``.

Every example is under 60 lines. plain_torch runs one rank and reports a finite loss and its
data position after exactly the steps asked for. The framework examples (HF Trainer, Lightning,
Accelerate) run under torchrun with 2 ranks (DDP over gloo), observed by ``_example_probe.py``:
after DP_STEPS steps the parameters are the same on every rank; resumed from its checkpoint at
step STOP (the state a run stopped there leaves; a new service, the same plan), it trains each
step after the checkpoint once, no earlier one, with the same samples, per-sample losses and
final parameters as the uninterrupted run; and the framework's own checkpoint carries mmfeed's
position. (A stop against the same service, redelivery included, is test_data.py's.)
"""

import contextlib
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
DP, DP_STEPS, STOP = 2, 6, 3
"""The framework runs: 2 ranks, 6 steps (of the 10 an epoch of 80 samples has at a global batch of
8), a checkpoint every 3 steps, the stopped run ended when it is about to train step 3."""
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_example_probe.py")


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


@contextlib.contextmanager
def serving(manifest, data_dir):
    """A ``mmfeed serve`` for DP ranks of one micro-batch per step (its log beside ``data_dir``);
    yields its URL."""
    port = free_port()
    with open(f"{data_dir}.log", "w") as log:
        svc = subprocess.Popen([BIN, "serve", "--input", manifest, "--dp", str(DP), "--global-batch", "8",
                                "--image-size", "32", "--micro-batches", "1", "--job", "ex", "--data-dir",
                                str(data_dir), "--nats-listen", f"127.0.0.1:{port}", "--http", ""],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        svc.kill()
        svc.wait()


def torchrun(script, url, out, probe, *extra):
    """The example under torchrun (DP ranks), observed into the folder ``probe``."""
    os.makedirs(probe)
    env = dict(os.environ, OMP_NUM_THREADS="1", MMFEED_PROBE_OUT=str(probe),
               PYTHONPATH=os.pathsep.join([EXAMPLES, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP), PROBE,
           os.path.join(EXAMPLES, script), "--nats", url, "--job", "ex", "--steps", str(DP_STEPS),
           "--save-steps", str(STOP), "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, cwd=os.path.dirname(str(out)), capture_output=True, text=True, timeout=300)


def trained(probe):
    """[((rank, step), (ids, losses))] of every trained forward, in order per rank."""
    out = []
    for name in sorted(os.listdir(probe)):
        if name.startswith("trained-"):
            for line in open(os.path.join(probe, name)):
                r = json.loads(line)
                out.append(((r["rank"], r["step"]), (r["ids"], r["loss"])))
    return out


def digests(probe):
    return [json.load(open(os.path.join(probe, f"params-{r}.json"))) for r in range(DP)]


def check_resume(script, manifest, tmp_path, checkpoint):
    """Runs ``script`` for DP_STEPS steps, then resumes it from its checkpoint at STOP against a
    new service (the same plan); checks the module doc's claims; returns that checkpoint."""
    with serving(manifest, tmp_path / "serve-whole") as url:
        run = torchrun(script, url, tmp_path / "whole", tmp_path / "probe-whole")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    ckpt = checkpoint(tmp_path / "whole", STOP)
    with serving(manifest, tmp_path / "serve-resumed") as url:
        run = torchrun(script, url, tmp_path / "resumed", tmp_path / "probe-resumed", "--resume", str(ckpt))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]

    whole, resumed = trained(tmp_path / "probe-whole"), trained(tmp_path / "probe-resumed")
    assert sorted(k for k, _ in whole) == [(r, s) for r in range(DP) for s in range(DP_STEPS)], \
        "the whole run: each rank trains each step once"
    assert sorted(k for k, _ in resumed) == [(r, s) for r in range(DP) for s in range(STOP, DP_STEPS)], \
        "the resumed run: each rank trains each step after the checkpoint once, no other"
    ids = [i for _, (step_ids, _) in whole for i in step_ids]
    assert len(ids) == len(set(ids)) > 0, "a sample trained twice in one epoch"
    assert len(set(digests(tmp_path / "probe-whole"))) == 1, "ranks ended with different parameters: not one DDP run"
    want = dict(whole)
    for key, (step_ids, losses) in resumed:
        assert step_ids == want[key][0], f"rank, step {key}: other samples after the resume"
        assert losses == pytest.approx(want[key][1], rel=1e-6, abs=1e-7), f"rank, step {key}: other losses"
    assert digests(tmp_path / "probe-resumed") == digests(tmp_path / "probe-whole"), "resumed != uninterrupted"
    return ckpt


def at_stop(state):
    assert (state["next_step"], state["next_micro_batch"]) == (STOP, 0), state


def test_hf_trainer(manifest, tmp_path):
    needs("transformers")
    from mmfeed_trainer.integrations.hf import load_position

    ckpt = check_resume("hf_trainer.py", manifest, tmp_path, lambda out, step: out / f"checkpoint-{step}")
    at_stop(load_position(str(ckpt)))


def test_lightning(manifest, tmp_path):
    needs("lightning")
    ckpt = check_resume("lightning_train.py", manifest, tmp_path, lambda out, step: out / f"step={step}.ckpt")
    at_stop(torch.load(ckpt, weights_only=False)["MmfeedDataModule"]["position"])
    assert sorted(os.listdir(tmp_path / "whole")) == ["step=3.ckpt", "step=6.ckpt"], "one writer"


def test_accelerate(manifest, tmp_path):
    needs("accelerate")
    ckpt = check_resume("accelerate_train.py", manifest, tmp_path, lambda out, step: out / f"step_{step}")
    at_stop(torch.load(ckpt / "custom_checkpoint_0.pkl", weights_only=True))


def test_integrations_refuse_misconfiguration(monkeypatch):
    """Each misconfiguration the framework tests would catch late is a ValueError at once."""
    from mmfeed_trainer.integrations._common import check_item, check_world

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="1 process.* WORLD_SIZE=2.*use_cpu=True"):
        check_world("hf", 1, None, "use_cpu=True")
    with pytest.raises(ValueError, match="dataset is for a world of 1"):
        check_world("hf", 2, type("Data", (), {"world_size": 1})(), "")
    with pytest.raises(ValueError, match="--micro-batches 1"):
        check_item("hf", {"micro_batches": 2})
    check_world("hf", 2, None, ""), check_item("hf", {"micro_batches": 1})


def test_lightning_trainer_kwargs(monkeypatch):
    needs("lightning")
    from mmfeed_trainer.integrations.lightning import trainer_kwargs

    monkeypatch.setenv("WORLD_SIZE", "4"), monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    got = trainer_kwargs()
    assert (got["devices"], got["num_nodes"], got["strategy"], got["use_distributed_sampler"]) == (2, 2, "ddp", False)
    monkeypatch.setenv("WORLD_SIZE", "1"), monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert (trainer_kwargs()["devices"], trainer_kwargs()["strategy"]) == (1, "auto")


def test_hf_trainer_refuses_data_skip(tmp_path):
    needs("transformers")
    from transformers import TrainingArguments

    from mmfeed_trainer.integrations.hf import MmfeedTrainer

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="ignore_data_skip=True"):
        MmfeedTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=[])


def test_hf_loads_indexed_cpu_location(tmp_path):
    """The Trainer loads a multi-CPU run's optimizer with map_location=cpu:0 (accelerate's device)."""
    needs("transformers")
    import mmfeed_trainer.integrations.hf  # noqa: F401 (teaches torch.load the location)

    torch.save({"x": torch.ones(2)}, tmp_path / "t.pt")
    got = torch.load(tmp_path / "t.pt", map_location=torch.device("cpu", 0), weights_only=True)
    assert torch.equal(got["x"], torch.ones(2))
