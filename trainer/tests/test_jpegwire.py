"""JPEG pixels on the wire (``--dtype jpeg`` / ``jpeg-source``), decoded by the prefetcher.

Against the real service: the same corpus and plan served with the exact uint8 dtype and with
each JPEG mode give, through ``stream.Stream`` (whose prefetcher decodes on the CPU here), the
same ids, shapes and dtypes, and pixels within a PSNR floor of the exact ones. Built records:
the wire's limits are checked before anything decodes, and a bad JPEG is a ``BatchError``.
"""

import json
import os
import subprocess
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchvision.io import encode_jpeg

from _dist import free_port
from test_stream import wait_for_port
from mmfeed_trainer import keys
from mmfeed_trainer.data import synthetic
from mmfeed_trainer.data.batches import BatchError, record_to_batch
from mmfeed_trainer.parallel.parallel_dims import ROLE_FULL
from mmfeed_trainer.data.prefetch import Prefetcher
from mmfeed_trainer.data.sources import Source, StepData
from mmfeed_trainer.data.stream import Stream

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
PLAN = ["--dp", "1", "--global-batch", "8", "--micro-batches", "2", "--image-size", "48", "--seed", "5"]
FLOOR_DB = {"jpeg": 30.0, "jpeg-source": 30.0}
"""PSNR floors against the exact uint8 pixels: q95 re-encoding; and the source's own JPEG
resized by torchvision (antialiased, not Pillow-exact) on top of the source's own loss."""


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)


def serve_epoch(manifest: str, dtype: str, data_dir: str) -> dict:
    """id -> uint8 (3, H, W) pixels of one served epoch, read through ``Stream``."""
    port = free_port()
    serve = subprocess.Popen([BIN, "serve", "--input", manifest, *PLAN, "--dtype", dtype, "--job", "jpegwire",
                              "--data-dir", data_dir, "--nats-listen", f"127.0.0.1:{port}", "--http", ""],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got = {}
    try:
        wait_for_port(port, deadline_s=60)
        stream = Stream(f"nats://127.0.0.1:{port}", "jpegwire", dp_rank=0, mp_rank=0, dp=1, epochs=1,
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
                assert mb["pixel_dtype"] == "uint8" and mb["pixel_values"].dtype == torch.uint8
                assert mb["pixel_values"].shape[1:] == (3, 48, 48)
                for i, (sid, w) in enumerate(zip(mb["id"], mb["weight"].tolist())):
                    if w > 0:
                        got[sid] = mb["pixel_values"][i].clone()
                stream.feedback(compute_seconds=0.01, samples=len(mb["id"]))
        assert serve.wait(timeout=60) == 0, serve.stdout.read()
    finally:
        if serve.poll() is None:
            serve.kill()
    return got


def test_served_jpeg_modes_match_the_exact_path(mmfeed, tmp_path):
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", "40", "--seed", "3",
                    "--bad-fraction", "0.05"], check=True, capture_output=True, timeout=120)
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    exact = serve_epoch(manifest, "uint8", str(tmp_path / "u8"))
    assert len(exact) >= 30
    for dtype, floor in FLOOR_DB.items():
        got = serve_epoch(manifest, dtype, str(tmp_path / dtype))
        assert got.keys() == exact.keys()
        worst = min(psnr(got[k], exact[k]) for k in exact)
        assert worst >= floor, (dtype, worst)


class Records(Source):
    """One step of the given records."""

    def __init__(self, records):
        super().__init__()
        self.records = records

    def steps(self, position):
        yield StepData(0, self.records, epoch=0)


def smooth_record():
    """A synthetic uint8 micro-batch with smooth pictures (JPEG's use case, unlike noise)."""
    rb = synthetic.step_records(synthetic.SynthConfig(dtype="uint8"), 0, 0)[0]
    shapes = rb.column("pixel_shape").flatten().to_numpy().reshape(-1, 3)
    rows = []
    for k, (c, h, w) in enumerate(shapes.tolist()):
        y, x = np.mgrid[0:h, 0:w]
        planes = [127 + 100 * np.sin((x + 3 * ch + k) / 5.0) * np.cos((y - ch) / 7.0) for ch in range(c)]
        rows.append(np.stack(planes).clip(0, 255).astype(np.uint8).reshape(-1))
    i = rb.schema.get_field_index("pixel_values")
    return rb.set_column(i, rb.schema.field(i), pa.array(rows, pa.list_(pa.uint8())))


def image(b, i, scale=1):
    """Sample i's own uint8 pixels (without the micro-batch's padding), upscaled ``scale`` times."""
    _, h, w = b.pixel_shape[i].tolist()
    x = b.pixel_values[i, :, :h, :w]
    if scale == 1:
        return x.contiguous()
    up = torch.nn.functional.interpolate(x[None].float(), scale_factor=scale, mode="bilinear")[0]
    return up.round().clamp(0, 255).to(torch.uint8)


def jpeg_record(dtype="jpeg", *, rows=None, resize=None, shape=None):
    """A synthetic uint8 micro-batch with its pixels as JPEG rows (``rows`` overrides them)."""
    rb = smooth_record()
    b = record_to_batch(rb)
    if rows is None:
        rows = [encode_jpeg(image(b, i), quality=95).numpy().tobytes() for i in range(b.size)]
    md = dict(rb.schema.field("pixel_values").metadata)
    md[b"dtype"] = dtype.encode()
    if resize is not None:
        md[keys.FIELD_RESIZE.encode()] = resize.encode()
    col = pa.array([np.frombuffer(r, np.uint8) for r in rows], pa.list_(pa.uint8()))
    i = rb.schema.get_field_index("pixel_values")
    rb = rb.set_column(i, pa.field("pixel_values", pa.list_(pa.uint8()), metadata=md), col)
    if shape is not None:
        j = rb.schema.get_field_index("pixel_shape")
        rb = rb.set_column(j, rb.schema.field(j), pa.array([list(shape)] * rb.num_rows, rb.schema.field(j).type))
    return rb, b


