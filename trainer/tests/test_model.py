"""Single-process model and loss properties: dynamic resolution, padding samples, seeds."""

import pytest
import torch

from mmfeed_trainer.data import batches, synthetic
from mmfeed_trainer.models import config, losses
from mmfeed_trainer.models.model import MMModel, flops_per_sample

CPU = torch.device("cpu")


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return MMModel(config.tiny())


def batch(seed=0, **kw):
    cfg = synthetic.SynthConfig(seed=seed, min_samples=4, max_samples=6, **kw)
    return batches.to_device(batches.record_to_batch(synthetic.micro_batch(cfg, 0, 0, 0)), CPU)


def loss_of(model, mb):
    out = model(mb.pixel_values, mb.pixel_shape, mb.input_ids, mb.lengths, mb.neg_text, mb.neg_image)
    total = mb.weight.sum()
    return (losses.itc_sum(out.img_emb, out.txt_emb, mb.weight, out.logit_scale)
            + losses.itm_sum(out.itm_logits, mb.weight, mb.neg_text)) / total


def test_image_embedding_does_not_depend_on_batch_padding():
    """A 1x1-grid image gives the same embedding alone and padded next to a 2x2-grid image."""
    model = tiny_model()
    img = torch.randn(1, 3, 16, 16)
    alone = model.vision(img, torch.tensor([[3, 16, 16]])).emb
    big = torch.randn(1, 3, 32, 32)
    padded = torch.zeros(2, 3, 32, 32)
    padded[0, :, :16, :16] = img[0]
    padded[1] = big[0]
    together = model.vision(padded, torch.tensor([[3, 16, 16], [3, 32, 32]])).emb
    torch.testing.assert_close(together[0], alone[0], rtol=1e-5, atol=1e-6)


def test_padded_images_pad_to_the_most_patches_not_the_bounding_grid():
    """A 1x4 and a 4x1 grid pad to 4 patch tokens (plus [CLS]), not 4x4 = 16, and give the same
    embeddings and fusion context as the bounding-grid layout (what a device tensor without a
    host layout still uses)."""
    model = tiny_model()
    wide, tall = torch.randn(3, 16, 64), torch.randn(3, 64, 16)
    pixels = torch.zeros(2, 3, 64, 64)
    pixels[0, :, :16, :] = wide
    pixels[1, :, :, :16] = tall
    shape = torch.tensor([[3, 16, 64], [3, 64, 16]])
    x, mask = model.vision.embed(pixels, shape)
    assert x.shape[:2] == (2, 5) and mask.tolist() == [[True] * 5] * 2
    grid_x, grid_mask = _bounding_embed(model, pixels, shape)
    assert grid_x.shape[:2] == (2, 17)
    torch.testing.assert_close(x, grid_x[grid_mask].view(2, 5, -1))
    alone = [model.vision(pixels[i:i + 1, :, :h, :w], shape[i:i + 1]).emb for i, (_, h, w) in enumerate(shape.tolist())]
    together = model.vision(pixels, shape).emb
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-5, atol=1e-6)


def _bounding_embed(model, pixels, shape):
    """embed as on a device without the host sizes: the tokens keep the padded grid's places."""
    orig = model.vision._most_patches
    model.vision._most_patches = lambda *a: None
    try:
        return model.vision.embed(pixels, shape)
    finally:
        model.vision._most_patches = orig


def test_text_embedding_does_not_depend_on_batch_padding():
    model = tiny_model()
    ids = torch.tensor([[101, 2000, 3000, 102]])
    alone = model.text(ids, torch.tensor([4])).emb
    padded = torch.tensor([[101, 2000, 3000, 102, 0, 0], [101, 5, 6, 7, 8, 102]])
    together = model.text(padded, torch.tensor([4, 6])).emb
    torch.testing.assert_close(together[0], alone[0], rtol=1e-5, atol=1e-6)


def test_zero_weight_samples_change_neither_loss_nor_gradients():
    """Adding padding samples (with content) to a batch leaves loss and gradients unchanged."""
    mb = batch(seed=3, pad_prob=0.0)
    padded = batch(seed=3, pad_prob=0.0)
    n = mb.weight.shape[0]
    for key in ("pixel_values", "pixel_shape", "input_ids", "lengths", "weight"):
        setattr(padded, key, torch.cat([getattr(mb, key), getattr(mb, key)[:2]]))  # two copies of real samples ...
    padded.weight[n:] = 0  # ... as zero-weight padding
    padded.neg_text, padded.neg_image = losses.itm_negatives(padded.weight)
    for b in (mb, padded):  # float64: equality up to rounding, not up to float32 noise
        b.pixel_values, b.weight = b.pixel_values.double(), b.weight.double()
    model = tiny_model().double()
    want = loss_of(model, mb)
    want.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    got = loss_of(model, padded)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], rtol=1e-9, atol=1e-13, msg=lambda m: f"{k}: {m}")


