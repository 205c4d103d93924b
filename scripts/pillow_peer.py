#!/usr/bin/env python3
"""Pillow + numpy peer of the Go imgproc package.

Subcommands (run with the project venv: $MMFEED_PYTHON or .venv/bin/python):

  gen OUT [--n 220] [--seed 1]
      Write varied synthetic test images (JPEG baseline/progressive/gray/CMYK/
      EXIF-rotated, PNG 8/16-bit/palette/alpha/eXIf, GIF, BMP, TIFF, WebP
      lossy/lossless/alpha) and OUT/manifest.jsonl.
  gen-bench OUT [--n 32] [--width 1440] [--height 720]
      Write photo-like JPEGs (quality 90) for the throughput benchmark.
  process --list FILE --out DIR [--policy shorter-crop] [--size 224]
          [--filter bilinear] [--norm imagenet] [--draft-gap 0]
      For each path in FILE (one per line) write DIR/<i>.f32 (float32 CHW,
      little-endian, normalized) and a line of DIR/results.jsonl.
  bench (--list FILE | --dir DIR) [--size 224] [--repeat 3] [--draft-gap 0]
      Images per second for decode + shorter-crop + normalize to float16 on
      one core, files read into memory first: best of --repeat passes, by
      wall time and by process CPU time (robust on a shared machine).
      Prints one JSON line.
  bench-serve [--size 224] ...
      Like bench, one pass per JSON request {"dir": D, "draft_gap": G} read from stdin,
      one JSON line answered per pass: lets the Go benchmark interleave its passes with
      Pillow's in the same run (bench/imgproc.go).

The pipeline mirrors imgproc: sniffed decode, ImageOps.exif_transpose,
16-bit samples keep their high byte, alpha composited over white with
(c*a + bg*(255-a) + 127) // 255, torchvision Resize(S) + CenterCrop(S)
geometry, Image.resize (antialiased), (x/255 - mean)/std in float32.
"""
import argparse
import io
import json
import math
import os
import struct
import sys
import time
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageOps

NORMS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}
FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
BG = np.array([255, 255, 255], dtype=np.uint32)


# ---------------------------------------------------------------- geometry

def shorter_side(w, h, s):
    """torchvision _compute_resized_output_size for an int size."""
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s, int(s * long / short)
    return (new_short, new_long) if w <= h else (new_long, new_short)


def smart_resize(h, w, f, min_px, max_px):
    """Qwen2-VL smart_resize, factor f (never raises; sides >= f)."""
    hb = max(f, round(h / f) * f)
    wb = max(f, round(w / f) * f)
    if hb * wb > max_px:
        beta = math.sqrt(h * w / max_px)
        hb = max(f, math.floor(h / beta / f) * f)
        wb = max(f, math.floor(w / beta / f) * f)
    elif hb * wb < min_px:
        beta = math.sqrt(min_px / (h * w))
        hb = math.ceil(h * beta / f) * f
        wb = math.ceil(w * beta / f) * f
    return hb, wb


def plan(w, h, a):
    """(rw, rh, x0, y0, ow, oh) for a display-oriented w x h source."""
    if a.policy == "square":
        return a.size, a.size, 0, 0, a.size, a.size
    if a.policy == "dynamic":
        rh, rw = smart_resize(h, w, a.patch, a.min_pixels, a.max_pixels)
        return rw, rh, 0, 0, rw, rh
    rw, rh = shorter_side(w, h, a.size)
    # torchvision center_crop: int(round((H - S) / 2.0)), Python round.
    return rw, rh, int(round((rw - a.size) / 2.0)), int(round((rh - a.size) / 2.0)), a.size, a.size


# ---------------------------------------------------------------- pipeline

def has_alpha(im):
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        im.mode in ("P", "L", "RGB", "1") and "transparency" in im.info)


