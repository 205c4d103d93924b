"""Elastic resume: a checkpoint written at one dp resumes at another (``--allow-resize``).

* DCP resharding (``test_elastic_resume_dcp_reshards``, gloo worlds): model parameters and
  AdamW state saved under FSDP2 at dp 2 load at dp 1, and saved at dp 1 load into FSDP2
  shards at dp 2, equal to the saved ones bit for bit; without ``allow_resize`` the layout
  change is refused. The same at dp 4 (FSDP2) -> 2 and dp 4 -> 8 (FSDP2) with
  MMFEED_ELASTIC_LONG=1 (12 and 18 processes: minutes on a loaded 2-core machine).
* End to end against ``bin/mmfeed serve`` (``test_elastic_resume_serve``): train at dp 4
  under FSDP2 (once, the ``at_dp4`` fixture), kill rank 0 one step after the checkpoint of
  step 4; each test copies the service's data dir and the checkpoints, checks that the
  service refuses the new dp without ``--allow-resize``, restarts it with ``--dp N
  --allow-resize`` and resumes the trainer at dp 2 (DDP) or dp 8 (FSDP2). The ids of the
  steps the checkpoint holds plus those trained after the resize are the corpus, each once.
  The run continues: its first step is the one after the checkpoint with the learning rate
  the interrupted run had there, and its final checkpoint (written at the new dp) has AdamW
  step counts that went on from the checkpoint's and parameters that moved on from them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from _dist import free_port, run_world
from mmfeed_trainer.loop import checkpoint
from mmfeed_trainer.models import config
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.optim import build_optimizer
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ParallelConfig, parallelize
from test_stream import wait_for_port
from test_train_serve import BIN, REPO, consumed, stop_serve

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _build(world: int, fsdp: bool):
    dims = ParallelDims(dp=world, mp=1, world_size=world, fsdp=fsdp)
    dims.build_mesh("cpu")
    torch.manual_seed(3)
    model = MMModel(config.model_config("tiny"))
    module = parallelize(model, dims=dims, cfg=ParallelConfig(fsdp=fsdp))
    optimizer, scheduler = build_optimizer(module, config.OptimConfig(lr=1e-2, warmup_steps=1, total_steps=10))
    return dims, module, optimizer, scheduler


def _full_state(module, optimizer) -> dict:
    msd, osd = get_state_dict(module, optimizer, options=FULL)
    return {"model": msd, "optim": osd}


def _save(rank: int, world: int, fsdp: bool, out: str) -> None:
    dims, module, optimizer, scheduler = _build(world, fsdp)
    gen = torch.Generator().manual_seed(7)
    for p in module.parameters():  # one AdamW step with fixed gradients: non-trivial moments
        full = torch.randn(p.shape, generator=gen)
        p.grad = full if not hasattr(p, "full_tensor") else \
            torch.distributed.tensor.distribute_tensor(full, p.device_mesh, p.placements)
    optimizer.step()
    scheduler.step()
    checkpoint.save(os.path.join(out, "ckpt"), next_step=1, module=module, optimizer=optimizer,
                    scheduler=scheduler, dims=dims, stream_position={"epoch": 0, "next_step": 1})
    state = _full_state(module, optimizer)
    if rank == 0:
        torch.save(state, os.path.join(out, "saved.pt"))


def _load(rank: int, world: int, fsdp: bool, out: str) -> None:
    """Load without allow_resize (refused, the message kept), then with it."""
    dims, module, optimizer, scheduler = _build(world, fsdp)
    path = checkpoint.latest(os.path.join(out, "ckpt"))
    try:
        checkpoint.load(path, module=module, optimizer=optimizer, scheduler=scheduler, dims=dims)
        refused = ""
    except ValueError as err:
        refused = str(err)
    extra = checkpoint.load(path, module=module, optimizer=optimizer, scheduler=scheduler, dims=dims,
                            allow_resize=True)
    state = _full_state(module, optimizer)
    if rank == 0:
        torch.save({"state": state, "extra": extra, "refused": refused}, os.path.join(out, "loaded.pt"))


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}/")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}{i}/")
    else:
        yield prefix, tree


LONG = pytest.mark.skipif(not os.environ.get("MMFEED_ELASTIC_LONG"),
                          reason="12-18 gloo processes, 2-3 minutes on a loaded 2-core machine: MMFEED_ELASTIC_LONG=1")


@pytest.mark.parametrize("save_world,save_fsdp,load_world,load_fsdp", [
    (2, True, 1, False), (1, False, 2, True),
    pytest.param(4, True, 2, False, marks=LONG), pytest.param(4, False, 8, True, marks=LONG)],
    ids=["fsdp2_to_1", "1_to_fsdp2", "4_fsdp2_to_2", "4_to_8_fsdp2"])
def test_elastic_resume_dcp_reshards(tmp_path, save_world, save_fsdp, load_world, load_fsdp):
    out = str(tmp_path)
    run_world(_save, save_world, (save_fsdp, out), timeout=60 * save_world)
    run_world(_load, load_world, (load_fsdp, out), timeout=60 * load_world)
    saved, loaded = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "loaded.pt")
    refused = loaded["refused"]
    assert f"dp, mp, fsdp = ({save_world}, 1, {save_fsdp})" in refused and "--allow-resize" in refused, refused
    assert loaded["extra"]["resized_from"] == save_world and loaded["extra"]["next_step"] == 1
    want, got = dict(_flat(saved)), dict(_flat(loaded["state"]))
    assert sorted(got) == sorted(want)
    assert any("exp_avg_sq" in k for k in want), "no AdamW moments in the optimizer state"
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), f"{key} differs after resharding"
        else:
            assert got[key] == value, key


SAMPLES, GLOBAL_BATCH, CKPT_STEP = 96, 16, 4
PLAN = ["--global-batch", str(GLOBAL_BATCH), "--micro-batches", "2", "--resize", "dynamic",
        "--max-pixels", "16384", "--seed", "5", "--epochs", "1"]


def _serve(manifest: str, data_dir: str, port: int, dp: int, *extra: str) -> subprocess.Popen:
    cmd = [BIN, "serve", "--input", manifest, "--dp", str(dp), *PLAN, "--job", "elastic", "--data-dir", data_dir,
           "--nats-listen", f"127.0.0.1:{port}", "--http", "", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train(port: int, dp: int, ids: str, ckpt: str, *extra: str, fault: str | None = None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(dp),
           "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{port}", "--job", "elastic", "--dp", str(dp),
           "--model", "tiny", "--steps", "100", "--warmup", "1", "--lr", "3e-3", "--log-every", "1",
           "--log-ids", ids, "--ckpt-dir", ckpt, "--ckpt-every", str(CKPT_STEP), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"MMFEED_FAULT": fault} if fault else {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


def _step_logs(log: str) -> dict[int, tuple[float, str]]:
    """{step: (loss, lr as logged)} of rank 0's ``step N loss L lr R ...`` lines."""
    out = {}
    for line in log.splitlines():
        words = line.split()
        if "step" in words and "loss" in words:
            i = words.index("step")
            if words[i + 2] == "loss" and words[i + 4] == "lr":
                out[int(words[i + 1])] = (float(words[i + 3]), words[i + 5])
    return out


