"""Peer check for proto: read mmfeed Arrow IPC written by Go with pyarrow and
recover every pixel tensor exactly with numpy.

usage: read_ipc.py FILE... ; FILE ending in .arrow is the IPC file format
(shards), anything else the IPC stream format (wire). Expected pixel values
are recomputed here independently of the Go code: element j of row i is
((i*131 + j*7) % 257 - 128) / 64, or (i*131 + j*7) % 256 for uint8.
Prints one JSON line per record batch; exits non-zero on the first mismatch.
"""
import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc


def expected(dtype, i, n):
    j = np.arange(n, dtype=np.int64)
    if dtype == "uint8":
        return ((i * 131 + j * 7) % 256).astype(np.uint8)
    v = (((i * 131 + j * 7) % 257) - 128).astype(np.float32) / np.float32(64)
    if dtype == "float16":
        return v.astype(np.float16)
    if dtype == "float32":
        return v
    if dtype == "bfloat16":  # exact: every value has <= 8 significant bits
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    raise SystemExit(f"unknown dtype {dtype}")


def check(batch, schema):
    md = {k.decode(): v.decode() for k, v in schema.metadata.items()}
    assert md["mmfeed.schema_version"] == "1", md
    field = schema.field("pixel_values")
    fmd = {k.decode(): v.decode() for k, v in field.metadata.items()}
    dtype, shape = fmd["dtype"], json.loads(fmd["shape"])
    assert fmd["layout"] == "CHW", fmd
    mean, std = json.loads(fmd["mean"]), json.loads(fmd["std"])
    assert len(mean) == 3 and len(std) == 3
    want_type = {"float16": pa.float16(), "float32": pa.float32(),
                 "bfloat16": pa.uint16(), "uint8": pa.uint8()}[dtype]
    assert field.type.value_type == want_type, (field.type, dtype)
    pv = batch.column("pixel_values")
    shapes = batch.column("pixel_shape").flatten().to_numpy().reshape(-1, 3)
    offsets = pv.offsets.to_numpy()
    values = pv.values.to_numpy(zero_copy_only=False) if dtype != "float16" else \
        np.frombuffer(pv.values.buffers()[1], dtype=np.float16, count=len(pv.values), offset=pv.values.offset * 2)
    rows = batch.num_rows
    for i in range(rows):
        c, h, w = (int(x) for x in shapes[i])
        if shape is not None:
            assert [c, h, w] == shape, (i, c, h, w, shape)
        t = values[offsets[i]:offsets[i + 1]].reshape(c, h, w)
        want = expected(dtype, i, c * h * w).reshape(c, h, w)
        if t.dtype != want.dtype or not np.array_equal(t.view(np.uint8), want.view(np.uint8)):
            raise SystemExit(f"row {i} {dtype}: tensor differs: got {t.ravel()[:8]} want {want.ravel()[:8]}")
        if dtype == "bfloat16":  # decode to float32 the way a trainer does
            f = (t.astype(np.uint32) << 16).view(np.float32)
            assert np.array_equal(f, expected("float32", i, c * h * w).reshape(c, h, w))
    ids = batch.column("input_ids")
    return {"dtype": dtype, "rows": rows, "shape": shape, "job": md["mmfeed.job"],
            "steps": sorted(set(batch.column("step").to_pylist())),
            "input_ids_0": ids[0].as_py() if rows else None,
            "weights": batch.column("weight").to_pylist()}


def main():
    for path in sys.argv[1:]:
        if path.endswith(".arrow"):
            r = ipc.open_file(path)
            batches = [r.get_batch(k) for k in range(r.num_record_batches)]
        else:
            r = ipc.open_stream(open(path, "rb").read())
            batches = list(r)
        for b in batches:
            print(json.dumps({"file": path.rsplit("/", 1)[-1], **check(b, r.schema)}))


if __name__ == "__main__":
    main()
