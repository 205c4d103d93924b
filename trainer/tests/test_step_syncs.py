"""No host syncs in a training step (docs/trainer.md, "No host syncs in the step").

A step must never wait for the device: every size it needs is known on the host when the batch
is packed (``layout``) and is passed down. Proof without a GPU: the whole step -- packing on
the device, forward, losses, backward, clipping, AdamW -- runs with every tensor on the
``meta`` device, which has no data, so every data-dependent host read (``.item()``,
``.tolist()``, ``int(t)``, ``bool(t)``, ``nonzero``, ``repeat_interleave`` without
``output_size``, ``torch.empty(t)``) raises there. ``SyncGuard`` catches the ones meta lets
through: a boolean index (its output size comes from the data) and a host value made into a
device tensor inside the step (a blocking host-to-device copy). Budget: zero. The training
loop synchronizes only at log steps (``test_loop_synchronizes_only_at_log_steps``).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mmfeed_trainer.data import batches, sources, synthetic
from mmfeed_trainer.models import config
from mmfeed_trainer.parallel import optim
from mmfeed_trainer.loop import train
from mmfeed_trainer.models import model as model_mod
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ParallelConfig, parallelize
from mmfeed_trainer.parallel.step import train_step

META = torch.device("meta")
_ATEN = torch.ops.aten
_INDEX_OPS = {_ATEN.index.Tensor, _ATEN.index_put.default, _ATEN.index_put_.default,
              _ATEN._index_put_impl_.default}
_COPY_OPS = {_ATEN._to_copy.default, _ATEN.copy_.default}


class SyncGuard(TorchDispatchMode):
    """Records the ops that would make an accelerator's host wait, among those meta runs."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                      for i in (args[1] or [])):
            self.syncs.append(f"{func}: boolean index")
        elif func is _ATEN.lift_fresh.default and out.device.type != "cpu":
            self.syncs.append(f"{func}: torch.tensor(host data) on the device")
        elif func in _COPY_OPS:
            src = args[1] if func is _ATEN.copy_.default else args[0]
            dst = args[0] if func is _ATEN.copy_.default else out
            if src.device.type == "cpu" and dst.device.type != "cpu" and src.dim() > 0:
                self.syncs.append(f"{func}: host-to-device copy of {tuple(src.shape)}")
        return out


def _meta_batches() -> list[batches.Batch]:
    """A step's micro-batches moved to the device (the prefetcher's copy, before the step)."""
    scfg = synthetic.SynthConfig(seed=4, min_samples=4, max_samples=6, pad_prob=0.3, max_text=20,
                                 grids=((1, 1), (1, 3), (2, 2), (3, 1)), dtype="uint8")
    return [batches.record_to_batch(record).to(META) for record in synthetic.step_records(scfg, 0, 0)]


def _mask_then_split(q, k, v, q_seg, kv_seg):
    """The CUDA path's document masks (``docmask``, built by ``segments``), then SDPA per segment."""
    assert kv_seg.mask is not None
    return model_mod.split_segment_attention(q, k, v, q_seg, kv_seg)


@pytest.mark.parametrize("pack,flex", [(False, False), (True, False), (True, True)],
                         ids=["padded", "packed", "packed-flex-masks"])
def test_step_has_no_host_syncs(pack, flex, monkeypatch):
    # The foreach norm and AdamW kernels run on meta; torch only lists CUDA-like devices as able.
    monkeypatch.setattr(torch.nn.utils.clip_grad, "_device_has_foreach_support", lambda device: True)
    if flex:  # build FlexAttention's block masks as on CUDA (the kernel itself needs a GPU)
        monkeypatch.setattr(model_mod, "flex_enabled", lambda t: True)
        monkeypatch.setattr(model_mod, "flex_segment_attention", _mask_then_split)
    cfg = config.tiny()
    with torch.device(META):
        model = MMModel(cfg)
    dims = ParallelDims()
    module = parallelize(model, dims=dims, cfg=ParallelConfig(), device=META)
    opt, sched = optim.build_optimizer(module, config.OptimConfig())
    mbs = _meta_batches()
    guard = SyncGuard()
    with guard:
        if pack:  # packing on the device (the prefetcher's, under CUDA) counts too
            mbs = [batches.pack(mb, cfg.patch_size) for mb in mbs]
        stats = train_step(module, opt, sched, mbs, dims=dims, device=META, max_grad_norm=1.0)
    assert guard.syncs == [], f"host syncs in a {'packed' if pack else 'padded'} step: {guard.syncs}"
    assert stats.loss.device == META and stats.grad_norm.device == META
    with pytest.raises(RuntimeError):  # the guard bites: reading the loss is a log step's sync
        float(stats.loss)


def test_guard_counts_what_meta_lets_through():
    x = torch.zeros(4, device=META)
    guard = SyncGuard()
    with guard:
        x[x > 0] = torch.ones(4, device=META)  # (a scalar would be masked_fill: no sync)
        torch.tensor([1, 2], device=META)
        torch.ones(3).to(META)
    assert len(guard.syncs) == 3, guard.syncs


def test_loop_synchronizes_only_at_log_steps(monkeypatch):
    """On CUDA the loop reads a step's figures (its wall time, the clock's events) only when
    a log step closes the window: one synchronize per log step, feedback for every step."""
    syncs, feedback = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    real_init = train.Window.__init__

    def cuda_window(self, device):
        real_init(self, device)
        self.cuda = True  # the CUDA schedule on the CPU (the clock itself stays a CPU clock)

    monkeypatch.setattr(train.Window, "__init__", cuda_window)
    monkeypatch.setattr(sources.SyntheticSource, "feedback", lambda self, data, **kw: feedback.append(data.step))
    result = train.run(train.TrainConfig(synthetic=True, steps=7, log_every=3,
                                         synth=synthetic.SynthConfig(micro_batches=1, max_samples=3)))
    assert result.steps_done == 7
    assert len(syncs) == 3, f"{len(syncs)} synchronizes for log steps 3, 6 and 7"
    assert feedback == list(range(7))


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_pipeline_stages_forward_without_host_syncs(pack):
    """Under pp the stages after the first take the segment sizes from the host layout stage 0
    sends with each micro-batch (``pipeline_link``: through its JSON encoding here), so
    neither stage's forward reads the device; without the layout a later stage must read
    the carried offsets (raises on meta)."""
    from mmfeed_trainer.parallel.pp import link as pp_link, stage as pp_stage
    cfg = config.tiny()
    with torch.device(META):
        first, last = (pp_stage.PipelineStage(MMModel(cfg), s, 2) for s in (0, 1))
    mbs = _meta_batches()
    guard = SyncGuard()
    with guard:
        if pack:
            mbs = [batches.pack(mb, cfg.patch_size) for mb in mbs]
        for mb in mbs:
            carry = first(mb)
            carry["layout"] = pp_link.decode_layout(pp_link.encode_layout(carry["layout"]))
            out = last(carry)
    assert guard.syncs == [], f"host syncs in the stages' forward: {guard.syncs}"
    assert out["img_emb"].device == META
    if pack:
        carry["layout"] = None
        with pytest.raises(RuntimeError):
            last(carry)
