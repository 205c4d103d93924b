"""Packed micro-batches (``batches.pack``, ``--pack``) compute what the padded ones do.

* single process, float64: for the same samples (dynamic resolution, zero-weight padding
  samples, an empty caption, grids larger than the position table) the packed forward and
  backward give the same per-sample embeddings, ITM logits, loss and gradients as the
  padded path, relative error < 1e-6;
* dp 2 x mp 2 (modality parallelism) on DDP and FSDP2, gloo, float64: 3 AdamW steps on
  packed micro-batches land on the parameters, losses and gradient norms of the padded
  single-process reference, relative error < 1e-6 (``test_parity.py``,
  ``test_parity_packed_hybrid``: it shares that module's world of processes).
"""

import pytest
import torch

from mmfeed_trainer.data import batches, synthetic
from mmfeed_trainer.models import config, losses
from mmfeed_trainer.models.model import MMModel

F64 = torch.float64
TOL = 1e-6
CPU = torch.device("cpu")


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach(), want.detach()
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


def _padded_out(model, mb):
    return model(mb.pixel_values, mb.pixel_shape, mb.input_ids, mb.lengths, mb.neg_text, mb.neg_image)


def _loss(out, mb):
    return (losses.itc_sum(out.img_emb, out.txt_emb, mb.weight, out.logit_scale)
            + losses.itm_sum(out.itm_logits, mb.weight, mb.neg_text)) / mb.weight.sum()


def _batch(grids, max_grid=32, seed=3):
    cfg = synthetic.SynthConfig(seed=seed, min_samples=6, max_samples=6, pad_prob=0.3, grids=grids, max_text=20)
    mb = batches.to_device(batches.record_to_batch(synthetic.micro_batch(cfg, 0, 0, 0)), CPU)
    mb.lengths[1] = 0  # an empty caption: the padded path keeps one pad token, so must packing
    mb.pixel_values, mb.weight = mb.pixel_values.double(), mb.weight.double()
    return mb


@pytest.mark.parametrize("grids,max_grid", [(((1, 1), (1, 3), (2, 2), (3, 1)), 32),
                                            (((1, 1), (2, 3), (5, 4)), 3)],
                         ids=["within-table", "beyond-table"])
def test_parity_packed_single_process(grids, max_grid):
    torch.manual_seed(0)
    model = MMModel(config.model_config("tiny", max_grid=max_grid)).double()
    mb = _batch(grids)
    padded = _padded_out(model, mb)
    _loss(padded, mb).backward()
    want_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    packed_mb = batches.pack(mb, model.cfg.patch_size)
    assert packed_mb.pixel_values is None and packed_mb.attention_mask is None and packed_mb.input_ids.dim() == 1
    packed = model.forward_packed(packed_mb)
    loss = _loss(packed, mb)
    loss.backward()
    for name, got, want in [("img_emb", packed.img_emb, padded.img_emb), ("txt_emb", packed.txt_emb, padded.txt_emb),
                            ("itm_logits", packed.itm_logits, padded.itm_logits)]:
        assert rel(got, want) < TOL, f"{name}: relative error {rel(got, want):.3g}"
    assert rel(loss.detach(), _loss(padded, mb).detach()) < TOL
    assert want_grads.keys() == {k for k, p in model.named_parameters() if p.grad is not None}
    for name, want in want_grads.items():
        got = dict(model.named_parameters())[name].grad
        assert rel(got, want) < TOL, f"grad {name}: relative error {rel(got, want):.3g}"


def test_pack_layout():
    """cu_seqlens_text / cu_seqlens_image / image_grid describe the concatenated samples."""
    mb = _batch(((1, 2), (2, 1)))
    p = batches.pack(mb, 16)
    counts = mb.lengths.clamp(min=1)
    assert p.cu_seqlens_text.tolist() == [0, *counts.cumsum(0).tolist()]
    assert p.input_ids.shape == (int(counts.sum()),)
    grid = mb.pixel_shape[:, 1:] // 16
    assert p.image_grid.tolist() == grid.tolist()
    assert p.cu_seqlens_image.tolist() == [0, *grid.prod(1).cumsum(0).tolist()]
    assert p.patches.shape == (int(grid.prod(1).sum()), 3 * 16 * 16)
    # each sample's first patch is its top-left 16 x 16 pixels
    for i in range(len(grid)):
        if grid[i].prod():
            first = p.patches[p.cu_seqlens_image[i]]
            torch.testing.assert_close(first, mb.pixel_values[i, :, :16, :16].reshape(-1))
    assert batches.pack(p, 16) is p


def test_service_default_grid_is_accepted():
    """serve's default --max-pixels (1,003,520) gives grids of about 62 x 62 patches."""
    torch.manual_seed(0)
    model = MMModel(config.tiny())
    img = torch.randn(1, 3, 62 * 16, 62 * 16)
    out = model.vision(img, torch.tensor([[3, 62 * 16, 62 * 16]]))
    assert torch.isfinite(out.emb).all()
    small = model.vision.grid_pos(2, 3)  # within the table: a plain lookup
    g = model.cfg.max_grid
    torch.testing.assert_close(small, model.vision.pos[1 + torch.tensor([0, 1, 2, g, g + 1, g + 2])])


def test_segment_attention_paths_match_the_dense_mask():
    """The CPU path (SDPA per segment) and the CUDA path (FlexAttention
    with a document block mask, run eagerly here) both give SDPA with the dense document mask,
    for self- and cross-attention packings."""
    import warnings

    from mmfeed_trainer.models.model import flex_segment_attention, segment_attention, segments
    torch.manual_seed(0)
    q_seg = torch.tensor([0, 0, 0, 1, 2, 2])
    kv_seg = torch.tensor([0, 1, 1, 1, 2, 2, 2, 2])
    for kseg in (q_seg, kv_seg):
        q = torch.randn(1, 2, q_seg.shape[0], 8)
        k, v = torch.randn(2, 1, 2, kseg.shape[0], 8).unbind(0)
        layout = [segments(torch.bincount(ids)) for ids in (q_seg, kseg)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is slow
            got = flex_segment_attention(q, k, v, *layout, compiled=False)
        dense = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=(q_seg[:, None] == kseg[None, :])[None, None])
        torch.testing.assert_close(got, dense)
        torch.testing.assert_close(segment_attention(q, k, v, *layout), dense)