def _read_ckpt(ckpt: str, step: int, tmp) -> tuple[dict, dict]:
    """(full DCP state, rank 0's JSON) of the checkpoint of ``step``, read in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    path = os.path.join(ckpt, f"step-{step:08d}")
    out = os.path.join(str(tmp), f"state-{step}.pt")
    dcp_to_torch_save(os.path.join(path, "mp0"), out)
    with open(os.path.join(path, "rank-00000.json")) as f:
        return torch.load(out, weights_only=False), json.load(f)


OLD_DP = 4
"""The checkpoint's layout: dp 4 under FSDP2; both tests resume the same checkpoint."""


@pytest.fixture(scope="module")
def at_dp4(tmp_path_factory):
    """Train at dp 4 (FSDP2) against ``bin/mmfeed serve`` and kill rank 0 one step after the
    checkpoint of step 4: the corpus, the service's data dir and the checkpoints, which each
    test copies (``resume_copy``) before resuming them at its own dp."""
    if not os.access(BIN, os.X_OK):
        (pytest.fail if os.environ.get("MMFEED_REQUIRE_PEERS") else pytest.skip)(f"{BIN} missing (make build)")
    root = tmp_path_factory.mktemp("elastic_dp4")
    subprocess.run([BIN, "synth", "--out", str(root / "corpus"), "--samples", str(SAMPLES), "--seed", "4"],
                   check=True, capture_output=True, text=True, timeout=60)
    manifest = str(root / "corpus" / "manifest.jsonl")
    port = free_port()
    serve = _serve(manifest, str(root / "serve"), port, OLD_DP)
    try:
        wait_for_port(port, deadline_s=60)
        killed = _train(port, OLD_DP, str(root / "ids"), str(root / "ckpt"), "--fsdp",
                        fault=f"rank=0,step={CKPT_STEP + 1}")
        assert killed.returncode != 0, "the faulty run should fail"
    finally:
        stop_serve(serve)
    assert (root / "ckpt" / "latest").read_text() == f"step-{CKPT_STEP:08d}"
    return {"root": root, "manifest": manifest, "log": killed.stderr,
            "corpus": [json.loads(line)["id"] for line in open(manifest, encoding="utf-8")]}


