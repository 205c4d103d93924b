"""JPEG pixels on the wire (``--dtype jpeg`` / ``jpeg-source``) and in JPEG shard sets, decoded
on the trainer's device.

``record_to_batch`` keeps a JPEG micro-batch's rows as encoded bytes (``host_fields``): it checks
every row before anything decodes it, with the limits of the wire (a ``jpeg`` row is at most 2
bytes per pixel value plus ``MAX_JPEG_OVERHEAD`` and its header declares exactly the row's
``pixel_shape``; a ``jpeg-source`` row is at most ``keys.MAX_SOURCE_JPEG_BYTES`` and declares at
most ``keys.MAX_SOURCE_JPEG_PIXELS``), and a row that breaks them is a ``BatchError``. ``decode``
then turns the whole micro-batch into the uint8 ``(B, 3, H, W)`` tensor the exact uint8 path
carries, on the given device: one batched ``torchvision.io.decode_jpeg`` (nvJPEG on CUDA, CPU in
tests); under ``jpeg-source`` each image whose size is not its planned ``pixel_shape`` is
resized there with the batch's ``resize`` (``"<policy>/<filter>"``): shorter-crop resizes the
shorter side to the planned side (the longer to ``int(S*long/short)``) and centre-crops;
square and dynamic resize to the planned H×W. The resize is torchvision's antialiased
bilinear/bicubic in float32, rounded back to uint8: close to, not bit-identical with, the
service's Pillow-exact resampler (docs/deployment.md gives the PSNR). ``Batch.to`` normalises the
uint8 pixels with the batch's mean/std as for the uint8 wire dtype. A JPEG that does not decode
is a ``BatchError`` naming the sample.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import torch

from .. import keys

JPEG_DTYPES = ("jpeg", keys.DTYPE_JPEG_SOURCE)
MAX_JPEG_OVERHEAD = 4096
"""proto.MaxJPEGOverhead: header and table bytes a ``jpeg`` row may have beyond 2 per value."""
POLICIES = ("shorter-crop", "square", "dynamic")
FILTERS = ("bilinear", "bicubic")
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class JPEGError(ValueError):
    """A JPEG row that breaks the wire's limits or does not decode (``batches.BatchError``
    wraps it with the sample)."""


def header_size(b: memoryview) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, read without decoding; JPEGError when the
    bytes are not a JPEG or end before the frame header."""
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        raise JPEGError("not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= n:
        if b[i] != 0xFF:
            raise JPEGError(f"no marker at byte {i}")
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
            continue
        if m == 0x01 or 0xD0 <= m <= 0xD7:  # markers without a length
            i += 2
            continue
        if m in _SOF:
            if i + 9 > n:
                break
            return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
        if m in (0xDA, 0xD9):
            raise JPEGError("scan data before a frame header")
        i += 2 + ((b[i + 2] << 8) | b[i + 3])
    raise JPEGError("the bytes end before the frame header")


def check_row(dtype: str, row: memoryview, shape: tuple[int, int, int]) -> None:
    """The wire's limits on one JPEG row of planned ``shape`` (C, H, W) (module doc)."""
    c, h, w = shape
    if dtype == keys.DTYPE_JPEG_SOURCE:
        if not 1 <= len(row) <= keys.MAX_SOURCE_JPEG_BYTES:
            raise JPEGError(f"{len(row)} source JPEG bytes (want 1 to {keys.MAX_SOURCE_JPEG_BYTES})")
        sh, sw = header_size(row)
        if sh * sw > keys.MAX_SOURCE_JPEG_PIXELS or sh < 1 or sw < 1:
            raise JPEGError(f"source JPEG of {sw}x{sh} pixels (want 1 to {keys.MAX_SOURCE_JPEG_PIXELS})")
        return
    if not 1 <= len(row) <= 2 * c * h * w + MAX_JPEG_OVERHEAD:
        raise JPEGError(f"{len(row)} JPEG bytes for shape {list(shape)} (want 1 to 2 per pixel value "
                        f"+ {MAX_JPEG_OVERHEAD})")
    if header_size(row) != (h, w):
        raise JPEGError(f"JPEG of {header_size(row)[::-1]} (WxH), planned {w}x{h}")


def parse_resize(dtype: str, raw: str | None) -> str | None:
    """The field metadata ``resize`` of a ``jpeg-source`` batch, checked; None for ``jpeg``."""
    if dtype != keys.DTYPE_JPEG_SOURCE:
        return None
    policy, _, filt = (raw or "").partition("/")
    if policy not in POLICIES or filt not in FILTERS:
        raise JPEGError(f"pixel_values {keys.FIELD_RESIZE} metadata {raw!r}, want <{'|'.join(POLICIES)}>/"
                        f"<{'|'.join(FILTERS)}>")
    return raw


def host_rows(dtype: str, lengths: np.ndarray, flat: pa.Array, shapes: np.ndarray, ids: list[str]) -> list:
    """The rows of a JPEG ``pixel_values`` column as 1-D uint8 CPU tensors, each checked
    (``check_row``); JPEGError names the first bad sample."""
    if flat.type != pa.uint8():
        raise JPEGError(f"pixel_values elements are {flat.type}, {dtype} rows are uint8 bytes")
    values = flat.to_numpy(zero_copy_only=False)
    mv = memoryview(values)
    out, start = [], 0
    for i, n in enumerate(lengths.tolist()):
        row = mv[start:start + n]
        try:
            check_row(dtype, row, tuple(int(v) for v in shapes[i]))
        except JPEGError as err:
            raise JPEGError(f"sample {ids[i]!r}: {err}") from None
        out.append(torch.from_numpy(values[start:start + n].copy()))
        start += n
    return out


def _decode_jpeg(data: list, device: torch.device, ids: list[str]) -> list:
    with warnings.catch_warnings():  # torchvision 0.29 points to torchcodec; decode_jpeg still works
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_jpeg  # noqa: PLC0415
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass
        for i, d in enumerate(data):  # name the sample that fails
            try:
                decode_jpeg(d, mode=ImageReadMode.RGB, device=device)
            except RuntimeError as err:
                raise JPEGError(f"sample {ids[i]!r}: JPEG does not decode: {err}") from err
        raise JPEGError("a micro-batch of JPEGs does not decode, each decodes alone")


def _resize(img: torch.Tensor, h: int, w: int, resize: str) -> torch.Tensor:
    """uint8 CHW ``img`` to h×w by ``resize`` (module doc)."""
    from torchvision.transforms import InterpolationMode  # noqa: PLC0415
    from torchvision.transforms.v2 import functional as F  # noqa: PLC0415
    policy, _, filt = resize.partition("/")
    mode = InterpolationMode.BICUBIC if filt == "bicubic" else InterpolationMode.BILINEAR
    x = img.float()
    if policy == "shorter-crop":
        x = F.center_crop(F.resize(x, [h], interpolation=mode, antialias=True), [h, w])
    else:
        x = F.resize(x, [h, w], interpolation=mode, antialias=True)
    return x.round_().clamp_(0, 255).to(torch.uint8)


def decode_pixels(rows: list, shapes: torch.Tensor, dtype: str, resize: str | None, ids: list[str],
                  device: torch.device | str) -> torch.Tensor:
    """One micro-batch's JPEG rows as uint8 (B, 3, H, W) on ``device`` (module doc); images
    smaller than the largest are zero-padded at the bottom and right, as the uint8 path is."""
    device = torch.device(device)
    imgs = _decode_jpeg(rows, device, ids) if rows else []
    sh = shapes.tolist()
    hmax, wmax = max((s[1] for s in sh), default=1), max((s[2] for s in sh), default=1)
    for i, (img, (_, h, w)) in enumerate(zip(imgs, sh, strict=True)):
        if tuple(img.shape[1:]) == (h, w):
            continue
        if resize is None:
            raise JPEGError(f"sample {ids[i]!r}: JPEG decodes to {tuple(img.shape[1:])}, planned {(h, w)}")
        imgs[i] = _resize(img, h, w, resize)
    if all(tuple(img.shape[1:]) == (hmax, wmax) for img in imgs) and imgs:
        return torch.stack(imgs)
    out = torch.zeros((len(imgs), 3, hmax, wmax), dtype=torch.uint8, device=device)
    for i, img in enumerate(imgs):
        out[i, :, :img.shape[1], :img.shape[2]] = img
    return out


def check_record(rb: pa.RecordBatch) -> None:
    """The wire's limits on every row of a JPEG micro-batch record, before anything decodes it
    (the stream client calls it where it checks a received batch); other records pass."""
    if keys.COL_PIXEL_VALUES not in rb.schema.names or keys.COL_PIXEL_SHAPE not in rb.schema.names:
        return
    md = rb.schema.field(keys.COL_PIXEL_VALUES).metadata or {}
    dtype = md.get(keys.FIELD_DTYPE.encode(), b"").decode(errors="replace")
    if dtype not in JPEG_DTYPES:
        return
    parse_resize(dtype, md.get(keys.FIELD_RESIZE.encode(), b"").decode(errors="replace"))
    col, shapes = rb.column(keys.COL_PIXEL_VALUES), rb.column(keys.COL_PIXEL_SHAPE)
    if not pa.types.is_list(col.type) or col.type.value_type != pa.uint8() or col.null_count:
        raise JPEGError(f"{dtype} pixel_values is {col.type}, want list<uint8> without nulls")
    offsets = col.offsets.to_numpy(zero_copy_only=False)
    shp = shapes.flatten().to_numpy(zero_copy_only=False).reshape(-1, 3)
    if len(shp) != len(col):
        raise JPEGError(f"{len(shp)} pixel shapes for {len(col)} rows")
    mv = memoryview(col.values.to_numpy(zero_copy_only=False))
    for i in range(len(col)):
        try:
            check_row(dtype, mv[offsets[i]:offsets[i + 1]], tuple(int(v) for v in shp[i]))
        except JPEGError as err:
            raise JPEGError(f"row {i}: {err}") from None
