"""The accuracy study (scripts/quality.py): its statistics, its corpus, and a short run of the
whole pipeline (shard, train with torchrun, held-out retrieval). The full study is
``make quality`` (also run by ``make bench``)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "quality.py")


def _quality():
    spec = importlib.util.spec_from_file_location("quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("a,b,diff", [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0.0),
    ([2.0, 2.5, 3.0], [1.0, 1.5, 2.0], 1.0),
    ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 1.0),
])
def test_summarize_diff_and_ci(a, b, diff):
    q = _quality()
    runs = {"random": [{m: x for m in q.METRICS} for x in b], "mmfeed": [{m: x for m in q.METRICS} for x in a]}
    out = q.summarize(runs, 64)
    assert out["quality_samples_per_run"] == 64
    assert out["quality_mmfeed_r1_i2t_diff"] == pytest.approx(diff)
    se = math.sqrt(sum((x - sum(a) / 3) ** 2 for x in a) / 2 / 3 + sum((x - sum(b) / 3) ** 2 for x in b) / 2 / 3)
    want = (2.776 * se) if se else 0.0  # Welch df = 4 for equal variances and n = 3
    assert out["quality_mmfeed_r1_i2t_diff_ci95"] == pytest.approx(want, rel=1e-6)
    m, s = q.mean_std(a)
    assert out["quality_mmfeed_loss_mean"] == pytest.approx(m)
    assert out["quality_mmfeed_loss_std"] == pytest.approx(s)
    assert "quality_random_loss_diff" not in out


def test_corpus_captions_name_their_image(tmp_path):
    q = _quality()
    path = q.make_corpus(str(tmp_path), 40, seed=3)
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert len(lines) == 40 and len({l["id"] for l in lines}) == 40
    lengths = set()
    for l in lines:
        words = l["text"].split()
        assert words[1] in q.COLORS and words[2] in q.SHAPES and words[5] in q.PLACES
        assert words[7].rstrip(".") in q.GROUNDS
        assert os.path.exists(os.path.join(tmp_path, l["image"]))
        lengths.add(len(words))
    assert len(lengths) > 3  # captions vary in length, so the strategies differ


def test_quality_study_short(mmfeed, tmp_path):
    """The whole pipeline on a tiny corpus: keys for both strategies, recalls in [0, 1]."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "trainer") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, SCRIPT, "--mmfeed", mmfeed, "--out", str(tmp_path), "--train", "96",
                          "--eval", "64", "--seeds", "1", "--steps", "3", "--strategies", "random,mmfeed_packed"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["quality_samples_per_run"] == 3 * 32
    for name in ("random", "mmfeed_packed"):
        for metric in ("loss", "eval_loss", "r1_i2t", "r1_t2i", "r5_i2t", "r5_t2i"):
            assert math.isfinite(out[f"quality_{name}_{metric}_mean"]), (name, metric)
        for metric in ("r1_i2t", "r1_t2i", "r5_i2t", "r5_t2i"):
            assert 0 <= out[f"quality_{name}_{metric}_mean"] <= 1
        assert out[f"quality_{name}_r5_i2t_mean"] >= out[f"quality_{name}_r1_i2t_mean"]
        assert out[f"quality_{name}_loss_mean"] > 0
    assert "quality_mmfeed_packed_r1_i2t_diff_ci95" in out
