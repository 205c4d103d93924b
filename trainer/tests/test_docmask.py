"""Packed attention's FlexAttention masks (the CUDA path), run on the CPU.

* ``docmask.document_mask`` (built from the segment layout) equals ``create_block_mask`` of
  the same document mask, block for block, and FlexAttention with it equals SDPA with the
  dense mask, for self- and cross-attention packings;
* a packed forward builds one mask per tower and mask kind (vision, text, the fusion's self-
  and cross-attention: 4) per micro-batch, not one per layer (it built 3 + 3 + 2 x 2 = 10 in
  the model here, 36 in the base model), and gives the embeddings of the CPU path (SDPA per
  segment); forward and backward under full activation checkpointing build no more, with the
  CPU path's gradients (a dense SDPA stand-in for FlexAttention, which has no CPU backward);
* FlexAttention compiled (aot_eager, dynamic) over those masks does not recompile after a
  warm-up, on micro-batches of other sample counts, lengths and grids.

``flex_enabled`` is turned on for the CPU here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from mmfeed_trainer.data import batches, synthetic
from mmfeed_trainer.parallel import blockwrap
from mmfeed_trainer.models import config, docmask, model

CPU = torch.device("cpu")


def layout(counts: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))


@pytest.mark.parametrize("q_counts,kv_counts", [
    ([3, 1, 2], [1, 3, 4]),                   # everything inside one block
    ([130, 1, 300, 127, 128], None),          # self-attention across block edges, full blocks
    ([40, 77, 12, 1, 60], [197, 257, 197, 141, 197]),  # captions over images (fusion)
])
def test_document_mask_equals_create_block_mask(q_counts, kv_counts):
    kv_counts = kv_counts or q_counts
    q_ids, kv_ids = layout(q_counts), layout(kv_counts)
    mask = docmask.document_mask(q_ids, kv_ids, len(q_counts))
    qp, kp = mask.seq_lengths
    assert qp % docmask.BLOCK == 0 and kp % docmask.BLOCK == 0 and qp >= len(q_ids) and kp >= len(kv_ids)
    q_pad = F.pad(q_ids, (0, qp - len(q_ids)), value=len(q_counts))
    kv_pad = F.pad(kv_ids, (0, kp - len(kv_ids)), value=len(q_counts))
    want = create_block_mask(lambda b, h, qi, ki: q_pad[qi] == kv_pad[ki], None, None, qp, kp, device="cpu")
    assert torch.equal(mask.to_dense(), want.to_dense())
    assert torch.equal(mask.kv_num_blocks, want.kv_num_blocks)
    assert torch.equal(mask.full_kv_num_blocks, want.full_kv_num_blocks)
    torch.manual_seed(0)
    q = torch.randn(1, 2, len(q_ids), 8, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, len(kv_ids), 8, dtype=torch.float64).unbind(0)
    got = model.flex_segment_attention(q, k, v, model.Segments(q_ids, q_counts),
                                       model.Segments(kv_ids, kv_counts, mask), compiled=False)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=(q_ids[:, None] == kv_ids[None, :])[None, None])
    torch.testing.assert_close(got, dense)


def packed_batch(seed: int, samples: int, grids, max_text: int):
    cfg = synthetic.SynthConfig(seed=seed, min_samples=samples, max_samples=samples, pad_prob=0.2, grids=grids,
                                max_text=max_text)
    mb = batches.to_device(batches.record_to_batch(synthetic.micro_batch(cfg, 0, 0, 0)), CPU)
    return batches.pack(mb, 16)


MICRO_BATCHES = [(3, 4, ((1, 1), (2, 3)), 12), (4, 7, ((2, 2), (3, 1), (9, 9)), 40), (5, 3, ((4, 4),), 77),
                 (6, 9, ((1, 2), (8, 9), (2, 1)), 30), (7, 5, ((5, 6), (1, 1)), 20)]
"""(seed, samples, grids, caption length): packed lengths from a few tokens to over a block."""


@pytest.fixture
def deep_model():
    torch.manual_seed(0)
    return model.MMModel(config.model_config("tiny", vision_layers=3, text_layers=3, fusion_layers=2)).eval()


@pytest.fixture
def masks_built(monkeypatch):
    """Counts the masks built (the sizes of each), FlexAttention eager on the CPU."""
    built = []

    def counted(q_ids, kv_ids, segments):
        built.append((len(q_ids), len(kv_ids)))
        return docmask.document_mask(q_ids, kv_ids, segments)

    monkeypatch.setattr(model, "document_mask", counted)
    monkeypatch.setattr(model, "_flex", flex_attention)
    return built


def test_packed_forward_builds_one_mask_per_tower_and_kind(deep_model, masks_built, monkeypatch):
    want = {}
    with torch.no_grad():
        for seed, n, grids, text in MICRO_BATCHES[:2]:
            want[seed] = deep_model.forward_packed(packed_batch(seed, n, grids, text))
    assert masks_built == [], "the CPU path (SDPA per segment) builds no mask"
    monkeypatch.setattr(model, "flex_enabled", lambda t: True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is slow
        for seed, n, grids, text in MICRO_BATCHES[:2]:
            masks_built.clear()
            got = deep_model.forward_packed(packed_batch(seed, n, grids, text))
            assert len(masks_built) == 4, masks_built  # vision, text, fusion self, fusion cross
            for name in ("img_emb", "txt_emb", "itm_logits"):
                torch.testing.assert_close(getattr(got, name), getattr(want[seed], name), rtol=1e-4, atol=1e-5)


def dense_flex(q, k, v, *, block_mask):
    """FlexAttention's result from SDPA with the block mask's own mask_mod made dense: a
    stand-in with a backward on the CPU (FlexAttention has none there)."""
    qp, kp = block_mask.seq_lengths
    dense = block_mask.mask_mod(0, 0, torch.arange(qp)[:, None], torch.arange(kp)[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense[None, None])


@pytest.mark.parametrize("ac", ["none", "full"])
def test_packed_backward_under_ac_builds_no_more_masks(deep_model, masks_built, monkeypatch, ac):
    """Forward and backward, full AC recomputing every block: still 4 masks per micro-batch
    (the blocks get them as inputs), and the gradients of the CPU path."""
    seed, n, grids, text = MICRO_BATCHES[1]
    deep_model.train()
    out = deep_model.forward_packed(packed_batch(seed, n, grids, text))
    (out.img_emb.sum() + out.txt_emb.sum() + out.itm_logits.sum()).backward()
    want = {k: p.grad.clone() for k, p in deep_model.named_parameters() if p.grad is not None}
    deep_model.zero_grad(set_to_none=True)
    monkeypatch.setattr(model, "flex_enabled", lambda t: True)
    monkeypatch.setattr(model, "_flex", dense_flex)
    assert blockwrap.apply_ac(deep_model, ac) == (0 if ac == "none" else 3 + 3 + 2)
    out = deep_model.forward_packed(packed_batch(seed, n, grids, text))
    (out.img_emb.sum() + out.txt_emb.sum() + out.itm_logits.sum()).backward()
    assert len(masks_built) == 4, masks_built
    assert want.keys() == {k for k, p in deep_model.named_parameters() if p.grad is not None}
    for name, p in deep_model.named_parameters():
        if name in want:
            # atol on the tensor's scale: an entry near 0 of a gradient whose entries reach 20
            # carries float32 rounding of ~1e-6 from the other summation order (it failed on an
            # AVX-512 Xeon by 1.09e-6 at one entry of 4,096 with a flat 1e-6).
            scale = max(1.0, float(want[name].abs().max()))
            torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_packed_flex_attention_does_not_recompile(deep_model, masks_built, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(model, "flex_enabled", lambda t: True)
    monkeypatch.setattr(model, "_flex", torch.compile(flex_attention, dynamic=True, backend="aot_eager"))
    with torch.no_grad():
        for seed, n, grids, text in MICRO_BATCHES[:2]:  # warm-up: compiles
            deep_model.forward_packed(packed_batch(seed, n, grids, text))
        with torch.compiler.set_stance("fail_on_recompile"):
            for seed, n, grids, text in MICRO_BATCHES[2:]:
                out = deep_model.forward_packed(packed_batch(seed, n, grids, text))
                assert torch.isfinite(out.itm_logits).all()
