"""HuggingFace datasets as people save them: the real `datasets` library writes an Image
column built from local files with to_parquet (paths, no bytes) and with save_to_disk
(Arrow streams, bytes embedded), and the real `mmfeed shard` plans every sample of both.
A DatasetDict folder is refused with its splits named; a run that quarantines every
sample exits non-zero with the fix."""

import re
import subprocess

import pytest

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

N = 12


@pytest.fixture
def hf(tmp_path):
    """An HF Dataset with an Image column of local JPEGs of varied sizes and a caption."""
    paths = []
    (tmp_path / "imgs").mkdir()
    for i in range(N):
        p = tmp_path / "imgs" / f"{i:02d}.jpg"
        Image.new("RGB", (24 + 8 * i, 40 - i), (20 * i, 100, 200 - 10 * i)).save(p)
        paths.append(str(p))
    ds = datasets.Dataset.from_dict({"image": paths, "caption": [f"photo number {i}" for i in range(N)]})
    return ds.cast_column("image", datasets.Image())


def shard(mmfeed, input, out, *flags):
    return subprocess.run([mmfeed, "shard", "--input", str(input), "--dp", "2", "--global-batch", "4",
                           "--micro-batches", "1", "--image-size", "32", "--workers", "2",
                           "--feature-cache", "off", "--out", str(out), *flags],
                          capture_output=True, text=True, timeout=300)


def planned(stdout):
    m = re.search(r"(\d+) samples seen, (\d+) planned in .*?, (\d+) quarantined.*?, (\d+) dropped", stdout)
    assert m, stdout
    return tuple(int(g) for g in m.groups())


def test_to_parquet_with_paths_and_save_to_disk_are_read(mmfeed, hf, tmp_path):
    hf.to_parquet(str(tmp_path / "export.parquet"))
    import pyarrow.parquet as pq
    first = pq.read_table(tmp_path / "export.parquet").column("image")[0].as_py()
    assert first["bytes"] is None and first["path"].endswith("00.jpg")  # what datasets writes: a path only
    hf.save_to_disk(str(tmp_path / "disk"))
    assert (tmp_path / "disk" / "state.json").exists() and (tmp_path / "disk" / "dataset_info.json").exists()
    for name, input in (("parquet", tmp_path / "export.parquet"), ("disk", tmp_path / "disk")):
        r = shard(mmfeed, input, tmp_path / f"out-{name}", "--text-field", "caption")
        assert r.returncode == 0, r.stderr
        seen, plan, quarantined, dropped = planned(r.stdout)
        assert (seen, quarantined) == (N, 0) and plan + dropped == N, r.stdout


def test_dataset_dict_names_its_splits(mmfeed, hf, tmp_path):
    datasets.DatasetDict({"train": hf, "test": hf}).save_to_disk(str(tmp_path / "dd"))
    r = shard(mmfeed, tmp_path / "dd", tmp_path / "out", "--text-field", "caption")
    assert r.returncode != 0 and "DatasetDict" in r.stderr and str(tmp_path / "dd" / "train") in r.stderr, r.stderr
    r = shard(mmfeed, tmp_path / "dd" / "train", tmp_path / "out", "--text-field", "caption")
    assert r.returncode == 0, r.stderr


def test_every_sample_quarantined_exits_with_the_fix(mmfeed, hf, tmp_path):
    hf.to_parquet(str(tmp_path / "export.parquet"))
    # the captions are in "caption"; "text" is a column of nulls the user did not mean
    ds = datasets.Dataset.from_parquet(str(tmp_path / "export.parquet"))
    ds = ds.add_column("text", [None] * N).cast_column("text", datasets.Value("string"))
    ds.to_parquet(str(tmp_path / "with-text.parquet"))
    r = shard(mmfeed, tmp_path / "with-text.parquet", tmp_path / "out")
    assert r.returncode != 0, r.stdout
    assert f"all {N} samples were quarantined" in r.stderr and f"top reason missing_caption: {N} samples" in r.stderr
    assert "--text-field caption" in r.stderr
