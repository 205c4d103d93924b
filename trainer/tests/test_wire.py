"""Wire without NATS: CRC-32C, chunk headers, reassembly rules of protocol section 4."""

import random

import pytest

from mmfeed_trainer.data import wire

KEY = wire.BatchKey("job-1", 0, 42, 1, 3, 0)


def slow_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_the_fast_crc32c_is_used_and_a_fallback_warns(monkeypatch):
    import sys
    assert wire._impl is not wire._crc32c_numpy, "the crc32c package is a dependency: install it"
    monkeypatch.setitem(sys.modules, "crc32c", None)  # import fails
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with pytest.warns(wire.SlowPathWarning, match="pip install crc32c"):
        assert wire._pick_impl() is wire._crc32c_numpy


def test_crc32c_check_value():
    assert wire.crc32c(b"123456789") == 0xE3069283
    assert wire._crc32c_numpy(b"123456789") == 0xE3069283


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 3000, 4096 + 7])
def test_numpy_crc32c_matches_the_bitwise_definition(n):
    data = random.Random(n).randbytes(n)
    assert wire._crc32c_numpy(data) == slow_crc32c(data)


def chunks(payload=b"x" * 10000, size=4096, gen=0, key=KEY):
    return wire.make_chunks(key, payload, size, gen)


def test_chunks_reassemble_in_any_order_with_redeliveries():
    payload = random.Random(1).randbytes(10000)
    parts = chunks(payload)
    assert len(parts) == 3
    r = wire.Reassembler()
    order = [2, 0, 2, 1]  # a redelivered identical chunk is absorbed
    got = []
    for i in order:
        got += r.add(parts[i][0], parts[i][1], tag=i)
    assert len(got) == 1 and got[0].payload == payload and got[0].error is None
    assert sorted(got[0].tags) == [0, 1, 2, 2]
    late = r.add(parts[0][0], parts[0][1], tag="late")
    assert late[0].duplicate and late[0].tags == ["late"]


@pytest.mark.parametrize("corrupt,reason", [
    (lambda p: [(p[0][0], b"y" + p[0][1][1:])] + p[1:], "crc32c mismatch"),
    (lambda p: [p[0], (p[0][0], b"z" * len(p[0][1]))] + p[1:], "duplicate chunk 0 with different bytes"),
    (lambda p: [p[0], ({**p[1][0], "Mmfeed-Size": "9999"}, p[1][1])] + p[2:], "inconsistent chunks"),
])
def test_bad_batches_fail_with_their_tags(corrupt, reason):
    r = wire.Reassembler()
    out = []
    for i, (h, d) in enumerate(corrupt(chunks())):
        out += r.add(h, d, tag=i)
    failed = [a for a in out if a.error]
    assert failed and reason in failed[0].error
    assert failed[0].payload is None and failed[0].tags


def test_incomplete_batch_times_out_and_too_many_pending_fail_the_oldest():
    r = wire.Reassembler(max_pending=2, timeout_s=10)
    first = chunks(key=wire.BatchKey("j", 0, 0, 0, 0, 0))
    assert r.add(*first[0], tag="a", now=0.0) == []
    assert r.expire(5.0) == []
    expired = r.expire(11.0)
    assert expired[0].error.startswith("chunk missing") and expired[0].tags == ["a"]
    for step in range(3):
        out = r.add(*chunks(key=wire.BatchKey("j", 0, step + 1, 0, 0, 0))[0], tag=step, now=20.0)
    assert out and "too many newer batches" in out[0].error


def test_replay_generation_completes_and_absorbs_the_old_one():
    payload = random.Random(2).randbytes(9000)
    old, new = chunks(payload), chunks(payload, gen=1)
    r = wire.Reassembler()
    assert r.add(*old[0], tag="old0") == []
    out = []
    for i, (h, d) in enumerate(new):
        out += r.add(h, d, tag=f"new{i}")
    assert out[0].payload == payload and "old0" in out[0].tags


