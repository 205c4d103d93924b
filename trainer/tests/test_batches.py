"""Arrow record -> torch: dtype equivalence, padding, masks, roles, and bad input."""

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from mmfeed_trainer.data import batches, synthetic

CPU = torch.device("cpu")


def record(dtype="float32", **kw):
    cfg = synthetic.SynthConfig(seed=11, dtype=dtype, min_samples=4, max_samples=6, pad_prob=0.3, **kw)
    return synthetic.micro_batch(cfg, step=3, dp_rank=1, mb=1)


@pytest.mark.parametrize("dtype,atol", [("float16", 4e-3), ("bfloat16", 3e-2), ("uint8", 1e-5)])
def test_every_wire_dtype_gives_the_same_pixels(dtype, atol):
    want = batches.to_device(batches.record_to_batch(record("float32")), CPU).pixel_values
    got = batches.to_device(batches.record_to_batch(record(dtype)), CPU).pixel_values
    assert got.dtype == torch.float32
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert err <= atol * want.abs().max().item(), f"{dtype}: max abs error {err:.3g}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
def test_packing_on_the_host_gives_the_device_packing(dtype):
    """The CPU prefetcher packs the wire-dtype batch before ``to`` normalises it (only the
    real pixels); the patches equal packing the normalised batch, bit for bit."""
    mb = batches.record_to_batch(record(dtype, grids=((1, 1), (2, 1), (1, 2))))
    on_device = batches.pack(mb.to(CPU), 16)
    on_host = batches.pack(mb, 16).to(CPU)
    assert on_host.patches.dtype == torch.float32
    assert torch.equal(on_host.patches, on_device.patches)
    assert torch.equal(on_host.cu_seqlens_image, on_device.cu_seqlens_image)


def test_bfloat16_bits_decode_exactly():
    x = np.array([1.0, -2.5, 0.15625, 3.0e-3], np.float32)
    bits = synthetic.encode_float(x, "bfloat16")
    got = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float()
    want = torch.from_numpy(x).to(torch.bfloat16).float()
    assert torch.equal(got, want)


def test_text_is_padded_to_the_longest_with_mask():
    rb = record()
    mb = batches.record_to_batch(rb)
    ids = rb.column("input_ids").to_pylist()
    width = max(max(len(x) for x in ids), 1)
    assert mb.input_ids.shape == (len(ids), width)
    for i, row in enumerate(ids):
        assert mb.input_ids[i, :len(row)].tolist() == row
        assert mb.input_ids[i, len(row):].eq(0).all()
        assert mb.attention_mask[i].tolist() == [1] * len(row) + [0] * (width - len(row))
        assert int(mb.lengths[i]) == len(row)


def test_dynamic_resolution_pads_each_image_at_the_top_left():
    rb = record(grids=((1, 1), (2, 1), (1, 2)))
    mb = batches.record_to_batch(rb)
    shapes = rb.column("pixel_shape").to_pylist()
    values = rb.column("pixel_values").to_pylist()
    h = max(s[1] for s in shapes)
    w = max(s[2] for s in shapes)
    assert mb.pixel_values.shape[2:] == (h, w)
    for i, (c, hi, wi) in enumerate(shapes):
        got = mb.pixel_values[i]
        want = torch.tensor(values[i], dtype=torch.float32).view(c, hi, wi)
        assert torch.equal(got[:, :hi, :wi], want)
        assert got[:, hi:, :].eq(0).all() and got[:, :, wi:].eq(0).all()


def test_roles_take_only_their_modality():
    rb = record()
    text = batches.record_to_batch(rb.select(["id", "step", "micro_batch", "input_ids", "weight"]), role="text")
    assert text.input_ids is not None and text.pixel_values is None
    vision = batches.record_to_batch(rb.drop_columns(["input_ids"]), role="vision")
    assert vision.pixel_values is not None and vision.input_ids is None
    assert vision.neg_text.shape == vision.weight.shape
    assert text.step == vision.step == 3 and text.micro_batch == 1


def _with_pixel_meta(rb, **changes):
    field = rb.schema.field("pixel_values")
    md = {k.decode(): v.decode() for k, v in field.metadata.items()} | changes
    schema = rb.schema.set(rb.schema.get_field_index("pixel_values"), field.with_metadata(md))
    return pa.RecordBatch.from_arrays(rb.columns, schema=schema)


@pytest.mark.parametrize("mutate,message", [
    (lambda rb: rb.drop_columns(["weight"]), "missing column 'weight'"),
    (lambda rb: _with_pixel_meta(rb, dtype="int4"), "dtype metadata"),
    (lambda rb: _with_pixel_meta(rb, dtype="float16"), "metadata says float16"),
    (lambda rb: _with_pixel_meta(rb, mean="[0.5"), "mean/std"),
    (lambda rb: _with_pixel_meta(rb, layout="HWC"), "layout"),
    (lambda rb: rb.set_column(rb.schema.get_field_index("pixel_shape"), "pixel_shape",
                              pa.array([[3, 16, 17]] * rb.num_rows, pa.list_(pa.int32(), 3))), "pixel values, shape"),
    (lambda rb: rb.set_column(rb.schema.get_field_index("weight"), "weight",
                              pa.array([-1.0] * rb.num_rows, pa.float32())), "weights"),
    (lambda rb: rb.slice(0, 0), "empty micro-batch"),
])
def test_bad_records_raise_batch_error(mutate, message):
    with pytest.raises(batches.BatchError, match=message):
        batches.record_to_batch(mutate(record()))


