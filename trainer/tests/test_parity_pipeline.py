"""Parity of pipeline parallelism: dp 2 x pp 2 (gloo, 4 CPU processes), GPipe and 1F1B, DDP
and FSDP2 over dp, padded and packed micro-batches, updates the parameters like one process
on the global batches (unequal per-rank sample counts, zero-weight samples, three
micro-batches per step, active clipping, 3 AdamW steps): whole model within relative
error 1e-5 in float32, 1e-9 in float64 (packed: float64 against the padded reference
within 1e-6, as ``test_parity_packed_*``), losses and gradient norms (which span both
stages) too."""

import pytest
import torch

import _p2p
import _parity
import _parity_pipeline as pp_harness
from _dist import run_world
from mmfeed_trainer.parallel.pp import stage as pp_stage

DP, PP = 2, 2
F32, F64 = torch.float32, torch.float64
# float32 at the brief's bar (as test_parity_hybrid); float64 isolates the schedule's logic
# from rounding (1e-9), and the packed run is held to test_parity_packed_*'s 1e-6.
SCENARIOS = [("1f1b", False, F32, False), ("gpipe", False, F64, False), ("1f1b", True, F64, False),
             ("1f1b", False, F64, True)]
# The FSDP2 policies under pp (with activation checkpointing): CPU offload is exact (float32 at
# the brief's bar); bf16 mixed precision is held to the bar of test_memory's non-pipelined run.
POLICIES = [("1f1b", True, F32, False, "offload-acfull"), ("gpipe", True, F32, False, "bf16-acsel")]
TOLERANCE = {(F32, False): {"global": 1e-5, "tensor": 1e-3, "scalar": 1e-5},
             (F64, False): {"global": 1e-9, "tensor": 1e-9, "scalar": 1e-9},
             (F64, True): {"global": 1e-6, "tensor": 1e-6, "scalar": 1e-6}}


