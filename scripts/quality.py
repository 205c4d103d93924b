"""Does balancing cost accuracy? Train the tiny model on the same learnable corpus under each
sampling strategy and compare held-out retrieval (docs/cost-model.md, "Accuracy").

For every strategy (random, length_grouped, mmfeed, mmfeed_packed) and seed it

1. plans and writes the training split with ``mmfeed shard`` (dp 2, the plan seeded too);
2. trains ``python -m mmfeed_trainer --model tiny`` on it with torchrun (2 dp ranks, gloo, CPU)
   for the same number of steps, so every run sees the same number of samples;
3. embeds the held-out split with the trained parameters and measures recall@1 and @5
   (image→text, text→image) among the held-out samples, and the held-out contrastive loss
   over fixed batches of ``EVAL_BATCH``.

It prints one JSON object of ``quality_<strategy>_<metric>_mean`` / ``_std`` keys (metrics
``loss`` = training loss of the last ``LOSS_TAIL`` steps, ``eval_loss``, ``r1_i2t``, ``r1_t2i``,
``r5_i2t``, ``r5_t2i``), ``quality_<strategy>_<metric>_diff`` (minus random's) with
``_diff_ci95`` (Welch 95% half-width over seeds), and ``quality_samples_per_run``.

The corpus is generated (``make_corpus``): an image of one coloured shape at a place on a
coloured ground, of a random size, and a caption that names the four, followed by a
long-tailed run of filler words, so captions and images vary in cost like real data and the
caption identifies the image.

    python scripts/quality.py --mmfeed bin/mmfeed --out /tmp/q [--seeds 3 --steps 150]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40),
          "purple": (140, 50, 170), "orange": (240, 140, 20), "white": (245, 245, 245), "black": (15, 15, 15)}
GROUNDS = {"gray": (128, 128, 128), "brown": (120, 80, 40), "pink": (240, 170, 190), "teal": (20, 130, 130)}
SHAPES = ("square", "circle", "triangle", "cross")
PLACES = {"left": (0.25, 0.5), "right": (0.75, 0.5), "top": (0.5, 0.25), "bottom": (0.5, 0.75),
          "center": (0.5, 0.5)}
FILLER = ("photo", "picture", "simple", "drawing", "plain", "scene", "image", "shown", "here", "quite",
          "small", "flat", "digital", "sample", "today", "again", "nice", "one", "clear", "view")
STRATEGIES = (("random", "random", False), ("length_grouped", "length_grouped", False),
              ("mmfeed", "mmfeed", False), ("mmfeed_packed", "mmfeed", True))
METRICS = ("loss", "eval_loss", "r1_i2t", "r1_t2i", "r5_i2t", "r5_t2i")
EVAL_BATCH = 32
LOSS_TAIL = 10
DP, MICRO_BATCHES, GLOBAL_BATCH = 2, 2, 32


def make_corpus(out: str, n: int, seed: int) -> str:
    """Write n images and manifest.jsonl under out; return the manifest path."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    lines = []
    for i in range(n):
        color, ground = rng.choice(list(COLORS)), rng.choice(list(GROUNDS))
        shape, place = rng.choice(SHAPES), rng.choice(list(PLACES))
        side = rng.choice((32, 48, 64, 96, 128))
        w, h = side, rng.choice((side, side * 3 // 2))
        img = Image.new("RGB", (w, h), GROUNDS[ground])
        d = ImageDraw.Draw(img)
        cx, cy = PLACES[place][0] * w, PLACES[place][1] * h
        r = min(w, h) * 0.22
        box = (cx - r, cy - r, cx + r, cy + r)
        fill = COLORS[color]
        if shape == "square":
            d.rectangle(box, fill=fill)
        elif shape == "circle":
            d.ellipse(box, fill=fill)
        elif shape == "triangle":
            d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
        else:
            d.rectangle((cx - r, cy - r / 3, cx + r, cy + r / 3), fill=fill)
            d.rectangle((cx - r / 3, cy - r, cx + r / 3, cy + r), fill=fill)
        name = f"images/{i:05d}.png"
        img.save(os.path.join(out, name))
        extra = min(60, int(math.exp(rng.gauss(1.5, 1.0))))
        words = [rng.choice(FILLER) for _ in range(extra)]
        text = f"a {color} {shape} at the {place} on {ground}. " + " ".join(words)
        lines.append(json.dumps({"image": name, "text": text.strip(), "id": f"q{seed}-{i:05d}"}))
    path = os.path.join(out, "manifest.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def shard(mmfeed: str, manifest: str, out: str, strategy: str, pack: bool, seed: int, epochs: int,
          dp: int = DP, global_batch: int = GLOBAL_BATCH, micro_batches: int = MICRO_BATCHES) -> None:
    args = [mmfeed, "shard", "--input", manifest, "--out", out, "--strategy", strategy, "--seed", str(seed),
            "--epochs", str(epochs), "--dp", str(dp), "--micro-batches", str(micro_batches),
            "--global-batch", str(global_batch), "--model", "tiny", "--resize", "dynamic",
            "--min-pixels", "256", "--max-pixels", "16384", "--dtype", "uint8", "--max-length", "64",
            "--workers", "2"]
    if pack:
        args.append("--pack")
    subprocess.run(args, check=True, capture_output=True, text=True)


LOSS_RE = re.compile(r"step (\d+) loss ([0-9.]+)")


def train(python: str, shards: str, params: str, seed: int, steps: int, pack: bool) -> list[float]:
    """Train on shards; return the per-step training losses rank 0 logged."""
    args = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP),
            "-m", "mmfeed_trainer", "--shards", shards, "--dp", str(DP), "--model", "tiny",
            "--steps", str(steps), "--seed", str(seed), "--lr", "2e-3", "--warmup", "10",
            "--log-every", "1", "--save-params", params]
    if pack:
        args.append("--pack")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(args, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"trainer failed ({res.returncode}):\n{res.stderr[-3000:]}")
    losses = [float(m.group(2)) for m in LOSS_RE.finditer(res.stdout + res.stderr)]
    if not losses:
        raise RuntimeError("trainer logged no loss:\n" + (res.stdout + res.stderr)[-3000:])
    return losses


