"""HuggingFace-format ViT and BERT checkpoints (tiny, random, written here with safetensors) load
into the towers, and the towers then compute what the HF architectures compute: the
references below are written from the HF layer definitions (conv patch embedding with key
biases and pre-norm ViT layers; post-norm BERT layers with token type 0), independent of
``model.py``. Mismatched shapes are refused with every problem listed."""

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from mmfeed_trainer.models import config, pretrained
from mmfeed_trainer.models.model import MMModel

D, HEADS, LAYERS, P, G = 64, 4, 2, 16, 4
EPS = 1e-6


def _lin(state, name, out_dim, in_dim):
    state[f"{name}.weight"] = torch.randn(out_dim, in_dim) * 0.05
    state[f"{name}.bias"] = torch.randn(out_dim) * 0.05


def _ln(state, name):
    state[f"{name}.weight"] = 1 + 0.1 * torch.randn(D)
    state[f"{name}.bias"] = 0.1 * torch.randn(D)


def vit_state(d=D, layers=LAYERS):
    torch.manual_seed(0)
    s = {"vit.embeddings.cls_token": torch.randn(1, 1, d) * 0.1,
         "vit.embeddings.position_embeddings": torch.randn(1, 1 + G * G, d) * 0.1,
         "vit.embeddings.patch_embeddings.projection.weight": torch.randn(d, 3, P, P) * 0.02,
         "vit.embeddings.patch_embeddings.projection.bias": torch.randn(d) * 0.02,
         "vit.pooler.dense.weight": torch.randn(d, d), "vit.pooler.dense.bias": torch.zeros(d)}
    for i in range(layers):
        pre = f"vit.encoder.layer.{i}"
        for n in ("query", "key", "value"):
            _lin(s, f"{pre}.attention.attention.{n}", d, d)
        _lin(s, f"{pre}.attention.output.dense", d, d)
        _lin(s, f"{pre}.intermediate.dense", 4 * d, d)
        _lin(s, f"{pre}.output.dense", d, 4 * d)
        if d == D:
            _ln(s, f"{pre}.layernorm_before")
            _ln(s, f"{pre}.layernorm_after")
    if d == D:
        _ln(s, "vit.layernorm")
    return s


def bert_state(vocab=100, max_pos=40):
    torch.manual_seed(1)
    s = {"bert.embeddings.word_embeddings.weight": torch.randn(vocab, D) * 0.1,
         "bert.embeddings.position_embeddings.weight": torch.randn(max_pos, D) * 0.1,
         "bert.embeddings.token_type_embeddings.weight": torch.randn(2, D) * 0.1,
         "bert.embeddings.LayerNorm.gamma": 1 + 0.1 * torch.randn(D),
         "bert.embeddings.LayerNorm.beta": 0.1 * torch.randn(D),
         "cls.predictions.bias": torch.zeros(vocab)}
    for i in range(LAYERS):
        pre = f"bert.encoder.layer.{i}"
        for n in ("query", "key", "value"):
            _lin(s, f"{pre}.attention.self.{n}", D, D)
        _lin(s, f"{pre}.attention.output.dense", D, D)
        _ln(s, f"{pre}.attention.output.LayerNorm")
        _lin(s, f"{pre}.intermediate.dense", 4 * D, D)
        _lin(s, f"{pre}.output.dense", D, 4 * D)
        _ln(s, f"{pre}.output.LayerNorm")
    return s


def _attention(s, pre, x, key_mask):
    b, n, _ = x.shape
    heads = lambda t: t.view(b, n, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
    q, k, v = (heads(F.linear(x, s[f"{pre}.{m}.weight"], s[f"{pre}.{m}.bias"])) for m in ("query", "key", "value"))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, D)


def _ln_ref(s, name, x):
    return F.layer_norm(x, (D,), s[f"{name}.weight"], s[f"{name}.bias"], EPS)