@pytest.mark.parametrize("header,value", [
    ("Mmfeed-Step", "042"), ("Mmfeed-Step", "-1"), ("Mmfeed-Chunk", "3/3"), ("Mmfeed-Chunk", "1"),
    ("Mmfeed-Size", "0"), ("Mmfeed-Checksum", "crc32:00000000"), ("Mmfeed-Schema", "2"),
    ("Mmfeed-Job", "a.b"), ("Nats-Msg-Id", "job-1.0.42.1.3.0.9"), ("Mmfeed-Generation", "0"),
    ("Mmfeed-Epoch", None),
])
def test_bad_headers_are_chunk_errors(header, value):
    h, d = chunks()[0]
    h = dict(h)
    if value is None:
        del h[header]
    else:
        h[header] = value
    with pytest.raises(wire.ChunkError):
        wire.Reassembler().add(h, d)


def test_random_header_garbage_raises_only_chunk_error():
    rng = random.Random(3)
    base, data = chunks()[0]
    alphabet = "0123456789/-.:abcXYZ \x00é"
    for _ in range(500):
        h = dict(base)
        name = rng.choice(list(h))
        h[name] = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        try:
            wire.Reassembler().add(h, data)
        except wire.ChunkError:
            pass


@pytest.mark.parametrize("n", [0, 5, 1024, 5000])
def test_crc32c_continues_a_prefix(n):
    data = random.Random(n).randbytes(n + 3000)
    for impl in (wire.crc32c, wire._crc32c_numpy):
        assert impl(memoryview(data)[n:], impl(data[:n])) == impl(data) == slow_crc32c(data)


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 2, 0, 1]])
def test_chunks_reassemble_in_any_order_checksummed_on_arrival(order):
    payload = random.Random(4).randbytes(10000)
    parts = chunks(payload)
    r = wire.Reassembler()
    got = []
    for i in order:
        got += r.add(parts[i][0], bytearray(parts[i][1]), tag=i)  # as received: a buffer of its own
    assert len(got) == 1 and got[0].error is None and got[0].payload == payload
    assert sorted(got[0].tags) == sorted(order)


def test_a_single_chunk_batch_is_handed_on_without_a_copy():
    payload = random.Random(5).randbytes(3000)
    (h, d), = chunks(payload)
    got = wire.Reassembler().add(h, d)
    assert got[0].payload is d


@pytest.mark.parametrize("edit,reason", [
    (lambda p: [p[0], (p[1][0], p[1][1][:-1]), p[2]], "chunk 1/3: 4095 bytes, want 4096 (chunks of 4096 bytes, "
                                                      "payload 10000; truncated or mis-sized)"),
    (lambda p: [p[0], p[1], (p[2][0], p[2][1][:-1])], "chunk 2/3: 1807 bytes, want 1808"),
    (lambda p: [p[0], p[1], (p[2][0], p[2][1] + b"x")], "chunk 2/3: 1809 bytes, want 1808"),
    (lambda p: [(p[2][0], b"x" * 5000)] + p[:2], "chunk 2/3: 5000 bytes do not cut a 10000-byte payload into 3"),
    (lambda p: [(p[1][0], b"x" * 2000)] + p[:1], "chunk 1/3: 2000 bytes do not cut"),
    (lambda p: [p[1], p[2], (p[0][0], b"y" + p[0][1][1:])], "crc32c mismatch"),
])
def test_truncated_or_mis_sized_chunks_fail_clearly(edit, reason):
    r = wire.Reassembler()
    out = []
    for i, (h, d) in enumerate(edit(chunks(random.Random(6).randbytes(10000)))):
        out += r.add(h, d, tag=i)
    failed = [a for a in out if a.error]
    assert len(failed) == 1 and reason in failed[0].error, out
    assert failed[0].payload is None and failed[0].tags