def to_rgb_image(im, fast_alpha=False):
    """Decoded PIL image -> RGB image, mirroring imgproc's conversions.

    Alpha is composited with imgproc's integer formula in numpy; with
    fast_alpha (benchmark only) Pillow's C alpha_composite is used instead,
    which rounds slightly differently.
    """
    mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im).astype(np.int64)
        g = np.clip(a >> 8, 0, 255).astype(np.uint8)  # high byte (Pillow's own convert clips)
        return Image.fromarray(np.repeat(g[:, :, None], 3, axis=2))
    if has_alpha(im):
        if fast_alpha:
            bg = Image.new("RGBA", im.size, tuple(int(v) for v in BG) + (255,))
            return Image.alpha_composite(bg, im.convert("RGBA")).convert("RGB")
        rgba = np.asarray(im.convert("RGBA")).astype(np.uint32)
        c, al = rgba[:, :, :3], rgba[:, :, 3:4]
        return Image.fromarray(((c * al + BG * (255 - al) + 127) // 255).astype(np.uint8))
    return im.convert("RGB")


def process_bytes(data, a, mean, std, out_dtype=np.float32, fast_alpha=False):
    im = Image.open(io.BytesIO(data))
    w0, h0 = im.size
    orientation = im.getexif().get(0x0112, 1)
    if orientation not in range(1, 9):
        orientation = 1
    dw, dh = (h0, w0) if orientation >= 5 else (w0, h0)
    rw, rh, x0, y0, ow, oh = plan(dw, dh, a)
    if a.draft_gap > 0 and im.format == "JPEG" and im.mode in ("RGB", "L"):
        tw, th = (rh, rw) if orientation >= 5 else (rw, rh)
        im.draft("RGB", (math.ceil(a.draft_gap * tw), math.ceil(a.draft_gap * th)))
    im = ImageOps.exif_transpose(im)
    rgb = to_rgb_image(im, fast_alpha)
    if rgb.size != (rw, rh):
        rgb = rgb.resize((rw, rh), FILTERS[a.filter])
    arr = np.asarray(rgb)[y0:y0 + oh, x0:x0 + ow]
    x = (arr.astype(np.float32) / np.float32(255) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1).astype(out_dtype)), (dw, dh)


def norm_params(a):
    if a.norm == "custom":
        m, s = a.mean, a.std
    else:
        m, s = NORMS[a.norm]
    return np.array(m, dtype=np.float32), np.array(s, dtype=np.float32)


def cmd_process(a):
    mean, std = norm_params(a)
    os.makedirs(a.out, exist_ok=True)
    with open(a.list) as f:
        paths = [p.strip() for p in f if p.strip()]
    with open(os.path.join(a.out, "results.jsonl"), "w") as res:
        for i, p in enumerate(paths):
            rec = {"i": i, "path": p}
            try:
                with open(p, "rb") as f:
                    x, (dw, dh) = process_bytes(f.read(), a, mean, std)
                x.astype("<f4").tofile(os.path.join(a.out, f"{i}.f32"))
                rec.update(ok=True, shape=list(x.shape), src=[dw, dh])
            except Exception as e:  # recorded, compared with Go's error
                rec.update(ok=False, error=f"{type(e).__name__}: {e}")
            res.write(json.dumps(rec) + "\n")


def list_files(a):
    if a.list:
        with open(a.list) as f:
            return [p.strip() for p in f if p.strip()]
    out = []
    for root, _, files in os.walk(a.dir):
        out += [os.path.join(root, n) for n in sorted(files) if not n.endswith((".jsonl", ".json", ".txt"))]
    return sorted(out)


def cmd_bench(a):
    mean, std = norm_params(a)
    blobs = []
    for p in list_files(a):
        with open(p, "rb") as f:
            blobs.append(f.read())
    ok = 0
    for d in blobs:  # warm-up and count decodable files
        try:
            process_bytes(d, a, mean, std, np.float16, True)
            ok += 1
        except Exception:
            pass
    best = best_cpu = float("inf")
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        for d in blobs:
            try:
                process_bytes(d, a, mean, std, np.float16, True)
            except Exception:
                pass
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    print(json.dumps({"impl": "pillow", "pillow": Image.__version__, "files": len(blobs), "decoded": ok,
                      "draft_gap": a.draft_gap, "size": a.size, "seconds": round(best, 4),
                      "images_per_sec": round(len(blobs) / best, 2),
                      "images_per_cpu_sec": round(len(blobs) / best_cpu, 2)}))


def cmd_bench_serve(a):
    """One timed pass per request, so a caller can interleave its own passes with ours.

    Reads JSON lines {"dir": D, "draft_gap": G} on stdin; the first request for D reads its
    files into memory and runs a warm-up pass. Answers one JSON line per request with the
    pass's images per process CPU-second and per wall second.
    """
    cache = {}
    for line in sys.stdin:
        req = json.loads(line)
        a.dir, a.list, a.draft_gap = req["dir"], None, float(req.get("draft_gap", 0))
        mean, std = norm_params(a)
        if a.dir not in cache:
            blobs = []
            for p in list_files(a):
                with open(p, "rb") as f:
                    blobs.append(f.read())
            cache[a.dir] = blobs
            bench_pass(blobs, a, mean, std)  # warm-up
        blobs = cache[a.dir]
        t0, c0 = time.perf_counter(), time.process_time()
        bench_pass(blobs, a, mean, std)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"files": len(blobs), "images_per_cpu_sec": len(blobs) / cpu,
                          "images_per_sec": len(blobs) / wall}), flush=True)