def vit_reference(s, pixels):
    x = F.conv2d(pixels, s["vit.embeddings.patch_embeddings.projection.weight"],
                 s["vit.embeddings.patch_embeddings.projection.bias"], stride=P).flatten(2).transpose(1, 2)
    x = torch.cat([s["vit.embeddings.cls_token"].expand(x.shape[0], 1, D), x], 1) + s["vit.embeddings.position_embeddings"]
    mask = torch.ones(x.shape[:2], dtype=torch.bool)
    for i in range(LAYERS):
        pre = f"vit.encoder.layer.{i}"
        h = _attention(s, f"{pre}.attention.attention", _ln_ref(s, f"{pre}.layernorm_before", x), mask)
        x = x + F.linear(h, s[f"{pre}.attention.output.dense.weight"], s[f"{pre}.attention.output.dense.bias"])
        h = F.gelu(F.linear(_ln_ref(s, f"{pre}.layernorm_after", x), s[f"{pre}.intermediate.dense.weight"],
                            s[f"{pre}.intermediate.dense.bias"]))
        x = x + F.linear(h, s[f"{pre}.output.dense.weight"], s[f"{pre}.output.dense.bias"])
    return _ln_ref(s, "vit.layernorm", x)


def bert_reference(s, ids, mask):
    s = {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
         for k, v in s.items()}
    e = (s["bert.embeddings.word_embeddings.weight"][ids] + s["bert.embeddings.position_embeddings.weight"][:ids.shape[1]]
         + s["bert.embeddings.token_type_embeddings.weight"][0])
    x = _ln_ref(s, "bert.embeddings.LayerNorm", e)
    for i in range(LAYERS):
        pre = f"bert.encoder.layer.{i}"
        h = _attention(s, f"{pre}.attention.self", x, mask)
        x = _ln_ref(s, f"{pre}.attention.output.LayerNorm", x + F.linear(
            h, s[f"{pre}.attention.output.dense.weight"], s[f"{pre}.attention.output.dense.bias"]))
        h = F.gelu(F.linear(x, s[f"{pre}.intermediate.dense.weight"], s[f"{pre}.intermediate.dense.bias"]))
        x = _ln_ref(s, f"{pre}.output.LayerNorm", x + F.linear(
            h, s[f"{pre}.output.dense.weight"], s[f"{pre}.output.dense.bias"]))
    return x


def _model(**overrides):
    torch.manual_seed(2)
    return MMModel(config.model_config("tiny", **{"vocab_size": 100, "max_text_len": 32, "layer_norm_eps": EPS, **overrides}))


def test_vit_checkpoint_reproduces_hf_vit(tmp_path):
    state = vit_state()
    save_file(state, str(tmp_path / "model.safetensors"))
    model = _model()
    report = pretrained.load_vit(model, str(tmp_path))
    assert len(report.loaded) == 4 + 2 + LAYERS * 15
    assert "pooler.dense.weight" in report.ignored and "encoder.layer.0.attention.attention.key.bias" in report.ignored
    pixels = torch.randn(2, 3, G * P, G * P)
    shape = torch.tensor([[3, G * P, G * P]] * 2)
    with torch.no_grad():
        got = model.vision(pixels, shape).tokens
    want = vit_reference(state, pixels)
    # Our table is max_grid (32) wide: the 4 x 4 grid fills its top-left corner.
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < 1e-4
    # Beyond the checkpoint's grid the edge position repeats.
    assert torch.equal(model.vision.pos[1 + 0 * 32 + 9], state["vit.embeddings.position_embeddings"][0, 1 + G - 1])


def test_bert_checkpoint_reproduces_hf_bert(tmp_path):
    state = bert_state()
    save_file(state, str(tmp_path / "bert.safetensors"))
    model = _model(text_post_norm=True)
    pretrained.load_bert(model, str(tmp_path / "bert.safetensors"))
    ids = torch.randint(0, 100, (2, 12))
    lengths = torch.tensor([12, 7])
    with torch.no_grad():
        got = model.text(ids, lengths).hidden
    mask = torch.arange(12)[None, :] < lengths[:, None]
    want = bert_reference(state, ids, mask)
    assert float((got[0] - want[0]).abs().max()) < 1e-4
    assert float((got[1, :7] - want[1, :7]).abs().max()) < 1e-4


def test_bert_needs_post_norm(tmp_path):
    save_file(bert_state(), str(tmp_path / "bert.safetensors"))
    with pytest.raises(ValueError, match="text_post_norm=True"):
        pretrained.load_bert(_model(), str(tmp_path / "bert.safetensors"))


