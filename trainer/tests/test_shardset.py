"""ShardSource over `mmfeed shard` output: every epoch's index, JPEG pixels, the CLI's sets."""

import json
import subprocess

import numpy as np
import pytest

from mmfeed_trainer.data.batches import record_to_batch
from mmfeed_trainer.data.shardset import ShardError, ShardSet
from mmfeed_trainer.data.sources import ShardSource

DP = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request):
    mmfeed = request.getfixturevalue("mmfeed_module")
    out = tmp_path_factory.mktemp("corpus")
    subprocess.run([mmfeed, "synth", "--out", str(out), "--samples", "150", "--seed", "3", "--bad-fraction", "0.05"],
                   check=True, capture_output=True)
    return mmfeed, out / "manifest.jsonl"


@pytest.fixture(scope="module")
def mmfeed_module():
    from conftest import MMFEED_BIN  # noqa: PLC0415
    import os  # noqa: PLC0415
    if not os.access(MMFEED_BIN, os.X_OK):
        if os.environ.get("MMFEED_REQUIRE_PEERS"):
            pytest.fail(f"{MMFEED_BIN} missing (make build)")
        pytest.skip(f"{MMFEED_BIN} missing (make build)")
    return MMFEED_BIN


def shard(corpus, out, *flags):
    mmfeed, manifest = corpus
    subprocess.run([mmfeed, "shard", "--input", str(manifest), "--dp", str(DP), "--global-batch", "16",
                    "--micro-batches", "2", "--image-size", "32", "--workers", "2", "--out", str(out), *flags],
                   check=True, capture_output=True)
    return json.loads((out / "shard.json").read_text())


@pytest.mark.parametrize("flags", [["--store", "jpeg", "--compression", "zstd"], ["--dtype", "uint8", "--compression", "lz4"]])
def test_source_follows_each_epoch_index(corpus, tmp_path, flags):
    m = shard(corpus, tmp_path, "--epochs", "3", "--part-steps", "2", *flags)
    ss = ShardSet(str(tmp_path))
    for rank in range(DP):
        src = ShardSource(str(tmp_path), rank)
        assert src.epochs() == [0, 1, 2]
        got = list(src.steps({"epoch": 0, "next_step": 0}))
        assert [d.epoch for d in got] == sorted(e for e in range(3) for _ in range(m["epochs"][e]["steps"]))
        for e in range(3):
            ix = ss.index(e, rank)
            steps = [d for d in got if d.epoch == e]
            ids = [i for d in steps for rb in d.records for i in rb.column("id").to_pylist()]
            assert ids == list(ix["id"])  # the rows the epoch's index names, in its order
            weights = np.concatenate([rb.column("weight").to_numpy() for d in steps for rb in d.records])
            assert (weights == ix["weight"]).all()
            for d in steps:
                assert len(d.records) == 2 and [rb.column("micro_batch")[0].as_py() for rb in d.records] == [0, 1]
                b = record_to_batch(d.records[0]).decoded()  # JPEG sets decode in the prefetcher
                assert str(b.pixel_values.dtype) == "torch.uint8"
                assert tuple(b.pixel_values.shape[1:]) == (3, 32, 32)
    # the epochs differ: a shuffled plan per epoch
    assert list(ss.index(0, 0)["id"]) != list(ss.index(1, 0)["id"])


def test_resume_position_and_epoch_order(corpus, tmp_path):
    m = shard(corpus, tmp_path, "--epochs", "2")
    src = ShardSource(str(tmp_path), 1)
    s0 = m["epochs"][0]["steps"]
    rest = [(d.epoch, d.step) for d in src.steps({"epoch": 0, "next_step": s0 - 1})]
    assert rest == [(0, s0 - 1)] + [(1, s) for s in range(m["epochs"][1]["steps"])]
    assert [(d.epoch, d.step) for d in src.steps({"epoch": 1, "next_step": 1})][0] == (1, 1)


def test_jpeg_close_to_uint8(corpus, tmp_path):
    shard(corpus, tmp_path / "u8", "--dtype", "uint8")
    shard(corpus, tmp_path / "jpg", "--store", "jpeg", "--jpeg-quality", "95")
    a = next(iter(ShardSource(str(tmp_path / "u8"), 0).steps({}))).records[0]
    b = next(iter(ShardSource(str(tmp_path / "jpg"), 0).steps({}))).records[0]
    assert a.column("id").equals(b.column("id"))
    x = record_to_batch(a).pixel_values.numpy().astype(np.float64)
    y = record_to_batch(b).decoded().pixel_values.numpy().astype(np.float64)  # kept as JPEG until the prefetcher
    psnr = 10 * np.log10(255 ** 2 / max(np.mean((x - y) ** 2), 1e-12))
    assert psnr > 30, psnr


def test_bad_sets_raise_shard_error(corpus, tmp_path):
    with pytest.raises(ShardError, match="no shard.json"):
        ShardSet(str(tmp_path))
    m = shard(corpus, tmp_path, "--epochs", "1")
    with pytest.raises(ShardError, match="holds epochs"):
        list(ShardSource(str(tmp_path), 0).steps({"epoch": 5, "next_step": 0}))
    (tmp_path / m["files"][0]["path"]).write_bytes(b"not arrow")
    with pytest.raises(ShardError, match=m["files"][0]["path"]):
        list(ShardSource(str(tmp_path), 0).steps({"epoch": 0, "next_step": 0}))