@pytest.fixture(scope="module")
def world_runs(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("parity_pipeline")
    run_world(pp_harness.worker, DP * PP, args=(DP, PP, SCENARIOS + POLICIES, str(outdir)), timeout=400,
              p2p_dir=str(outdir / "p2p"))
    return outdir


@pytest.fixture(scope="module")
def references():
    return {dtype: _parity.reference_run(DP, dtype, pp_harness.synth_cfg(DP)) for dtype in (F32, F64)}


@pytest.mark.parametrize("schedule,fsdp,dtype,pack", SCENARIOS,
                         ids=[pp_harness.scenario_name(*s) for s in SCENARIOS])
def test_parity_pipeline_dp2_pp2(world_runs, references, schedule, fsdp, dtype, pack):
    tol = TOLERANCE[(dtype, pack)]
    got, got_losses, got_norms = pp_harness.load_run(str(world_runs), PP, schedule, fsdp, dtype, pack)
    want, want_losses, want_norms = references[dtype]
    assert sorted(got) == sorted(want), "the stages together must hold exactly the model's parameters"
    err = _parity.global_rel_error(got, want)
    assert err < tol["global"], f"whole model: relative error {err:.3g}, want < {tol['global']}"
    err, name = _parity.max_rel_error(got, want)
    assert err < tol["tensor"], f"{name}: relative error {err:.3g}, want < {tol['tensor']}"
    assert got_losses == pytest.approx(want_losses, rel=tol["scalar"])
    for stage, norms in enumerate(got_norms):
        assert norms == pytest.approx(want_norms, rel=tol["scalar"]), f"stage {stage}: grad norms {norms}"
    moved, _ = _parity.max_rel_error(want, _parity.reference_run_initial(dtype))
    assert moved > 1e-3, "parameters did not move: the test would pass without training"


def test_parity_pipeline_dp2_pp2_cpu_offload_full_ac(world_runs, references):
    dtypes = {}
    got, got_losses, got_norms = pp_harness.load_run(str(world_runs), PP, *POLICIES[0], dtypes=dtypes)
    want, want_losses, want_norms = references[F32]
    assert sorted(got) == sorted(want)
    err = _parity.global_rel_error(got, want)
    assert err < 1e-5, f"whole model: relative error {err:.3g}"
    assert got_losses == pytest.approx(want_losses, rel=1e-5)
    for norms in got_norms:
        assert norms == pytest.approx(want_norms, rel=1e-5)
    assert dtypes["block_dtypes"] == ["torch.float32"]


def test_parity_pipeline_dp2_pp2_mixed_precision_selective_ac(world_runs, references):
    dtypes = {}
    got, got_losses, _ = pp_harness.load_run(str(world_runs), PP, *POLICIES[1], dtypes=dtypes)
    want, want_losses, _ = references[F32]
    assert dtypes["block_dtypes"] == ["torch.bfloat16"], "blocks did not run in bf16"
    assert dtypes["param_dtypes"] == ["torch.float32"], "sharded (master) parameters must stay fp32"
    assert got_losses == pytest.approx(want_losses, rel=2e-2)
    assert got_losses != pytest.approx(want_losses, rel=1e-6), "bf16 run equals fp32: policy not applied"
    err = _parity.global_rel_error(got, want)
    assert err < 1e-2, f"whole model relative error {err:.3g} vs the fp32 run"


@pytest.mark.parametrize("pp,stage,m,want", [
    (2, 0, 3, "F0 F1 B0 F2 B1 B2"),
    (2, 1, 3, "F0 B0 F1 B1 F2 B2"),
    (4, 0, 2, "F0 F1 B0 B1"),
    (4, 3, 2, "F0 B0 F1 B1"),
    (3, 1, 4, "F0 F1 B0 F2 B1 F3 B2 B3"),
])
def test_schedule_1f1b(pp, stage, m, want):
    assert " ".join(f"{k}{i}" for k, i in pp_stage.schedule("1f1b", pp, stage, m)) == want


def test_schedule_gpipe_and_unknown():
    assert pp_stage.schedule("gpipe", 2, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    with pytest.raises(ValueError, match="schedule"):
        pp_stage.schedule("zb", 2, 0, 2)


@pytest.mark.parametrize("n,pp,want", [(2, 2, [1, 1]), (5, 2, [3, 2]), (1, 2, [1, 0]), (12, 4, [3, 3, 3, 3])])
def test_split_blocks(n, pp, want):
    runs = pp_stage.split_blocks(n, pp)
    assert [len(r) for r in runs] == want
    assert [i for r in runs for i in r] == list(range(n))


def test_p2p_pairs_agree(world_runs):
    """Every stage-to-stage send (headers, activations, gradients) meets a receive of the same
    shape and dtype on its neighbour, in the same order (``_p2p``)."""
    found, total = _p2p.mismatches(str(world_runs / "p2p"), DP * PP)
    assert found == []
    assert total > 0


def test_first_stage_posts_its_warmup_sends_at_once(world_runs):
    """Stage 0 receives no activations, so the sends of its warm-up forwards must not wait for
    its first receive (the first backward's gradients, after the whole warm-up): the first
    call that carries its activations to stage 1 posts no receive, so stage 1 starts on
    micro-batch 0 while stage 0 computes micro-batch 1."""
    floats = {"torch.float32", "torch.float64", "torch.bfloat16"}
    for dp in range(DP):
        first, nxt = dp * PP, dp * PP + 1
        calls = _p2p.batch_calls(str(world_runs / "p2p"), first)
        carrying = [c for c in calls if any(k == "send" and peer == nxt and dt in floats for k, peer, _, dt, *_ in c)]
        assert carrying, f"rank {first}: no activations sent"
        assert [k for k, *_ in carrying[0]] == ["send"] * len(carrying[0]), \
            f"rank {first}: its first activations went out with a receive: {carrying[0]}"