def test_mismatched_checkpoint_lists_every_problem(tmp_path):
    save_file(vit_state(d=32, layers=3), str(tmp_path / "vit.safetensors"))
    model = _model()
    before = model.vision.patch_embed.weight.clone()
    with pytest.raises(ValueError) as err:
        pretrained.load_vit(model, str(tmp_path / "vit.safetensors"))
    msg = str(err.value)
    assert "does not fit the model" in msg
    assert "vision.blocks.0.attn.q.weight: checkpoint gives (32, 32), model has (64, 64)" in msg
    assert "missing encoder.layer.0.layernorm_before.weight" in msg
    assert "1 more encoder layers" in msg
    assert torch.equal(model.vision.patch_embed.weight, before), "nothing may be copied on a mismatch"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        pretrained.load_vit(_model(), str(tmp_path / "nope.safetensors"))


def test_cli_trains_from_a_vit_checkpoint(tmp_path, capsys, monkeypatch):
    """--init-vision with the tiny preset: the checkpoint's shapes must fit it exactly."""
    import json
    from mmfeed_trainer.__main__ import main
    save_file(vit_state(), str(tmp_path / "vit.safetensors"))
    save_file(vit_state(d=32), str(tmp_path / "vit32.safetensors"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["--synthetic", "--steps", "1", "--init-vision", str(tmp_path / "vit32.safetensors")]) == 2
    assert "does not fit the model" in capsys.readouterr().err
    assert main(["--synthetic", "--steps", "2", "--log-every", "1", "--init-vision", str(tmp_path / "vit.safetensors")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2


def test_towers_match_transformers_when_installed(tmp_path):
    """Where ``transformers`` is installed (requirements.txt pins 5.x for the examples; 4.57.1
    was checked by hand too), the loaded towers equal its ViTModel / BertModel."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=4 * D,
                  layer_norm_eps=EPS, hidden_act="gelu")
    vit = transformers.ViTModel(transformers.ViTConfig(image_size=G * P, patch_size=P, **common)).eval()
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=100, max_position_embeddings=40, **common)).eval()
    for name, hf in (("vit", vit), ("bert", bert)):
        with torch.no_grad():
            for p in hf.parameters():
                p.normal_(0, 0.05)
        save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / f"{name}.safetensors"))
    model = _model(text_post_norm=True)
    pretrained.load_vit(model, str(tmp_path / "vit.safetensors"))
    pretrained.load_bert(model, str(tmp_path / "bert.safetensors"))
    px = torch.randn(2, 3, G * P, G * P)
    ids, lengths = torch.randint(0, 100, (2, 12)), torch.tensor([12, 7])
    with torch.no_grad():
        got_v = model.vision(px, torch.tensor([[3, G * P, G * P]] * 2)).tokens
        got_t = model.text(ids, lengths).hidden
        want_v = vit(pixel_values=px).last_hidden_state
        want_t = bert(input_ids=ids, attention_mask=(torch.arange(12)[None] < lengths[:, None]).long()).last_hidden_state
    assert float((got_v - want_v).abs().max()) < 1e-5
    assert float((got_t[0] - want_t[0]).abs().max()) < 1e-5
    assert float((got_t[1, :7] - want_t[1, :7]).abs().max()) < 1e-5


def test_bert_rows_fill_a_grown_vocabulary(tmp_path):
    """--resize-vocab: the checkpoint's 100 rows come first, the model's own init after them."""
    state = bert_state(vocab=100)
    save_file(state, str(tmp_path / "bert.safetensors"))
    model = _model(text_post_norm=True, vocab_size=130)
    before = model.text.tok.weight.detach().clone()
    pretrained.load_bert(model, str(tmp_path / "bert.safetensors"))
    got = model.text.tok.weight.detach()
    assert got.shape == (130, D)
    assert torch.equal(got[:100], state["bert.embeddings.word_embeddings.weight"])
    assert torch.equal(got[100:], before[100:])
    with pytest.raises(ValueError, match="word_embeddings"):  # a smaller model still fails the shape check
        pretrained.load_bert(_model(text_post_norm=True, vocab_size=90), str(tmp_path / "bert.safetensors"))
