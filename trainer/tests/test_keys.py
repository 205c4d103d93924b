"""The schema metadata keys the trainer reads come from schema_keys.json (checked against Go by
proto/keys_test.go), and the Go service writes exactly those keys."""

import json
import os

import pytest

from mmfeed_trainer import keys
from mmfeed_trainer.data import synthetic


def test_keys_are_those_of_the_shared_file():
    with open(os.path.join(os.path.dirname(keys.__file__), "schema_keys.json")) as f:
        doc = json.load(f)
    names = {k[len("META_"):].lower(): v for k, v in vars(keys).items() if k.startswith("META_")}
    assert names == doc["schema_metadata"]
    assert keys.SCHEMA_VERSION == doc["schema_version"]


def test_synthetic_records_use_the_shared_keys():
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=1), 0, 0, 0)
    written = {k.decode() for k in rec.schema.metadata}
    assert written <= set(json.load(open(keys._FILE))["schema_metadata"].values())


def _shared():
    with open(keys._FILE) as f:
        return json.load(f)


def test_columns_are_those_of_the_shared_file():
    doc = _shared()
    cols = {k[len("COL_"):].lower(): v for k, v in vars(keys).items() if k.startswith("COL_")}
    assert cols == doc["columns"]
    assert {m: list(c) for m, c in keys.MODALITY_COLUMNS.items()} == doc["modality_columns"]
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=1), 0, 0, 0)
    assert rec.schema.names == doc["modality_columns"]["all"]
    pix = {k.decode() for k in rec.schema.field(keys.COL_PIXEL_VALUES).metadata}
    pf = doc["pixel_field"]
    assert pix == {pf[k] for k in ("dtype", "layout", "shape", "mean", "std")}


def test_pixel_dtypes_are_those_of_the_shared_file():
    from mmfeed_trainer.data import batches, jpegwire
    assert set(batches.WIRE_DTYPES) | set(jpegwire.JPEG_DTYPES) == set(_shared()["pixel_field"]["dtypes"])


def test_chunk_headers_are_those_of_the_shared_file():
    """wire.make_chunks writes, and wire.parse_header requires, the shared header set."""
    from mmfeed_trainer.data import wire
    chunk = _shared()["chunk"]
    names = chunk["headers"]
    key = wire.BatchKey("j-1", 3, 14, 1, 5, 9)
    for gen in (0, 2):
        (h, _), *_ = wire.make_chunks(key, b"x" * 10, 4, gen=gen)
        want = {names[k] for k in chunk["required"]} | {names["msg_id"]} | ({names["generation"]} if gen else set())
        assert set(h) == want
        assert h[names["schema"]] == keys.SCHEMA_VERSION
        assert h[names["checksum"]].startswith(chunk["checksum_prefix"])
        want_id = chunk["msg_id"].format(job="j-1", epoch=3, step=14, micro_batch=1, dp_rank=5, mp_rank=9, chunk=0)
        assert h[names["msg_id"]] == want_id + (chunk["msg_id_generation"].format(generation=gen) if gen else "")
        assert wire.parse_header(h).gen == gen
        for name in chunk["required"]:
            cut = {k: v for k, v in h.items() if k != names[name]}
            with pytest.raises(wire.ChunkError):
                wire.parse_header(cut)


def test_subjects_are_those_of_the_shared_file():
    subjects = _shared()["subjects"]
    assert keys.CONTROL_KINDS == subjects["control_kinds"]
    got = keys.subject("rank_control", job="j", kind="done", dp=2, mp=1)
    assert got == subjects["rank_control"].format(job="j", kind="done", dp=2, mp=1) == "mmfeed.j.ctl.done.2.1"
    assert keys.subject("inbox_prefix", job="j", dp=2, mp=1) == "_INBOX.mmfeed.j.2.1"


def test_stream_uses_the_shared_subjects():
    """StreamSource's control subjects come from the shared patterns (no NATS needed)."""
    from mmfeed_trainer.parallel.parallel_dims import ParallelDims
    from mmfeed_trainer.data.stream import StreamSource
    src = StreamSource(url="nats://127.0.0.1:1", job="j", dims=ParallelDims(dp=4, mp=2, world_size=8), ranks=(3, 1))
    try:
        for kind in keys.CONTROL_KINDS:
            assert src._subject(kind) == keys.subject("rank_control", job="j", kind=kind, dp=3, mp=1)
    finally:
        src.close()
