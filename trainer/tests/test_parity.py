"""Parity: a dp x mp run (DDP or FSDP2, gloo on CPU) updates the parameters like one process
on the same global batches -- unequal per-rank batch sizes, zero-weight samples, two
micro-batches per step, active gradient clipping, 3 AdamW steps.

float32 (the brief's bar): the whole parameter vector within relative error 1e-5, every
tensor within 1e-3 (zero-initialised biases are measured against their few updates, and
Adam turns the rounding noise of near-zero gradient entries into full-size steps), losses
and whole-model gradient norms within 1e-5. float64 isolates logic from rounding: every
tensor within 1e-9.
"""

import pytest
import torch

import _p2p
import _parity
from _dist import run_world

WORLD = 4
F32, F64 = torch.float32, torch.float64
SCENARIOS = [(2, 2, False, F32), (2, 2, True, F32), (4, 1, False, F32), (4, 1, True, F32),
             (2, 2, False, F64), (2, 2, True, F64)]
# Packed micro-batches (batches.pack) against the same padded single-process reference.
PACKED = [(2, 2, False, F64, True), (2, 2, True, F64, True)]
PACKED_TOLERANCE = 1e-6
TOLERANCE = {F32: {"global": 1e-5, "tensor": 1e-3, "scalar": 1e-5},
             F64: {"global": 1e-9, "tensor": 1e-9, "scalar": 1e-9}}


@pytest.fixture(scope="module")
def world_runs(tmp_path_factory):
    """One spawned world of 4 processes trains every scenario (saves process start-ups),
    recording every point-to-point op (``test_p2p_pairs_agree``)."""
    outdir = tmp_path_factory.mktemp("parity")
    run_world(_parity.parity_worker, WORLD, args=(SCENARIOS + PACKED, str(outdir)), timeout=400,
              p2p_dir=str(outdir / "p2p"))
    return outdir


@pytest.fixture(scope="module")
def references():
    return {(dp, dtype): _parity.reference_run(dp, dtype) for dp, _, _, dtype in SCENARIOS}


@pytest.mark.parametrize("dp,mp,fsdp,dtype", SCENARIOS, ids=[_parity.scenario_name(*s) for s in SCENARIOS])
def test_parity_hybrid(world_runs, references, dp, mp, fsdp, dtype):
    tol = TOLERANCE[dtype]
    got, got_losses, got_norms = _parity.load_run(str(world_runs), dp, mp, fsdp, dtype)
    want, want_losses, want_norms = references[(dp, dtype)]
    assert sorted(got) == sorted(want), "parameter names differ from the single-process model"
    err = _parity.global_rel_error(got, want)
    assert err < tol["global"], f"whole model: relative error {err:.3g}, want < {tol['global']}"
    err, name = _parity.max_rel_error(got, want)
    assert err < tol["tensor"], f"{name}: relative error {err:.3g}, want < {tol['tensor']}"
    assert got_losses == pytest.approx(want_losses, rel=tol["scalar"]), f"losses {got_losses}, want {want_losses}"
    # Adam is nearly invariant to the gradient's scale: the norms catch a wrong dp reduction.
    for mp_rank, norms in enumerate(got_norms):
        assert norms == pytest.approx(want_norms, rel=tol["scalar"]), \
            f"mp rank {mp_rank}: grad norms {norms}, want {want_norms}"
    moved, _ = _parity.max_rel_error(want, _parity.reference_run_initial(dtype))
    assert moved > 1e-3, "parameters did not move: the test would pass without training"


@pytest.mark.parametrize("dp,mp,fsdp,dtype,pack", PACKED, ids=[_parity.scenario_name(*s) for s in PACKED])
def test_parity_packed_hybrid(world_runs, references, dp, mp, fsdp, dtype, pack):
    """Modality parallelism on packed micro-batches trains like one process on padded ones."""
    tol = PACKED_TOLERANCE
    got, got_losses, got_norms = _parity.load_run(str(world_runs), dp, mp, fsdp, dtype, pack)
    want, want_losses, want_norms = references[(dp, dtype)]
    assert sorted(got) == sorted(want)
    err = _parity.global_rel_error(got, want)
    assert err < tol, f"whole model: relative error {err:.3g}, want < {tol}"
    err, name = _parity.max_rel_error(got, want)
    assert err < tol, f"{name}: relative error {err:.3g}, want < {tol}"
    assert got_losses == pytest.approx(want_losses, rel=tol)
    for norms in got_norms:
        assert norms == pytest.approx(want_norms, rel=tol)


def test_p2p_pairs_agree(world_runs):
    """Every send of the mp feature exchange, forward and backward, meets a receive of the same
    shape and dtype on its peer, in the same order (``_p2p``: NCCL would hang or read garbage)."""
    found, total = _p2p.mismatches(str(world_runs / "p2p"), WORLD)
    assert found == []
    assert total > 0, "the mp 2 scenarios exchanged nothing"