@pytest.mark.parametrize("new_dp,new_fsdp", [(2, False), (8, True)], ids=["4_fsdp2_to_2", "4_fsdp2_to_8_fsdp2"])
def test_elastic_resume_serve(mmfeed, tmp_path, at_dp4, new_dp, new_fsdp):
    old_dp, old_fsdp = OLD_DP, True
    data, ckpt = str(tmp_path / "serve"), str(tmp_path / "ckpt")
    shutil.copytree(at_dp4["root"] / "serve", data)
    shutil.copytree(at_dp4["root"] / "ckpt", ckpt)
    manifest, corpus, killed_log = at_dp4["manifest"], at_dp4["corpus"], at_dp4["log"]

    port = free_port()
    refused = _serve(manifest, data, port, new_dp)
    out, _ = refused.communicate(timeout=60)
    assert refused.returncode != 0 and "--allow-resize" in out, out[-2000:]

    serve = _serve(manifest, data, port, new_dp, "--allow-resize")
    try:
        wait_for_port(port, deadline_s=60)
        resumed = _train(port, new_dp, str(tmp_path / "ids2"), ckpt, *(["--fsdp"] if new_fsdp else []),
                         "--allow-resize")
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-6000:]
    finally:
        stop_serve(serve)
    served = serve.stdout.read()
    assert "resized" in served and f"to_dp={new_dp}" in served, served[-3000:]
    assert f"resized: checkpoint dp {old_dp}, this run dp {new_dp}" in resumed.stderr

    kept = [r for r in consumed(str(at_dp4["root"] / "ids")) if r["step"] < CKPT_STEP]
    after = consumed(str(tmp_path / "ids2"))
    assert {r["dp_rank"] for r in after} == set(range(new_dp))
    assert min(r["step"] for r in after) == CKPT_STEP
    got = Counter(i for r in kept + after for mb in r["ids"] for i in mb)
    assert sorted(got) == sorted(corpus), f"trained {len(got)} distinct ids, the corpus has {len(corpus)}"
    assert max(got.values()) == 1, f"trained twice: {[i for i, n in got.items() if n > 1]}"

    # the run continues from the checkpoint: its first step is the one after it, with the
    # learning rate the interrupted run had there (the scheduler resumed, not restarted), finite
    # losses, and a final checkpoint, written at the new dp, whose AdamW moments have seen the
    # 4 steps before the resize and the ones after it (resharded, not reset), and whose
    # parameters moved on from the checkpoint's
    before, after_log = _step_logs(killed_log), _step_logs(resumed.stderr)
    last = max(r["step"] for r in after) + 1  # the resumed run's final checkpoint
    assert sorted(after_log) == list(range(CKPT_STEP + 1, last + 1)), after_log
    assert after_log[CKPT_STEP + 1][1] == before[CKPT_STEP + 1][1], (before, after_log)
    assert all(0 < loss < 20 for loss, _ in after_log.values()), after_log
    ck, ck_extra = _read_ckpt(ckpt, CKPT_STEP, tmp_path)
    end, end_extra = _read_ckpt(ckpt, last, tmp_path)
    assert (ck_extra["dp"], ck_extra["fsdp"], end_extra["dp"], end_extra["fsdp"]) == (old_dp, old_fsdp, new_dp, new_fsdp)
    steps = {float(v["step"]) for v in end["optim"]["state"].values()}
    assert steps == {float(last)}, steps
    assert {float(v["step"]) for v in ck["optim"]["state"].values()} == {float(CKPT_STEP)}
    moved = [k for k, v in end["model"].items() if v.shape == ck["model"][k].shape and not torch.equal(v, ck["model"][k])]
    assert len(moved) > len(end["model"]) // 2, f"{len(moved)} of {len(end['model'])} parameters changed after the resize"
    print(f"dp {old_dp} -> {new_dp}: losses before {before}, after {after_log}")
