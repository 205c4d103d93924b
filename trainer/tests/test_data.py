"""``mmfeed_trainer.data`` against the real service and real shards.

* StreamDataset: consumers started before ``mmfeed serve`` wait for it; both dp ranks stop
  mid-epoch (one abruptly, one cleanly), new processes restore the pickled ``state_dict``
  and finish: every sample of the plan is seen exactly once, at its planned (step,
  micro-batch). The layout and the placement come from the service: four ranks read a
  ``--mp 2 --placement colocated`` job.
* ShardDataset: a stop and a restore give the same items as one uninterrupted pass.
* weighted_loss: dp 2 with unequal, zero-weight-padded batches under DDP's gradient
  averaging equals one process on the global batch.
"""

import gc
import json
import math
import os
import pickle
import subprocess
import sys
import threading
from collections import Counter, defaultdict

import pytest
import torch

from _data_consumer import consume
from _dist import free_port, run_world
from test_stream import wait_for_port
from mmfeed_trainer.data.datasets import ShardDataset, StreamDataset, weighted_loss

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_data_consumer.py")
PLAN = ["--global-batch", "16", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]


def run(*args):
    return subprocess.run([BIN, *args], check=True, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(manifest, {id: (step, rank, micro_batch)} of the real samples that shard plans for dp 2, shard dir)."""
    if not os.access(BIN, os.X_OK):
        pytest.skip("bin/mmfeed missing (make build)")
    tmp = tmp_path_factory.mktemp("data")
    run("synth", "--out", str(tmp / "corpus"), "--samples", "120", "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp / "corpus" / "manifest.jsonl")
    run("shard", "--input", manifest, "--dp", "2", *PLAN, "--out", str(tmp / "shards"))
    plan = {}
    for line in open(tmp / "shards" / "plan.jsonl"):
        p = json.loads(line)
        if "step" in p and p["weight"] > 0:
            plan[p["id"]] = (p["step"], p["rank"], p["micro_batch"])
    return manifest, plan, str(tmp / "shards")


def consumer(url, job, world, rank, out, *args):
    """Rank ``rank`` as a process of its own (_data_consumer.py)."""
    env = dict(os.environ, WORLD_SIZE=str(world), RANK=str(rank))
    return subprocess.Popen([sys.executable, CONSUMER, url, job, str(out), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, out):
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, log
    return json.load(open(out))


def in_thread(fn, *args, **kw):
    """Run fn in a thread; returns a join() that gives its result or raises its error."""
    box = {}

    def body():
        try:
            box["res"] = fn(*args, **kw)
        except BaseException as err:
            box["err"] = err
    t = threading.Thread(target=body)
    t.start()

    def join():
        t.join(timeout=120)
        if "err" in box:
            raise box["err"]
        return box["res"]
    return join


def serve(manifest, tmp_path, port, *layout):
    return subprocess.Popen([BIN, "serve", "--input", manifest, *layout, *PLAN, "--job", "datatest",
                             "--data-dir", str(tmp_path / "serve"), "--nats-listen", f"127.0.0.1:{port}", "--http", ""],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# A coroutine the stream leaves unawaited at close warns only when it is collected: as an
# error, in the test (RuntimeWarning) or from the collector (unraisable), the test fails.
@pytest.mark.filterwarnings("error::RuntimeWarning", "error::pytest.PytestUnraisableExceptionWarning")
def test_stream_dataset_resumes_from_its_state_exactly_once(corpus, tmp_path):
    """dp rank 0 runs in processes (stopped abruptly, restored in a new process), dp rank 1 in
    threads of this one (stopped cleanly, restored in a new dataset)."""
    manifest, plan, _ = corpus
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    # Started before the service: they wait for it instead of failing.
    proc = consumer(url, "datatest", 2, 0, tmp_path / "a.json", "--take", "5", "--crash")
    thread = in_thread(consume, url, "datatest", take=3, rank=1, world_size=2)
    svc = serve(manifest, tmp_path, port, "--dp", "2")
    try:
        first = [finish(proc, tmp_path / "a.json")]
        res, ds = thread()
        ds.stream.close()
        first.append(res)
        assert [s["state"]["next_step"] for s in first] == [2, 1], [s["state"] for s in first]
        assert [s["state"]["next_micro_batch"] for s in first] == [1, 1]
        proc = consumer(url, "datatest", 2, 0, tmp_path / "b.json", "--state", str(tmp_path / "a.json.pkl"))
        thread = in_thread(consume, url, "datatest", state=pickle.loads(pickle.dumps(first[1]["state"])),
                           rank=1, world_size=2)
        second = [finish(proc, tmp_path / "b.json"), thread()[0]]
        assert svc.wait(timeout=60) == 0, svc.stdout.read()
    finally:
        if svc.poll() is None:
            svc.kill()
    got = defaultdict(list)
    for rank, res in enumerate(first + second):
        for epoch, step, mb, i in res["rows"]:
            got[i].append((step, rank % 2, mb))
    twice = {i: w for i, w in got.items() if len(w) > 1}
    assert not twice, f"seen more than once: {twice}"
    assert set(got) == set(plan), f"missing {set(plan) - set(got)}, extra {set(got) - set(plan)}"
    assert {i: w[0] for i, w in got.items()} == plan
    assert set(first[0]["keys"]) >= {"input_ids", "attention_mask", "pixel_values", "weight", "ids"}
    assert second[0]["state"]["plan_hash"] and second[0]["state"]["plan_hash"] == second[1]["state"]["plan_hash"]
    gc.collect()  # a coroutine left unawaited warns now, inside the test


def test_stream_dataset_takes_the_layout_from_the_service(corpus, tmp_path):
    manifest, plan, _ = corpus
    port = free_port()
    svc = serve(manifest, tmp_path, port, "--dp", "2", "--mp", "2", "--placement", "colocated")
    res, errors = [None] * 4, []

    def rank(r):  # four ranks of a world of 4, told nothing about the layout
        try:
            ds = StreamDataset(f"nats://127.0.0.1:{port}", "datatest", rank=r, world_size=4, request_timeout_s=5.0)
            rows, keys = [], set()
            for x in ds:
                keys |= set(x)
                rows += [i for i, w in zip(x["ids"], x["weight"].tolist()) if w > 0]
            res[r] = (ds.stream.dims.dp, ds.stream.dims.mp, ds.stream.ranks, ds.stream.role, keys, rows)
            assert list(ds) == [], "a second pass after the job's end yields nothing (and does not wait)"
        except BaseException as err:
            errors.append(err)

    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert svc.wait(timeout=60) == 0, svc.stdout.read()
    finally:
        if svc.poll() is None:
            svc.kill()
    for r, (dp, mp, ranks, role, keys, _) in enumerate(res):
        assert (dp, mp, ranks, role) == (2, 2, (r // 2, r % 2), "full")
        assert {"input_ids", "pixel_values"} <= keys
    assert res[0][5] == res[1][5] and res[2][5] == res[3][5], "the mp ranks of a dp rank got different samples"
    ids = Counter(res[0][5] + res[2][5])
    assert max(ids.values()) == 1 and set(ids) == set(plan)


def items(ds):
    return [(x["epoch"], x["step"], x["micro_batch"], tuple(x["ids"])) for x in ds]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_dataloader_with_a_batch_size_says_to_pass_none(corpus, batch_size):
    from torch.utils.data import DataLoader
    ds = ShardDataset(corpus[2], rank=0, world_size=2)
    with pytest.raises(TypeError, match=rf"DataLoader\(ds, batch_size={batch_size}\).*use DataLoader\(ds, batch_size=None"):
        next(iter(DataLoader(ds, batch_size=batch_size)))
    item = next(iter(DataLoader(ds, batch_size=None)))
    assert item["input_ids"].dim() == 2 and isinstance(item["ids"], list)


@pytest.mark.parametrize("stop", [1, 4, 5])
def test_shard_dataset_state_round_trip(corpus, stop):
    shards = corpus[2]
    whole = items(ShardDataset(shards, rank=1, world_size=2, epochs=2))
    first = ShardDataset(shards, rank=1, world_size=2, epochs=2)
    it = iter(first)
    head = []
    for _ in range(stop):
        head.append(next(it))
        assert first.state_after(head[-1]) == first.state_dict()  # what a prefetching loader saves
    resumed = ShardDataset(shards, rank=1, world_size=2, epochs=2)
    resumed.load_state_dict(first.state_dict())
    assert items(head) + items(resumed) == whole
    x = head[0]
    assert x["pixel_values"].dtype == torch.float32 and x["input_ids"].dtype == torch.int64
    assert x["weight"].shape == (len(x["ids"]),)


def test_shard_dataset_modality_ranks_and_raw_pixels(corpus):
    shards = corpus[2]
    vision = next(iter(ShardDataset(shards, rank=2, world_size=4, mp=2, placement="modality", normalize=False)))
    text = next(iter(ShardDataset(shards, rank=3, world_size=4, mp=2, placement="modality")))
    assert "input_ids" not in vision and "pixel_values" not in text and vision["ids"] == text["ids"]
    assert vision["pixel_values"].dtype == torch.float16 and vision["pixel_mean"].shape == (3,)


def test_bad_state_and_layout_are_refused(corpus):
    ds = ShardDataset(corpus[2], rank=0, world_size=1)
    with pytest.raises(ValueError, match="state version"):
        ds.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="must be ints"):
        ds.load_state_dict({"version": 1, "epoch": -1, "next_step": 0, "next_micro_batch": 0})
    with pytest.raises(ValueError, match="outside a world"):
        StreamDataset("nats://127.0.0.1:1", "j", rank=2, world_size=2)
    with pytest.raises(ValueError, match="dp=3 x mp=1"):
        StreamDataset("nats://127.0.0.1:1", "j", rank=0, world_size=2, dp=3, mp=1)


def _weighted(rank, world, xs, ws):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, dtype=torch.float64))
    x, w = xs[rank], ws[rank]
    per_sample = (model(x).squeeze(1) - 1.0) ** 2
    per_sample = torch.where(w > 0, per_sample, torch.full_like(per_sample, float("nan")))  # padding may be NaN
    weighted_loss(per_sample, w).backward()
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 1, dtype=torch.float64)
    X, W = torch.cat(xs), torch.cat(ws)
    ((((ref(X).squeeze(1) - 1.0) ** 2) * W).sum() / W.sum()).backward()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


def test_weighted_loss_matches_one_process_under_ddp():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(7, 4, generator=g, dtype=torch.float64)]
    ws = [torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([1.0] * 5 + [0.0] * 2, dtype=torch.float64)]
    run_world(_weighted, 2, args=(xs, ws), timeout=120)


def test_hf_datasets_loads_the_shards(corpus, tmp_path):
    """HF ``datasets`` reads ``mmfeed shard`` files as they are; it drops the Arrow field
    metadata (pixel dtype, shape, mean, std), which pyarrow reads from the file (README)."""
    if os.environ.get("MMFEED_REQUIRE_PEERS"):
        import datasets  # pinned in requirements.txt: required
    else:
        datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    path = os.path.join(corpus[2], "rank-00000.arrow")
    ds = datasets.load_dataset("arrow", data_files=[path], split="train", cache_dir=str(tmp_path))
    table = pa.ipc.open_file(path).read_all()
    assert ds.num_rows == table.num_rows and ds["id"] == table.column("id").to_pylist()
    row = ds[0]
    assert len(row["pixel_values"]) == math.prod(row["pixel_shape"])
    meta = pa.ipc.open_file(path).schema.field("pixel_values").metadata
    assert json.loads(meta[b"shape"]) == row["pixel_shape"] and meta[b"dtype"] == b"float16"
    assert ds.data.schema.field("pixel_values").metadata is None, "HF kept the field metadata: update the README"


def test_shard_file_names_match_the_go_writer(corpus):
    """The names ``mmfeed shard`` writes (Go's pipeline.RankFile) are the ones ShardSource opens."""
    from mmfeed_trainer.data.sources import ShardSource
    written = sorted(f for f in os.listdir(corpus[2]) if f.endswith(".arrow"))
    src = [ShardSource(corpus[2], r) for r in range(2)]
    opened = {f["path"] for f in src[0].set.files} | {e["path"] for e in src[0].set.epochs.values()}
    assert written == sorted(opened)