def test_all_padding_batch_gives_zero_loss_not_nan():
    mb = batch(seed=4)
    mb.weight = torch.zeros_like(mb.weight)
    mb.neg_text, mb.neg_image = losses.itm_negatives(mb.weight)
    model = tiny_model()
    out = model(mb.pixel_values, mb.pixel_shape, mb.input_ids, mb.lengths, mb.neg_text, mb.neg_image)
    total = losses.global_weight(mb.weight.sum())
    loss = (losses.itc_sum(out.img_emb, out.txt_emb, mb.weight, out.logit_scale)
            + losses.itm_sum(out.itm_logits, mb.weight, mb.neg_text)) / total
    loss.backward()
    assert loss.item() == 0.0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_fixed_seed_reproduces_the_loss():
    got = [loss_of(tiny_model(seed=5), batch(seed=6)).item() for _ in range(2)]
    other = loss_of(tiny_model(seed=7), batch(seed=6)).item()
    assert got[0] == got[1]
    assert other != got[0]


def test_grid_larger_than_the_position_table_is_interpolated():
    """A 3 x 1 grid with a 2 x 2 table: accepted, and its embedding does not depend on the
    batch's padding (each sample's own grid picks its position embeddings)."""
    model = MMModel(config.model_config("tiny", max_grid=2))
    img = torch.randn(1, 3, 48, 16)
    alone = model.vision(img, torch.tensor([[3, 48, 16]])).emb
    padded = torch.zeros(2, 3, 48, 48)
    padded[0, :, :, :16] = img[0]
    padded[1] = torch.randn(3, 48, 48)
    together = model.vision(padded, torch.tensor([[3, 48, 16], [3, 48, 48]])).emb
    torch.testing.assert_close(together[0], alone[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("field,value,message", [
    ("vision_heads", 5, "not divisible"),
    ("patch_size", 0, "must be > 0"),
    ("pad_token_id", 40000, "outside vocab"),
])
def test_bad_model_config_is_a_value_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        config.model_config("tiny", **{field: value})


def test_unknown_preset_is_a_value_error():
    with pytest.raises(ValueError, match="unknown model"):
        config.model_config("huge")


def test_base_preset_has_vit_b_bert_base_sizes():
    cfg = config.base()
    with torch.device("meta"):
        model_params = sum(p.numel() for p in MMModel(cfg).vision.parameters())
    assert 85e6 < model_params < 90e6, f"ViT-B/16 tower has {model_params / 1e6:.1f} M parameters"
    assert cfg.fusion_layers == 6 and cfg.text_layers == 12


def test_flops_grow_with_tokens():
    cfg = config.tiny()
    assert flops_per_sample(cfg, 20, 4) > flops_per_sample(cfg, 10, 4) > flops_per_sample(cfg, 10, 1) > 0


@pytest.mark.parametrize("weights,segments,want", [
    ([1, 1, 1, 1], [4], [1, 2, 3, 0]),
    ([1, 0, 1, 1], [4], [2, 1, 3, 0]),
    ([1, 1, 1, 1], [2, 2], [1, 0, 3, 2]),
    ([1, 0, 1, 1], [2, 2], [0, 1, 3, 2]),
])
def test_itm_negatives_stay_inside_segments(weights, segments, want):
    neg, neg_img = losses.itm_negatives(torch.tensor(weights, dtype=torch.float32), segments)
    assert neg.tolist() == want
    assert neg_img.tolist() == want


def test_itc_matches_the_textbook_formula_without_padding():
    torch.manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(5, 8), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(5, 8), dim=-1)
    scale = torch.tensor([10.0])
    logits = scale * img @ txt.t()
    target = torch.arange(5)
    want = 0.5 * (torch.nn.functional.cross_entropy(logits, target, reduction="sum")
                  + torch.nn.functional.cross_entropy(logits.t(), target, reduction="sum"))
    got = losses.itc_sum(img, txt, torch.ones(5), scale)
    torch.testing.assert_close(got, want)


def test_flops_match_go_golden():
    """balancer/testdata/flops_golden.json pins flops_per_sample; the Go cost model's
    TestFLOPsMatchTrainer checks its FLOP prior against the same file."""
    import json
    from pathlib import Path

    from mmfeed_trainer.models.config import model_config, preset_names

    path = Path(__file__).resolve().parents[2] / "balancer" / "testdata" / "flops_golden.json"
    golden = json.loads(path.read_text())
    assert {g["preset"] for g in golden} == set(preset_names())
    for g in golden:
        got = flops_per_sample(model_config(g["preset"]), g["text_tokens"], g["image_tokens"])
        assert got == g["flops"], g