def bench_pass(blobs, a, mean, std):
    for d in blobs:
        try:
            process_bytes(d, a, mean, std, np.float16, True)
        except Exception:  # undecodable files count, as in the Go benchmark
            pass


# ---------------------------------------------------------------- fixtures

def synth(rng, w, h):
    """Photo-like RGB content: gradients, shapes, texture, noise, blur."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, c0 = rng.uniform(-1, 1, 3)
        img[:, :, c] = 128 + 100 * (a * xx / max(w, 1) + b * yy / max(h, 1)) + 40 * c0
    if rng.random() < 0.5:  # periodic texture
        fx, fy = rng.uniform(0.01, 0.3, 2)
        img += 30 * np.sin(fx * xx + fy * yy)[:, :, None]
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(rng.integers(0, 12)):
        x0, x1 = sorted(rng.integers(-w // 4, w + w // 4, 2))
        y0, y1 = sorted(rng.integers(-h // 4, h + h // 4, 2))
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=col)
    if rng.random() < 0.5:
        im = im.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 3))))
    arr = np.asarray(im).astype(np.float32)
    arr += rng.normal(0, rng.choice([0, 2, 8, 25]), arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def alpha_plane(rng, w, h):
    yy, xx = np.mgrid[0:h, 0:w]
    a = (255 * (xx / max(w - 1, 1))).astype(np.uint8)
    a[(yy // max(h // 4, 1)) % 2 == 0] = 255
    a[: h // 8] = 0
    return a


def png16(path, arr16):
    """Minimal PNG writer for 16-bit RGB/RGBA (Pillow cannot write those)."""
    h, w, c = arr16.shape
    raw = b"".join(b"\x00" + arr16[y].astype(">u2").tobytes() for y in range(h))
    ctype = {3: 2, 4: 6}[c]

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def exif_bytes(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


KINDS = [
    "jpeg", "jpeg-prog", "jpeg-444", "jpeg-422", "jpeg-gray", "jpeg-cmyk", "jpeg-exif",
    "png-rgb", "png-rgba", "png-la", "png-l", "png-p", "png-p-trns", "png-16g", "png-16rgb",
    "png-16rgba", "png-exif", "gif", "gif-trns", "bmp", "bmp-p", "tiff", "tiff-lzw", "tiff-rgba",
    "tiff-16g", "webp", "webp-alpha", "webp-lossless",
]
SIZES = [(1, 1), (2, 3), (7, 5), (31, 17), (64, 64), (100, 300), (223, 224), (224, 224), (225, 301),
         (300, 200), (333, 500), (512, 384), (640, 480), (800, 600), (1024, 683), (1000, 60),
         (60, 900), (400, 1200), (1280, 720), (1440, 720), (1600, 1200)]


def write_fixture(rng, kind, w, h, path):
    rgb = synth(rng, w, h)
    im = Image.fromarray(rgb)
    q = int(rng.integers(60, 96))
    if kind == "jpeg":
        im.save(path, "JPEG", quality=q)
    elif kind == "jpeg-prog":
        im.save(path, "JPEG", quality=q, progressive=True, optimize=True)
    elif kind == "jpeg-444":
        im.save(path, "JPEG", quality=q, subsampling=0)
    elif kind == "jpeg-422":
        im.save(path, "JPEG", quality=q, subsampling=1)
    elif kind == "jpeg-gray":
        im.convert("L").save(path, "JPEG", quality=q)
    elif kind == "jpeg-cmyk":
        im.convert("CMYK").save(path, "JPEG", quality=q)
    elif kind == "jpeg-exif":
        im.save(path, "JPEG", quality=q, exif=exif_bytes(int(rng.integers(2, 9))))
    elif kind == "png-rgb":
        im.save(path, "PNG")
    elif kind == "png-rgba":
        Image.fromarray(np.dstack([rgb, alpha_plane(rng, w, h)])).save(path, "PNG")
    elif kind == "png-la":
        Image.fromarray(np.dstack([rgb[:, :, 1], alpha_plane(rng, w, h)])).save(path, "PNG")
    elif kind == "png-l":
        im.convert("L").save(path, "PNG")
    elif kind == "png-p":
        im.quantize(int(rng.integers(2, 257))).save(path, "PNG")
    elif kind == "png-p-trns":
        im.quantize(64).save(path, "PNG", transparency=int(rng.integers(0, 64)))
    elif kind == "png-16g":
        g = rgb[:, :, 0].astype(np.uint16) * 257 + rng.integers(0, 257, (h, w)).astype(np.uint16)
        Image.fromarray(g).save(path, "PNG")
    elif kind == "png-16rgb":
        png16(path, rgb.astype(np.uint16) * 256 + rng.integers(0, 256, rgb.shape).astype(np.uint16))
    elif kind == "png-16rgba":
        a = alpha_plane(rng, w, h).astype(np.uint16) * 257
        png16(path, np.dstack([rgb.astype(np.uint16) * 257, a]))
    elif kind == "png-exif":
        im.save(path, "PNG", exif=exif_bytes(int(rng.integers(2, 9))))
    elif kind == "gif":
        im.save(path, "GIF")
    elif kind == "gif-trns":
        im.quantize(32).save(path, "GIF", transparency=int(rng.integers(0, 32)))
    elif kind == "bmp":
        im.save(path, "BMP")
    elif kind == "bmp-p":
        im.quantize(16).save(path, "BMP")
    elif kind == "tiff":
        im.save(path, "TIFF")
    elif kind == "tiff-lzw":
        im.save(path, "TIFF", compression="tiff_lzw")
    elif kind == "tiff-rgba":
        Image.fromarray(np.dstack([rgb, alpha_plane(rng, w, h)])).save(path, "TIFF", compression="tiff_deflate")
    elif kind == "tiff-16g":
        g = rgb[:, :, 2].astype(np.uint16) * 257
        Image.fromarray(g).save(path, "TIFF")
    elif kind == "webp":
        im.save(path, "WEBP", quality=q)
    elif kind == "webp-alpha":
        Image.fromarray(np.dstack([rgb, alpha_plane(rng, w, h)])).save(path, "WEBP", quality=q)
    elif kind == "webp-lossless":
        im.save(path, "WEBP", lossless=True)
    else:
        raise ValueError(kind)


EXT = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "tiff": "tif", "webp": "webp"}


def cmd_gen(a):
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "manifest.jsonl"), "w") as man:
        for i in range(a.n):
            kind = KINDS[i % len(KINDS)]
            w, h = SIZES[int(rng.integers(0, len(SIZES)))]
            if rng.random() < 0.5:
                w, h = h, w
            name = f"{i:04d}-{kind}.{EXT[kind.split('-')[0]]}"
            write_fixture(rng, kind, w, h, os.path.join(a.out, name))
            man.write(json.dumps({"file": name, "kind": kind, "w": w, "h": h}) + "\n")


def cmd_gen_bench(a):
    """Photo-like JPEGs (default 1440x720, quality 90) for the throughput benchmark."""
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    for i in range(a.n):
        rgb = synth(rng, a.width, a.height)
        Image.fromarray(rgb).save(os.path.join(a.out, f"photo{i:03d}.jpg"), "JPEG", quality=90)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("out")
    g.add_argument("--n", type=int, default=220)
    g.add_argument("--seed", type=int, default=1)
    gb = sub.add_parser("gen-bench")
    gb.add_argument("out")
    gb.add_argument("--n", type=int, default=32)
    gb.add_argument("--width", type=int, default=1440)
    gb.add_argument("--height", type=int, default=720)
    gb.add_argument("--seed", type=int, default=2)
    for name in ("process", "bench", "bench-serve"):
        s = sub.add_parser(name)
        s.add_argument("--list")
        s.add_argument("--policy", default="shorter-crop", choices=["shorter-crop", "square", "dynamic"])
        s.add_argument("--size", type=int, default=224)
        s.add_argument("--patch", type=int, default=16)
        s.add_argument("--min-pixels", type=int, default=56 * 56)
        s.add_argument("--max-pixels", type=int, default=28 * 28 * 1280)
        s.add_argument("--filter", default="bilinear", choices=sorted(FILTERS))
        s.add_argument("--norm", default="imagenet", choices=["imagenet", "clip", "custom"])
        s.add_argument("--mean", type=float, nargs=3)
        s.add_argument("--std", type=float, nargs=3)
        s.add_argument("--draft-gap", type=float, default=0.0)
        if name == "process":
            s.add_argument("--out", required=True)
        elif name == "bench":
            s.add_argument("--dir")
            s.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    if a.cmd == "bench" and not (a.list or a.dir):
        p.error("bench needs --list or --dir")
    {"gen": cmd_gen, "gen-bench": cmd_gen_bench, "process": cmd_process, "bench": cmd_bench,
     "bench-serve": cmd_bench_serve}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