def test_random_corruption_raises_only_batch_error():
    """Fuzz-style: random column swaps, truncations and metadata edits never crash otherwise."""
    rng = np.random.default_rng(0)
    base = record()
    names = base.schema.names
    for trial in range(200):
        rb = base
        op = trial % 4
        if op == 0:
            rb = rb.drop_columns([names[rng.integers(len(names))]])
        elif op == 1:
            i, j = rng.choice(len(names), 2, replace=False)
            cols = list(rb.columns)
            cols[i], cols[j] = cols[j], cols[i]
            try:
                rb = pa.RecordBatch.from_arrays(cols, names=names)
            except (pa.ArrowInvalid, ValueError):
                continue
        elif op == 2:
            rb = _with_pixel_meta(rb, **{str(rng.choice(["dtype", "mean", "std", "layout"])):
                                         json.dumps(rng.integers(-5, 5, size=int(rng.integers(0, 5))).tolist())})
        else:
            rb = rb.slice(int(rng.integers(0, rb.num_rows)), int(rng.integers(0, rb.num_rows)))
        try:
            batches.record_to_batch(rb)
        except batches.BatchError:
            pass


def test_concat_records_keeps_rank_order():
    a, b = record(), synthetic.micro_batch(synthetic.SynthConfig(seed=2), step=3, dp_rank=0, mb=1)
    got = batches.concat_records([a, b])
    assert got.column("id").to_pylist() == a.column("id").to_pylist() + b.column("id").to_pylist()


def test_record_pack_metadata_must_match_the_trainer():
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=1), 0, 0, 0)
    batches.record_to_batch(rec, pack=False)  # no mmfeed.pack: a padded plan
    with pytest.raises(batches.BatchError, match="mmfeed.pack=false"):
        batches.record_to_batch(rec, pack=True)
    packed = rec.replace_schema_metadata({**rec.schema.metadata, b"mmfeed.pack": b"true"})
    batches.record_to_batch(packed, pack=True)
    with pytest.raises(batches.BatchError, match="mmfeed.pack=true"):
        batches.record_to_batch(packed, pack=False)
    bad = rec.replace_schema_metadata({**rec.schema.metadata, b"mmfeed.pack": b"yes"})
    with pytest.raises(batches.BatchError):
        batches.record_to_batch(bad, pack=True)


def _with_tokenizer(rec, vocab, pad=None):
    md = {**rec.schema.metadata, b"mmfeed.vocab_size": str(vocab).encode()}
    if pad is not None:
        md[b"mmfeed.pad_id"] = str(pad).encode()
    return rec.replace_schema_metadata(md)


def test_text_pads_with_the_tokenizer_pad_id_from_the_metadata():
    rec = _with_tokenizer(record(), 50000, pad=7)
    assert batches.tokenizer_meta(rec) == (50000, 7)
    assert batches.tokenizer_meta(record()) == (None, None)
    mb = batches.record_to_batch(rec, pad_id=0, vocab_size=50000)
    ids = rec.column("input_ids").to_pylist()
    for i, row in enumerate(ids):
        assert mb.input_ids[i, len(row):].eq(7).all()
    no_pad = batches.record_to_batch(_with_tokenizer(record(), 50000), pad_id=3)
    assert min(len(r) for r in ids) < no_pad.input_ids.shape[1]  # the record has padding to check
    for i, row in enumerate(ids):
        assert no_pad.input_ids[i, len(row):].eq(3).all()  # no mmfeed.pad_id: the model's pad


def test_model_vocabulary_smaller_than_the_data_is_refused():
    rec = _with_tokenizer(record(), 128256)
    with pytest.raises(batches.BatchError, match=r"model's vocabulary \(30522 ids\) is smaller than the data's "
                                                 r"tokenizer \(128256 ids"):
        batches.record_to_batch(rec, vocab_size=30522)
    batches.record_to_batch(rec, vocab_size=128256)
    batches.record_to_batch(rec)  # no model vocabulary given: not checked
    with pytest.raises(batches.BatchError, match="not an integer"):
        batches.record_to_batch(rec.replace_schema_metadata({**rec.schema.metadata, b"mmfeed.pad_id": b"x"}))


def test_batch_dict_form_keeps_the_documented_keys():
    """The typed batch becomes the untyped form of the stream client and ``data`` (same names,
    ``ids`` keyed ``id``, fields a role does not receive left out) and back to the device alike."""
    full = batches.record_to_batch(record("uint8"))
    assert set(full.to_dict()) == {"id", "epoch", "step", "micro_batch", "num_live", "weight", "input_ids",
                                   "attention_mask", "lengths", "pixel_values", "pixel_shape", "pixel_mean",
                                   "pixel_std", "pixel_dtype", "neg_text", "neg_image"}
    assert full.to_dict()["id"] == full.ids and full.to_dict()["pixel_dtype"] == "uint8"
    text = batches.record_to_batch(record().drop_columns(["pixel_values", "pixel_shape"]), role="text")
    assert "pixel_values" not in text.to_dict() and "neg_text" not in text.to_dict()
    typed = full.to(CPU)
    untyped = batches.to_device(full.to_dict(), CPU)
    assert typed.pixel_values.dtype == torch.float32 and full.pixel_values.dtype == torch.uint8
    assert torch.equal(typed.pixel_values, untyped["pixel_values"])
    packed = batches.pack(typed, 16)
    assert packed.packed and not typed.packed and packed.pixel_values is None
    assert {"cu_seqlens_text", "cu_seqlens_image", "image_grid", "patches"} <= set(packed.to_dict())
    assert full.slot == {"epoch": 0, "step": 3, "micro_batch": 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_batch_pin_memory_pins_every_tensor():
    pinned = batches.record_to_batch(record("uint8")).pin_memory()
    assert all(t.is_pinned() for t in pinned.tensors())