@pytest.mark.parametrize("device", [None, torch.device("cpu")])
def test_prefetcher_decodes_a_jpeg_micro_batch(device):
    rb, exact = jpeg_record()
    host = record_to_batch(rb)
    assert host.pixel_values is None and len(host.pixel_jpeg) == host.size  # still encoded
    p = Prefetcher(Records([rb]), position={}, role=ROLE_FULL, pad_id=0, device=device, check_pack=False)
    try:
        step, _ = p.next()
    finally:
        p.close()
    got = step.micro_batches[0]
    want = exact if device is None else exact.to(device)
    assert got.pixel_values.shape == want.pixel_values.shape and got.pixel_values.dtype == want.pixel_values.dtype
    if device is None:
        assert got.pixel_dtype == "uint8" and psnr(got.pixel_values, exact.pixel_values) >= 30
    else:  # normalised on the device, like the uint8 path
        assert (got.pixel_values - want.pixel_values).abs().max() < 0.5


def test_jpeg_source_resizes_to_the_planned_shape():
    rb, exact = jpeg_record()
    rows = [encode_jpeg(image(exact, i, 2), quality=95).numpy().tobytes() for i in range(exact.size)]
    for resize in ("shorter-crop/bilinear", "square/bicubic", "dynamic/bilinear"):
        src, _ = jpeg_record(keys.DTYPE_JPEG_SOURCE, rows=rows, resize=resize)
        got = record_to_batch(src).decoded()
        assert got.pixel_values.shape == exact.pixel_values.shape and got.pixel_values.dtype == torch.uint8
        assert psnr(got.pixel_values, exact.pixel_values) >= 25, resize


def _header_with_size(jpeg: bytes, h: int, w: int) -> bytes:
    """``jpeg`` with the frame header's height and width replaced."""
    b = bytearray(jpeg)
    for m in (0xC0, 0xC1, 0xC2):
        i = b.find(bytes([0xFF, m]))
        if i > 0:
            b[i + 5:i + 9] = bytes([h >> 8, h & 255, w >> 8, w & 255])
            return bytes(b)
    raise AssertionError("no frame header")


def test_bad_jpegs_are_batch_errors():
    rb, exact = jpeg_record()
    n = exact.size
    _, h, w = exact.pixel_shape[0].tolist()
    good = encode_jpeg(image(exact, 0), quality=95).numpy().tobytes()  # every row this one, its shape
    cases = [
        ("jpeg", [good[:2] + b"\x00" * 10] * n, None, "marker"),
        ("jpeg", [good + b"\x00" * (2 * 3 * h * w + 4097)] * n, None, "JPEG bytes"),
        ("jpeg", [_header_with_size(good, h + 1, w)] * n, None, "planned"),
        (keys.DTYPE_JPEG_SOURCE, [good] * n, None, "resize"),
        (keys.DTYPE_JPEG_SOURCE, [good] * n, "crop/bilinear", "resize"),
        (keys.DTYPE_JPEG_SOURCE, [b"\xff\xd8" + b"\x00" * keys.MAX_SOURCE_JPEG_BYTES] * n, "square/bilinear",
         "source JPEG bytes"),
        (keys.DTYPE_JPEG_SOURCE, [_header_with_size(good, 4096, 2048)] * n, "square/bilinear", "pixels"),
    ]
    for dtype, rows, resize, match in cases:
        bad, _ = jpeg_record(dtype, rows=rows, resize=resize, shape=(3, h, w))
        with pytest.raises(BatchError, match=match):
            record_to_batch(bad)
    # Within the limits, but its entropy data is garbage: the decode names the sample.
    broken = good[:len(good) // 2] + bytes(range(256)) * 4 + good[-2:]
    bad, _ = jpeg_record("jpeg", rows=[good] * (n - 1) + [broken], shape=(3, h, w))
    b = record_to_batch(bad)
    with pytest.raises(BatchError, match=repr(b.ids[-1])):
        b.decoded()


def test_check_record_refuses_what_record_to_batch_refuses():
    """The stream client's check (``jpegwire.check_record``, before the prefetcher) and
    ``record_to_batch`` apply the same limits; good and non-JPEG records pass it."""
    from mmfeed_trainer.data import jpegwire  # noqa: PLC0415
    rb, exact = jpeg_record()
    jpegwire.check_record(rb)
    jpegwire.check_record(synthetic.step_records(synthetic.SynthConfig(dtype="uint8"), 0, 0)[0])
    _, h, w = exact.pixel_shape[0].tolist()
    good = encode_jpeg(image(exact, 0), quality=95).numpy().tobytes()
    bad, _ = jpeg_record(rows=[good] * (exact.size - 1) + [_header_with_size(good, h, w + 1)], shape=(3, h, w))
    with pytest.raises(jpegwire.JPEGError, match=f"row {exact.size - 1}: .*planned"):
        jpegwire.check_record(bad)
    with pytest.raises(BatchError, match="planned"):
        record_to_batch(bad)
