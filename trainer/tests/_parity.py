"""Parity harness: a (dp, mp) world and a single process train on the same global batches.

``parity_worker`` runs in each process of a spawned world and trains every scenario in turn
on synthetic records (unequal per-rank sample counts, zero-weight samples), then saves the
full parameters of each mp rank. ``reference_run`` trains the plain ``MMModel`` in this
process on the concatenation of the dp ranks' records, with the per-rank ITM negative
segments, and torch's own ``clip_grad_norm_``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from mmfeed_trainer.data import batches, synthetic
from mmfeed_trainer.models import config, losses
from mmfeed_trainer.parallel import optim
from mmfeed_trainer.loop.checkpoint import full_model_state
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ParallelConfig, parallelize
from mmfeed_trainer.parallel.step import train_step

SEED = 1234
STEPS = 3
CPU = torch.device("cpu")


def model_cfg() -> config.ModelConfig:
    return config.tiny()


def optim_cfg() -> config.OptimConfig:
    # max_grad_norm small enough that clipping is active: the norm spans dp shards and mp ranks.
    return config.OptimConfig(lr=2e-3, warmup_steps=1, total_steps=10, max_grad_norm=0.5)


def synth_cfg(dp: int) -> synthetic.SynthConfig:
    return synthetic.SynthConfig(seed=7, dp=dp, micro_batches=2, min_samples=1, max_samples=5, pad_prob=0.3)


def scenario_name(dp: int, mp: int, fsdp: bool, dtype: torch.dtype, pack: bool = False) -> str:
    packed = "-packed" if pack else ""
    return f"{'fsdp' if fsdp else 'ddp'}-dp{dp}-mp{mp}-{str(dtype).removeprefix('torch.')}{packed}"


def _batch(record, role: str, dtype: torch.dtype, pack: bool = False) -> batches.Batch:
    mb = batches.record_to_batch(record, role=role).to(CPU)
    if mb.pixel_values is not None:
        mb.pixel_values = mb.pixel_values.to(dtype)
    mb.weight = mb.weight.to(dtype)
    return batches.pack(mb, model_cfg().patch_size) if pack else mb


def parity_worker(rank: int, world: int, scenarios: list[tuple], outdir: str) -> None:
    """Train every scenario (dp, mp, fsdp, dtype[, pack]) in turn; pack: packed micro-batches."""
    for dp, mp, fsdp, dtype, *rest in scenarios:
        pack = bool(rest and rest[0])
        dims = ParallelDims(dp=dp, mp=mp, world_size=world, fsdp=fsdp)
        dims.build_mesh("cpu")
        torch.manual_seed(SEED)
        model = MMModel(model_cfg()).to(dtype)
        module = parallelize(model, dims=dims, cfg=ParallelConfig(fsdp=fsdp, exchange_dtype=dtype), device=CPU)
        ocfg = optim_cfg()
        opt, sched = optim.build_optimizer(module, ocfg)
        scfg = synth_cfg(dp)
        step_losses, norms = [], []
        for step in range(STEPS):
            mbs = [_batch(r, dims.role, dtype, pack) for r in synthetic.step_records(scfg, step, dims.dp_rank)]
            stats = train_step(module, opt, sched, mbs, dims=dims, device=CPU, max_grad_norm=ocfg.max_grad_norm)
            norms.append(float(stats.grad_norm))
            if stats.loss is not None:
                loss = stats.loss.clone()
                if dims.dp_group() is not None:
                    dist.all_reduce(loss, group=dims.dp_group())
                step_losses.append(float(loss))
        state = full_model_state(module)
        if dims.dp_rank == 0:
            name = scenario_name(dp, mp, fsdp, dtype, pack)
            torch.save({"params": state, "losses": step_losses, "grad_norms": norms},
                       os.path.join(outdir, f"{name}-mp{dims.mp_rank}.pt"))
        dist.barrier()


def reference_run(dp: int, dtype: torch.dtype, scfg: synthetic.SynthConfig | None = None
                  ) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """Single process, whole global batch of ``dp`` ranks per micro-batch (``scfg``: the
    synthetic data, default ``synth_cfg(dp)``)."""
    torch.manual_seed(SEED)
    model = MMModel(model_cfg()).to(dtype)
    ocfg = optim_cfg()
    opt, sched = optim.build_optimizer(model, ocfg)
    scfg = scfg or synth_cfg(dp)
    step_losses, norms = [], []
    for step in range(STEPS):
        per_rank = [synthetic.step_records(scfg, step, r) for r in range(dp)]
        mbs = []
        for m in range(scfg.micro_batches):
            records = [per_rank[r][m] for r in range(dp)]
            mb = _batch(batches.concat_records(records), "full", dtype)
            segments = [rec.num_rows for rec in records]
            mb.neg_text, mb.neg_image = losses.itm_negatives(mb.weight, segments)
            mbs.append(mb)
        total_w = torch.stack([mb.weight.sum() for mb in mbs]).sum()
        step_loss = 0.0
        for mb in mbs:
            out = model(mb.pixel_values, mb.pixel_shape, mb.input_ids, mb.lengths,
                        mb.neg_text, mb.neg_image)
            loss = (losses.itc_sum(out.img_emb, out.txt_emb, mb.weight, out.logit_scale)
                    + losses.itm_sum(out.itm_logits, mb.weight, mb.neg_text)) / total_w
            loss.backward()
            step_loss += float(loss.detach())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), ocfg.max_grad_norm)))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step_losses.append(step_loss)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, step_losses, norms


def load_run(outdir: str, dp: int, mp: int, fsdp: bool, dtype: torch.dtype,
             pack: bool = False) -> tuple[dict[str, torch.Tensor], list[float], list[list[float]]]:
    """Merge the mp ranks' saved parameters; losses come from mp rank 0 (the loss rank);
    the grad norms of every mp rank (each must report the whole model's norm)."""
    params: dict[str, torch.Tensor] = {}
    step_losses: list[float] = []
    norms = []
    for r in range(mp):
        saved = torch.load(os.path.join(outdir, f"{scenario_name(dp, mp, fsdp, dtype, pack)}-mp{r}.pt"))
        params.update(saved["params"])
        step_losses = step_losses or saved["losses"]
        norms.append(saved["grad_norms"])
    return params, step_losses, norms


def max_rel_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor ||got - want|| / ||want|| and the tensor's name."""
    worst, name = 0.0, ""
    for key, ref in want.items():
        err = float((got[key].double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30))
        if err > worst:
            worst, name = err, key
    return worst, name


def global_rel_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """||got - want|| / ||want|| over all parameters as one vector."""
    num = sum(float((got[k].double() - v.double()).pow(2).sum()) for k, v in want.items())
    den = sum(float(v.double().pow(2).sum()) for v in want.values())
    return (num / den) ** 0.5


def reference_run_initial(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    torch.manual_seed(SEED)
    return {k: v.detach().clone() for k, v in MMModel(model_cfg()).to(dtype).state_dict().items()}
