"""Memory and speed options (``blockwrap``, FSDP2 policies) on CPU.

* activation checkpointing (full, selective): same gradients as no AC, fewer saved bytes
  (full) / the policy both saves and recomputes ops (selective);
* torch.compile per block: same gradients as eager (backend aot_eager: the dynamo trace and
  AOT autograd path of inductor without its C++ build, which takes minutes on a loaded CPU);
* in a 2-process gloo world (dp 2): FSDP2 + full AC + CPU offload, DDP + selective AC and
  FSDP2 + per-block compile (aot_eager) match one process on the global batch (relative error < 1e-5); FSDP2 mixed precision runs the
  blocks in bf16, keeps fp32 master parameters and tracks the fp32 losses within bf16 rounding.
"""

import os

import pytest
import torch
import torch.distributed as dist

import _parity
from _dist import run_world
from mmfeed_trainer.parallel import blockwrap, optim
from mmfeed_trainer.models import config, losses
from mmfeed_trainer.data import synthetic
from mmfeed_trainer.loop.checkpoint import full_model_state
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ParallelConfig, Stage, parallelize
from mmfeed_trainer.parallel.step import train_step


def _micro_batch():
    return _parity._batch(synthetic.step_records(_parity.synth_cfg(1), 0, 0)[0], "full", torch.float32)


