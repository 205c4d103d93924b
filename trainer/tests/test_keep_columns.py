"""Kept source fields (``mmfeed --keep url,json:label,caption``) in the Python items: a shard
and a served batch of img2dataset-style WebDataset shards (``url`` and an integer ``label``
in each sample's .json, missing in some) carry them as ``batch.keep`` / ``item["keep"]``."""

import io
import json
import os
import subprocess
import tarfile
import threading
import time

import pyarrow as pa
import pytest

from _dist import free_port
from test_stream import wait_for_port
from mmfeed_trainer import keys
from mmfeed_trainer.data.batches import BatchError, record_to_batch
from mmfeed_trainer.data.datasets import hf_item
from mmfeed_trainer.data.sources import ShardSource
from mmfeed_trainer.data.stream import Stream

KEEP = "url,json:label,caption"
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5",
        "--workers", "2"]


def img2dataset(src: str, dst: str) -> dict:
    """Copy the .tar shards of src to dst with an img2dataset .json per sample (url, key,
    status; label key % 7 unless key % 5 == 0); returns {key: (url, label or None)}."""
    want = {}
    os.makedirs(dst)
    for name in sorted(os.listdir(src)):
        if not name.endswith(".tar"):
            continue
        groups: dict = {}
        with tarfile.open(os.path.join(src, name)) as tin:
            for m in tin.getmembers():
                groups.setdefault(m.name.split(".")[0], []).append((m.name, tin.extractfile(m).read()))
        with tarfile.open(os.path.join(dst, name), "w") as tout:
            for key, members in groups.items():
                obj, rest = {}, []
                for n, data in members:
                    if n.endswith(".json"):
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            rest.append((n, data))  # a broken caption member stays broken
                            continue
                    else:
                        rest.append((n, data))
                obj.update(url=f"https://example.com/{key}.jpg", key=key, status="success")
                label = None if int(key) % 5 == 0 else int(key) % 7
                if label is not None:
                    obj["label"] = label
                want[key] = (obj["url"], label)
                for n, data in rest + [(key + ".json", json.dumps(obj).encode())]:
                    ti = tarfile.TarInfo(n)
                    ti.size = len(data)
                    tout.addfile(ti, io.BytesIO(data))
    return want


@pytest.fixture
def corpus(mmfeed, tmp_path):
    subprocess.run([mmfeed, "synth", "--format", "wds", "--out", str(tmp_path / "synth"), "--samples", "60",
                    "--seed", "3"], check=True, capture_output=True)
    want = img2dataset(str(tmp_path / "synth"), str(tmp_path / "wds"))
    return mmfeed, str(tmp_path / "wds"), want


def check_keep(keep: dict, ids: list, want: dict, seen: dict):
    assert set(keep) == {"url", "label", "caption"}
    for i, sid in enumerate(ids):
        url, label = want[sid]
        assert keep["url"][i] == url and keep["label"][i] == label, sid
        assert isinstance(keep["caption"][i], str) and keep["caption"][i]
        seen["labels"] += label is not None
        seen["nulls"] += label is None


def test_shard_items_keep(corpus, tmp_path):
    mmfeed, wds, want = corpus
    out = subprocess.run([mmfeed, "shard", "--input", wds, *PLAN, "--keep", KEEP, "--out", str(tmp_path / "sh")],
                         check=True, capture_output=True, text=True).stdout
    assert "kept columns: url (utf8, 0 missing), label (int64, " in out
    seen = {"labels": 0, "nulls": 0}
    for rank in range(2):
        for data in ShardSource(str(tmp_path / "sh"), rank).steps({"epoch": 0, "next_step": 0}):
            for rec in data.records:
                assert pa.types.is_int64(rec.schema.field(keys.KEEP_COLUMN_PREFIX + "label").type)
                b = record_to_batch(rec)
                check_keep(b.keep, b.ids, want, seen)
                item = hf_item(b, micro_batches=len(data.records))
                assert item["keep"] is b.keep
    assert seen["labels"] and seen["nulls"]


def test_served_items_keep(corpus, tmp_path):
    mmfeed, wds, want = corpus
    port = free_port()
    serve = subprocess.Popen([mmfeed, "serve", "--input", wds, *PLAN, "--keep", KEEP, "--job", "keeptest",
                              "--data-dir", str(tmp_path / "serve"), "--nats-listen", f"127.0.0.1:{port}",
                              "--http", ""], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, errors = {"labels": 0, "nulls": 0}, []
    try:
        wait_for_port(port, deadline_s=60, proc=serve)

        def rank(dp):
            try:
                stream = Stream(f"nats://127.0.0.1:{port}", "keeptest", dp_rank=dp, mp_rank=0, dp=2, epochs=1,
                                request_timeout_s=5.0)
                deadline = time.monotonic() + 60
                while True:  # the service answers register once its first epoch is planned
                    try:
                        stream.__enter__()
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.3)
                with stream:
                    for mb in stream:
                        check_keep(mb["keep"], mb["id"], want, seen)
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=rank, args=(dp,)) for dp in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert serve.wait(timeout=60) == 0, serve.stdout.read()
    finally:
        if serve.poll() is None:
            serve.kill()
    assert seen["labels"] and seen["nulls"]


def _record(**extra):
    cols = {"id": pa.array(["a", "b"]), "step": pa.array([0, 0], pa.int32()),
            "micro_batch": pa.array([0, 0], pa.int32()), "weight": pa.array([1, 0], pa.float32()), **extra}
    return pa.RecordBatch.from_pydict(cols)


def test_keep_absent_or_malformed():
    rec = _record(input_ids=pa.array([[1], [2]], pa.list_(pa.int32())))
    b = record_to_batch(rec, role="text")
    assert b.keep is None and "keep" not in b.to_dict()
    ok = _record(input_ids=pa.array([[1], [2]], pa.list_(pa.int32())),
                 **{"keep.url": pa.array(["u", None]), "keep.score": pa.array([0.5, None], pa.float64())})
    b = record_to_batch(ok, role="text")
    assert b.keep == {"url": ["u", None], "score": [0.5, None]} and b.to_dict()["keep"] == b.keep
    bad = _record(input_ids=pa.array([[1], [2]], pa.list_(pa.int32())), **{"keep.x": pa.array([1, 2], pa.int32())})
    with pytest.raises(BatchError, match="keep.x"):
        record_to_batch(bad, role="text")
