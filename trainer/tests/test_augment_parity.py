"""`mmfeed shard --augment`: bit-identical with torchvision given the same parameters.

The parameters come from the recipe docs/augment.md documents (SplitMix64 seeded by
(seed ^ fnv1a64(id), epoch), torchvision's RandomResizedCrop.get_params on it), written
here again in Python; the pixels from torchvision.transforms.functional.resized_crop on
the PIL image (EXIF-transposed), then hflip. Images of odd sizes, PNG and JPEG (the
exact decode path), one with an EXIF rotation, one so wide that the crop falls back to
the centre.
"""

import json
import math
import subprocess

import numpy as np
import pytest
from PIL import Image, ImageOps
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from mmfeed_trainer.data.sources import ShardSource

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


class Rand:
    """loader.NewEpochRand: SplitMix64 from mix(seed ^ mix(epoch + GOLDEN))."""

    def __init__(self, seed, epoch):
        self.state = mix(seed ^ mix((epoch + GOLDEN) & M64))

    def next(self):
        self.state = (self.state + GOLDEN) & M64
        return mix(self.state)

    def unit(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        return (self.next() * n) >> 64


def augment_params(seed, epoch, sid, w, h, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), p=0.5):
    """(top, left, height, width, flip) of sample sid in epoch for a w x h image."""
    r = Rand(seed ^ fnv1a64(sid.encode()), epoch)
    flip = r.unit() < p
    area = float(w) * float(h)
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * r.unit())
        ar = math.exp(lo + (hi - lo) * r.unit())
        cw, ch = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
        if 0 < cw <= w and 0 < ch <= h:
            top = r.below(h - ch + 1)
            return top, r.below(w - cw + 1), ch, cw, flip
    cw, ch = w, h
    if w / h < ratio[0]:
        ch = round(cw / ratio[0])
    elif w / h > ratio[1]:
        cw = round(ch * ratio[1])
    return (h - ch) // 2, (w - cw) // 2, ch, cw, flip


def smart_resize(h, w, f, min_px, max_px):
    """imgproc's smartResize (Qwen2-VL's smart_resize, factor f)."""
    hb, wb = max(f, round(h / f) * f), max(f, round(w / f) * f)
    if hb * wb > max_px:
        beta = math.sqrt(h * w / max_px)
        hb, wb = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    elif hb * wb < min_px:
        beta = math.sqrt(min_px / (h * w))
        hb, wb = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    return min(hb, 1 << 14), min(wb, 1 << 14)


SIZES = [(97, 61, "png"), (61, 97, "jpg"), (333, 211, "jpg"), (50, 499, "png"), (640, 17, "png"),
         (129, 128, "jpg"), (211, 333, "jpg-exif6"), (75, 75, "png")]
SEED, EPOCH, PATCH = 11, 3, 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("augment")
    rng = np.random.default_rng(5)
    rows, images = [], {}
    for k in range(3):  # 24 samples: three of each size
        for i, (w, h, fmt) in enumerate(SIZES):
            sid = f"s{k}-{i}"
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx ^ yy) & 255], -1)
            px = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
            img = Image.fromarray(px, "RGB")
            name = f"{sid}.{fmt.split('-')[0]}"
            if fmt == "png":
                img.save(out / name)
            elif fmt == "jpg":
                img.save(out / name, quality=90)
            else:  # stored rotated, EXIF orientation 6 turns it upright
                exif = Image.Exif()
                exif[0x0112] = 6
                img.save(out / name, quality=90, exif=exif)
            rows.append({"id": sid, "image": name, "text": f"caption {sid}"})
            with Image.open(out / name) as src:
                images[sid] = ImageOps.exif_transpose(src).convert("RGB")
    (out / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, images


def shard(mmfeed, corpus_dir, out, *flags):
    subprocess.run([mmfeed, "shard", "--input", str(corpus_dir / "manifest.jsonl"), "--dp", "1",
                    "--micro-batches", "1", "--global-batch", "8", "--dtype", "uint8", "--workers", "2",
                    "--seed", "1", "--augment-seed", str(SEED), "--epoch", str(EPOCH), "--patch-size", str(PATCH),
                    "--out", str(out), *flags], check=True, capture_output=True)
    aug = json.loads((out / "shard.json").read_text())["augment"]  # the set records its augmentation
    assert aug["rrc"] and aug["flip_p"] == 0.5 and aug["seed"] == SEED, aug
    got = {}
    for step in ShardSource(str(out), 0).steps({}):
        for rb in step.records:
            ids, shapes = rb.column("id").to_pylist(), rb.column("pixel_shape").to_pylist()
            for i, (sid, shape) in enumerate(zip(ids, shapes)):
                px = np.frombuffer(rb.column("pixel_values")[i].values.to_numpy(zero_copy_only=False), np.uint8)
                got[sid] = px.reshape(shape)
    return got


def reference(img, params, size):
    top, left, h, w, flip = params
    out = F.resized_crop(img, top, left, h, w, list(size), InterpolationMode.BILINEAR)
    if flip:
        out = F.hflip(out)
    return np.asarray(out).transpose(2, 0, 1)


@pytest.mark.parametrize("policy", ["shorter-crop", "dynamic"])
def test_augmented_shard_equals_torchvision(mmfeed, corpus, tmp_path, policy):
    corpus_dir, images = corpus
    flags = ["--augment", "rrc,hflip", "--resize", policy]
    if policy == "dynamic":
        flags += ["--min-pixels", str(32 * 32), "--max-pixels", str(96 * 96)]
    else:
        flags += ["--image-size", "40"]
    got = shard(mmfeed, corpus_dir, tmp_path / policy, *flags)
    assert len(got) == len(images)
    flips, fallbacks = 0, 0
    for sid, pixels in got.items():
        img = images[sid]
        params = augment_params(SEED, EPOCH, sid, img.width, img.height)
        top, left, h, w, flip = params
        size = (40, 40) if policy == "shorter-crop" else smart_resize(h, w, PATCH, 32 * 32, 96 * 96)
        want = reference(img, params, size)
        assert pixels.shape == want.shape, (sid, params)
        diff = int(np.count_nonzero(pixels != want))
        assert diff == 0, f"{sid} {params}: {diff} of {want.size} values differ"
        flips += flip
        fallbacks += img.width / img.height > 4 / 3 and h == img.height and w == round(h * 4 / 3)
    assert 0 < flips < len(got)
    assert fallbacks > 0  # the 640x17 images take torchvision's centre-crop fallback
    # two epochs see different crops
    other = {sid: augment_params(SEED, EPOCH + 1, sid, im.width, im.height) for sid, im in images.items()}
    assert sum(other[s] != augment_params(SEED, EPOCH, s, im.width, im.height) for s, im in images.items()) > 20