def _grads(ac: str = "none", compile_backend: str | None = None, policy_calls: list | None = None):
    """Gradients of one micro-batch's loss and the bytes autograd saved for backward."""
    torch.manual_seed(_parity.SEED)
    stage = Stage(MMModel(config.tiny()), "full")
    blockwrap.apply_ac(stage, ac)
    if compile_backend:
        blockwrap.apply_compile(stage, backend=compile_backend)
    mb, saved = _micro_batch(), [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(mb)
        loss = (losses.itc_sum(out["img_emb"], out["txt_emb"], mb.weight, out["logit_scale"])
                + losses.itm_sum(out["itm_logits"], mb.weight, mb.neg_text))
    loss.backward()
    return {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}, saved[0]


def _assert_same(got: dict, want: dict, tol: float) -> None:
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        err = float((got[name] - ref).norm() / ref.norm().clamp(min=1e-30))
        assert err <= tol, f"{name}: relative error {err:.3g}"


def test_ac_full_same_gradients_less_memory():
    want, saved_none = _grads("none")
    got, saved_full = _grads("full")
    _assert_same(got, want, 0.0)
    assert saved_full < saved_none / 4, f"full AC saved {saved_full} bytes, no AC {saved_none}"


@pytest.mark.filterwarnings("ignore:A saved_tensors_hooks context")
def test_ac_selective_same_gradients_and_recomputes(monkeypatch):
    decisions = []
    policy = blockwrap._selective_policy

    def counting(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if not ctx.is_recompute:
            decisions.append(decision)
        return decision
    monkeypatch.setattr(blockwrap, "_selective_policy", counting)
    want, _ = _grads("none")
    got, _ = _grads("selective")
    _assert_same(got, want, 0.0)
    kinds = {d.name for d in decisions}
    assert kinds == {"MUST_SAVE", "PREFER_RECOMPUTE"}, kinds


def test_ac_unknown_mode():
    with pytest.raises(ValueError, match="none.*selective.*full"):
        blockwrap.apply_ac(Stage(MMModel(config.tiny()), "full"), "some")


def test_compile_per_block_same_gradients():
    torch._dynamo.reset()
    want, _ = _grads("none")
    got, _ = _grads("none", compile_backend="aot_eager")
    _assert_same(got, want, 1e-6)


def test_fsdp_policies_need_fsdp():
    dims = ParallelDims(dp=1, mp=1, world_size=1)
    for cfg in (ParallelConfig(mixed_precision=True), ParallelConfig(fsdp=True, cpu_offload=True)):
        with pytest.raises(ValueError, match="need --fsdp with dp > 1"):
            parallelize(MMModel(config.tiny()), dims=dims, cfg=cfg)


SCENARIOS = {
    "fsdp-ac-full-offload": ParallelConfig(fsdp=True, ac="full", cpu_offload=True),
    "ddp-ac-selective": ParallelConfig(ac="selective"),
    "fsdp-compile": ParallelConfig(fsdp=True, compile=True, compile_backend="aot_eager"),
    "fsdp-bf16": ParallelConfig(fsdp=True, mixed_precision=True),
}


def _worker(rank: int, world: int, outdir: str) -> None:
    for name, pcfg in SCENARIOS.items():
        dims = ParallelDims(dp=world, mp=1, world_size=world, fsdp=pcfg.fsdp)
        dims.build_mesh("cpu")
        torch.manual_seed(_parity.SEED)
        module = parallelize(MMModel(_parity.model_cfg()), dims=dims, cfg=pcfg)
        block_dtypes = []
        first = module.vision.blocks[0] if pcfg.fsdp else module.module.vision.blocks[0]
        first.register_forward_pre_hook(lambda _m, args: block_dtypes.append(args[0].dtype))
        ocfg = _parity.optim_cfg()
        opt, sched = optim.build_optimizer(module, ocfg)
        step_losses = []
        for step in range(_parity.STEPS):
            mbs = [_parity._batch(r, dims.role, torch.float32)
                   for r in synthetic.step_records(_parity.synth_cfg(world), step, dims.dp_rank)]
            stats = train_step(module, opt, sched, mbs, dims=dims, device=torch.device("cpu"),
                               max_grad_norm=ocfg.max_grad_norm)
            loss = stats.loss.clone()
            dist.all_reduce(loss, group=dims.dp_group())
            step_losses.append(float(loss))
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        torch._dynamo.utils.counters.clear()
        local_dtypes = {str(p.to_local().dtype if hasattr(p, "to_local") else p.dtype) for p in module.parameters()}
        state = full_model_state(module)
        if rank == 0:
            torch.save({"params": state, "losses": step_losses, "block_dtypes": sorted({str(d) for d in block_dtypes}),
                        "param_dtypes": sorted(local_dtypes), "graphs": graphs}, os.path.join(outdir, f"{name}.pt"))
        dist.barrier()


@pytest.fixture(scope="module")
def world_runs(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("memory")
    run_world(_worker, 2, args=(str(outdir),), timeout=300)
    reference = _parity.reference_run(2, torch.float32)
    return {name: torch.load(os.path.join(outdir, f"{name}.pt")) for name in SCENARIOS}, reference


@pytest.mark.parametrize("name", ["fsdp-ac-full-offload", "ddp-ac-selective", "fsdp-compile"])
def test_parity_memory_options(world_runs, name):
    runs, (want, want_losses, _) = world_runs
    got = runs[name]
    err = _parity.global_rel_error(got["params"], want)
    assert err < 1e-5, f"{name}: whole model relative error {err:.3g}"
    assert got["losses"] == pytest.approx(want_losses, rel=1e-5)
    assert got["block_dtypes"] == ["torch.float32"]
    assert (got["graphs"] > 0) == SCENARIOS[name].compile, f"{name}: {got['graphs']} compiled graphs"


def test_fsdp_mixed_precision_bf16(world_runs):
    runs, (want, want_losses, _) = world_runs
    got = runs["fsdp-bf16"]
    assert got["block_dtypes"] == ["torch.bfloat16"], "blocks did not run in bf16"
    assert got["param_dtypes"] == ["torch.float32"], "sharded (master) parameters must stay fp32"
    assert got["losses"] == pytest.approx(want_losses, rel=2e-2)
    assert got["losses"] != pytest.approx(want_losses, rel=1e-6), "bf16 run equals fp32: policy not applied"
    err = _parity.global_rel_error(got["params"], want)
    assert err < 1e-2, f"whole model relative error {err:.3g} vs the fp32 run"


def test_cli_fsdp_policy_without_fsdp_exits_2(capsys, monkeypatch):
    from mmfeed_trainer.__main__ import main
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--synthetic", "--steps", "1", "--mixed-precision"]) == 2
    assert "--mixed-precision are FSDP2 policies: they need --fsdp with dp > 1" in capsys.readouterr().err


def test_cli_short_run_with_selective_ac(capsys, monkeypatch):
    import json
    from mmfeed_trainer.__main__ import main
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["--synthetic", "--steps", "2", "--log-every", "1", "--ac", "selective"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and all(loss == loss for loss in summary["losses"])


def test_cli_mp_above_2_says_what_is_supported(capsys, monkeypatch):
    from mmfeed_trainer.__main__ import main
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert main(["--synthetic", "--steps", "1", "--mp", "4", "--dp", "1"]) == 2
    err = capsys.readouterr().err
    assert "mp must be 1 or 2, got 4" in err and "tensor parallelism inside a tower (mp > 2) is not implemented" in err
