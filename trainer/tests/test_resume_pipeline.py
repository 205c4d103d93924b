"""Checkpoints under pipeline parallelism: a dp 1 x pp 2 torchrun job (gloo) checkpoints every
stage; a new job resumes from the middle checkpoint and ends with the parameters of the
uninterrupted job, bit for bit (model, AdamW moments, scheduler and data position restored),
with activation checkpointing on (selective, then full: recomputation changes no value). A
checkpoint does not load into another layout, and what pp does not support is refused with
what it does support (the FSDP2 policies under pp are covered by test_parity_pipeline_*)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from _dist import free_port
from mmfeed_trainer.loop import pp_checkpoint, train
from mmfeed_trainer.data import synthetic
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.loop.train import TrainConfig

STEPS, PP = 4, 2


def torchrun(args, *, nproc=PP, timeout=180):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "mmfeed_trainer", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def stage_params(directory):
    params = {}
    for s in range(PP):
        part = torch.load(os.path.join(directory, f"params-pp{s}.pt"))
        assert not set(part) & set(params), "the stages must hold disjoint parameters"
        params.update(part)
    return params


def test_pipeline_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    shards = tmp_path / "shards"
    synthetic.write_shards(synthetic.SynthConfig(seed=7, dp=1, micro_batches=3, pad_prob=0.3), str(shards), STEPS)
    common = ["--shards", str(shards), "--dp", "1", "--pp", str(PP), "--steps", str(STEPS), "--lr", "2e-3",
              "--warmup", "2", "--clip", "0.5", "--log-every", "1", "--ckpt-dir", str(tmp_path / "ckpt"),
              "--ckpt-every", "2"]

    whole = torchrun(common + ["--ac", "selective", "--save-params", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr[-4000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step-00000002", "step-00000004"]
    (tmp_path / "ckpt" / "latest").write_text("step-00000002")  # as if the job had died after step 2

    resumed = torchrun(common + ["--ac", "full", "--save-params", str(tmp_path / "resumed"),
                                 "--log-ids", str(tmp_path / "ids")])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr and "at step 2" in resumed.stderr
    lines = (tmp_path / "ids" / "ids-rank000.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 3], "stage 0 resumes its data position"

    got, want = stage_params(tmp_path / "resumed"), stage_params(tmp_path / "whole")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{name}: max diff {(got[name] - value).abs().max():.3g}"

    # Another layout is refused with both layouts named; so is a pipelined checkpoint without --pp.
    with pytest.raises(ValueError, match="was written with --pp 2: resume it with the same --dp 1 --pp 2"):
        train.run(TrainConfig(shards=str(shards), steps=STEPS, ckpt_dir=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match=r"dp, mp, pp, fsdp = \(1, 1, 2, False\); this run has \(2, 1, 2, True\)"):
        pp_checkpoint.extras(str(tmp_path / "ckpt" / "step-00000004"), ParallelDims(dp=2, pp=2, world_size=4, fsdp=True))


@pytest.mark.parametrize("flags,named", [
    (dict(allow_resize=True), "--allow-resize"),
    (dict(resize_vocab=True), "--resize-vocab"),
])
def test_what_pp_does_not_support_is_refused_naming_what_it_does(flags, named):
    cfg = TrainConfig(synthetic=True, dp=2, pp=2, **flags)
    with pytest.raises(ValueError) as err:
        cfg.validate()
    assert f"{named} not supported with --pp > 1" in str(err.value)
    assert "--ckpt-dir (save and resume in the same layout)" in str(err.value)
    assert "--ac none|selective|full" in str(err.value)


def test_fsdp_policies_under_pp_need_fsdp():
    TrainConfig(synthetic=True, dp=2, pp=2, fsdp=True, mixed_precision=True, cpu_offload=True).validate()
    with pytest.raises(ValueError, match="FSDP2 policies: they need --fsdp with dp > 1"):
        TrainConfig(synthetic=True, dp=2, pp=2, mixed_precision=True).validate()


def test_pp_with_mp_and_mp_above_two_are_refused():
    with pytest.raises(ValueError, match="mp"):
        TrainConfig(synthetic=True, dp=1, mp=2, pp=2).validate()
    with pytest.raises(ValueError, match="mp must be 1 or 2, got 4"):
        TrainConfig(synthetic=True, dp=1, mp=4).validate()
