"""Resume: kill one rank of a dp 2 x mp 2 torchrun job mid-run, restart all ranks from the
latest checkpoint: the final parameters equal those of an uninterrupted run, bit for bit.
Exercises the CLI, the shard reader, DCP checkpoints (model, optimizer, scheduler, position)."""

import os
import subprocess
import sys

import pytest
import torch

from _dist import free_port
from mmfeed_trainer.data import synthetic

STEPS = 6


def torchrun(args, *, env_extra=None, timeout=150):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "mmfeed_trainer", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def load_params(directory):
    params = {}
    for r in range(2):
        params.update(torch.load(os.path.join(directory, f"params-mp{r}.pt")))
    return params


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_resume_after_killed_rank(tmp_path, fsdp):
    shards = tmp_path / "shards"
    synthetic.write_shards(synthetic.SynthConfig(seed=5, dp=2, pad_prob=0.3), str(shards), STEPS)
    common = ["--shards", str(shards), "--dp", "2", "--mp", "2", "--steps", str(STEPS), "--lr", "2e-3",
              "--warmup", "2", "--clip", "0.5", "--log-every", "1"] + (["--fsdp"] if fsdp else [])

    whole = torchrun(common + ["--save-params", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr[-3000:]

    ckpt = ["--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "2"]
    killed = torchrun(common + ckpt, env_extra={"MMFEED_FAULT": "rank=1,step=3"})
    assert killed.returncode != 0, "the faulty run should fail"
    latest = (tmp_path / "ckpt" / "latest").read_text()
    assert latest == "step-00000002", f"latest checkpoint {latest}, want step-00000002"

    resumed = torchrun(common + ckpt + ["--save-params", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "at step 2" in resumed.stderr

    got, want = load_params(tmp_path / "resumed"), load_params(tmp_path / "whole")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{name}: max diff {(got[name] - value).abs().max():.3g}"