def evaluate(params: str, eval_shards: str) -> dict:
    """Held-out recall@1/@5 both ways and the mean held-out contrastive loss."""
    import torch
    import torch.nn.functional as F

    from mmfeed_trainer import batches, config
    from mmfeed_trainer.model import MMModel
    from mmfeed_trainer.sources import START, ShardSource

    mcfg = config.model_config("tiny")
    torch.manual_seed(0)
    model = MMModel(mcfg)
    model.load_state_dict(torch.load(os.path.join(params, "params-mp0.pt"), map_location="cpu"))
    model.eval()
    imgs, txts = [], []
    with torch.no_grad():
        for data in ShardSource(eval_shards, 0).steps(dict(START)):
            for rb in data.records:
                b = batches.record_to_batch(rb, pad_id=mcfg.pad_token_id).to(torch.device("cpu"))
                live = b.weight > 0
                imgs.append(model.vision(b.pixel_values, b.pixel_shape).emb[live])
                txts.append(model.text(b.input_ids, b.lengths).emb[live])
        img, txt = torch.cat(imgs), torch.cat(txts)
        sim = img @ txt.T
        target = torch.arange(len(img))

        def recall(s: torch.Tensor, k: int) -> float:
            top = s.topk(k, dim=1).indices
            return (top == target[:, None]).any(dim=1).float().mean().item()

        scale = model.itc().item()
        losses = []
        for start in range(0, len(img) - EVAL_BATCH + 1, EVAL_BATCH):
            logits = scale * sim[start:start + EVAL_BATCH, start:start + EVAL_BATCH]
            t = torch.arange(EVAL_BATCH)
            losses.append(((F.cross_entropy(logits, t) + F.cross_entropy(logits.T, t)) / 2).item())
    return {"r1_i2t": recall(sim, 1), "r1_t2i": recall(sim.T, 1), "r5_i2t": recall(sim, 5),
            "r5_t2i": recall(sim.T, 5), "eval_loss": sum(losses) / len(losses), "eval_samples": len(img)}


def t975(df: float) -> float:
    """Student's t 0.975 quantile (table for small df, normal limit above)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 8: 2.306, 10: 2.228, 20: 2.086}
    for d in sorted(table):
        if df <= d:
            return table[d]
    return 1.96


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summarize(runs: dict[str, list[dict]], samples_per_run: int) -> dict:
    out: dict[str, float] = {"quality_samples_per_run": float(samples_per_run)}
    for name, rs in runs.items():
        for metric in METRICS:
            m, s = mean_std([r[metric] for r in rs])
            out[f"quality_{name}_{metric}_mean"], out[f"quality_{name}_{metric}_std"] = m, s
    base = runs.get("random")
    for name, rs in runs.items():
        if name == "random" or not base:
            continue
        for metric in METRICS:
            a, b = [r[metric] for r in rs], [r[metric] for r in base]
            (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
            va, vb = sa * sa / len(a), sb * sb / len(b)
            se = math.sqrt(va + vb)
            df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if len(a) > 1 else 0) +
                                   (vb * vb / (len(b) - 1) if len(b) > 1 else 0) or 1e-300)
            out[f"quality_{name}_{metric}_diff"] = ma - mb
            out[f"quality_{name}_{metric}_diff_ci95"] = t975(df) * se
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mmfeed", default="bin/mmfeed")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", required=True, help="work folder (corpus, shards, parameters)")
    p.add_argument("--train", type=int, default=1024, help="training samples")
    p.add_argument("--eval", type=int, default=256, help="held-out samples")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150, help="training steps per run (global batch 32)")
    p.add_argument("--strategies", default=",".join(s[0] for s in STRATEGIES))
    a = p.parse_args()
    train_manifest = make_corpus(os.path.join(a.out, "train"), a.train, seed=1)
    eval_manifest = make_corpus(os.path.join(a.out, "eval"), a.eval, seed=2)
    eval_shards = os.path.join(a.out, "eval-shards")
    if not os.path.exists(eval_shards):
        shard(a.mmfeed, eval_manifest, eval_shards, "random", False, 0, 1, dp=1, global_batch=EVAL_BATCH,
              micro_batches=1)
    epochs = math.ceil(a.steps * GLOBAL_BATCH / a.train) + 1
    wanted = a.strategies.split(",")
    runs: dict[str, list[dict]] = {}
    for seed in range(a.seeds):
        for name, strategy, pack in STRATEGIES:
            if name not in wanted:
                continue
            shards = os.path.join(a.out, f"shards-{name}-{seed}")
            shard(a.mmfeed, train_manifest, shards, strategy, pack, seed, epochs)
            params = os.path.join(a.out, f"params-{name}-{seed}")
            losses = train(a.python, shards, params, seed, a.steps, pack)
            r = evaluate(params, eval_shards)
            r["loss"] = sum(losses[-LOSS_TAIL:]) / len(losses[-LOSS_TAIL:])
            print(f"{name} seed {seed}: " + " ".join(f"{k} {v:.4f}" for k, v in r.items()), file=sys.stderr)
            runs.setdefault(name, []).append(r)
    print(json.dumps(summarize(runs, a.steps * GLOBAL_BATCH), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