def test_shards_carry_the_tokenizer_and_a_too_small_model_is_refused(corpus, tmp_path):
    import os  # noqa: PLC0415
    from mmfeed_trainer.data.batches import BatchError, tokenizer_meta  # noqa: PLC0415
    shard(corpus, tmp_path / "bert", "--epochs", "1")
    rec = next(iter(ShardSource(str(tmp_path / "bert"), 0).steps({}))).records[0]
    assert tokenizer_meta(rec) == (30522, 0)  # bert-base-uncased's vocabulary and [PAD]
    record_to_batch(rec, vocab_size=30522)
    llama = os.path.join(os.environ["MMFEED_TOKENIZER_DIR"], "Meta-Llama-3-8B-Instruct.json")
    shard(corpus, tmp_path / "llama", "--epochs", "1", "--tokenizer", llama)
    rec = next(iter(ShardSource(str(tmp_path / "llama"), 0).steps({}))).records[0]
    assert tokenizer_meta(rec) == (128256, None)  # Llama 3 has no pad token
    with pytest.raises(BatchError, match="smaller than the data's tokenizer"):
        record_to_batch(rec, vocab_size=30522)


def test_resize_vocab_trains_on_a_larger_tokenizer(corpus, tmp_path, monkeypatch):
    """Llama 3 ids (128256) on the tiny model (30522): refused by default, trained with --resize-vocab."""
    import os  # noqa: PLC0415
    from mmfeed_trainer.data.batches import BatchError  # noqa: PLC0415
    from mmfeed_trainer.loop.train import TrainConfig, run  # noqa: PLC0415
    llama = os.path.join(os.environ["MMFEED_TOKENIZER_DIR"], "Meta-Llama-3-8B-Instruct.json")
    shard(corpus, tmp_path / "llama", "--epochs", "1", "--tokenizer", llama)
    assert ShardSource(str(tmp_path / "llama"), 0).data_vocab() == 128256
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(k, v)
    cfg = dict(shards=str(tmp_path / "llama"), dp=1, steps=2, log_every=1, prefetch=1)
    with pytest.raises(BatchError, match="smaller than the data's tokenizer"):
        run(TrainConfig(**cfg))
    res = run(TrainConfig(**cfg, resize_vocab=True, save_params=str(tmp_path / "params")))
    assert res.steps_done == 2 and all(np.isfinite(res.losses))
    import torch  # noqa: PLC0415
    params = torch.load(tmp_path / "params" / "params-mp0.pt")
    assert tuple(params["text.tok.weight"].shape)[0] == 128256


def _read_all(location, **kw):
    ss = ShardSet(str(location), **kw)
    return [i for r in range(DP) for _, recs in ss.rank_steps(0, r) for rb in recs for i in rb.column("id").to_pylist()]


@pytest.mark.parametrize("entry, name", [
    ("files", "../outside.arrow"), ("files", "sub/../../outside.arrow"), ("files", "/tmp/outside.arrow"),
    ("epochs", "../outside.arrow"), ("files", "..\\outside.arrow"), ("files", "C:/outside.arrow"),
])
def test_tampered_manifest_paths_are_refused(corpus, tmp_path, entry, name):
    """Before: ShardSet read whatever a tampered shard.json named, ``../`` included (here a real
    copy of a data file outside the set, which it then served)."""
    root = tmp_path / "set"
    m = shard(corpus, root, "--epochs", "1")
    src = root / m[entry][0]["path"]
    (tmp_path / "outside.arrow").write_bytes(src.read_bytes())
    m[entry][0]["path"] = name.replace("/tmp/", f"{tmp_path}/")
    (root / "shard.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match="leaves the set's root"):
        _read_all(root)


def test_a_link_out_of_the_set_is_refused(corpus, tmp_path):
    root = tmp_path / "set"
    m = shard(corpus, root, "--epochs", "1")
    src = root / m["files"][0]["path"]
    (tmp_path / "outside.arrow").write_bytes(src.read_bytes())
    src.unlink()
    src.symlink_to(tmp_path / "outside.arrow")
    with pytest.raises(ShardError, match="resolves outside the set's root"):
        _read_all(root)


def test_a_flipped_byte_fails_the_sha256_check(corpus, tmp_path):
    """Before: the SHA-256 shard.json lists was never checked; a flipped byte was read as data
    (or failed inside pyarrow with an error that named no file)."""
    m = shard(corpus, tmp_path, "--epochs", "1", "--compression", "zstd")
    name = m["files"][0]["path"]
    data = bytearray((tmp_path / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{name} fails its SHA-256 check"):
        _read_all(tmp_path)
    with pytest.raises(ShardError, match=rf"{name} fails its SHA-256 check"):
        ShardSet(str(tmp_path), verify=False).verify()


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_corrupt_compressed_file_names_the_file(corpus, tmp_path, compression):
    """Unverified (``verify=False``), a data file whose records do not decompress is a ShardError
    that names the file, not a bare pyarrow error."""
    m = shard(corpus, tmp_path, "--epochs", "1", "--compression", compression)
    name = m["files"][0]["path"]
    data = bytearray((tmp_path / name).read_bytes())
    lo, hi = len(data) // 8, len(data) * 7 // 8  # the records; the schema and footer stay readable
    data[lo:hi] = bytes(b ^ 0x5A for b in data[lo:hi])
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(ShardError, match=name) as err:
        _read_all(tmp_path, verify=False)
    assert "record" in str(err.value), err.value  # a record that does not decompress, not the footer


def test_an_intact_set_verifies(corpus, tmp_path):
    shard(corpus, tmp_path, "--epochs", "1")
    ss = ShardSet(str(tmp_path))
    ss.verify()
    assert len(ss._verified) == len(ss.files)
