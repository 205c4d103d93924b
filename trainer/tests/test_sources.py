"""Shard and synthetic sources: grouping by step, resume position, order checks."""

import pytest

from mmfeed_trainer.data import synthetic
from mmfeed_trainer.data.sources import ShardSource, SyntheticSource, group_by_step


def test_shard_source_yields_steps_in_order_and_resumes(tmp_path):
    cfg = synthetic.SynthConfig(seed=1, dp=2, micro_batches=3)
    synthetic.write_shards(cfg, str(tmp_path), steps=4)
    got = [(s.step, [r.column("micro_batch")[0].as_py() for r in s.records])
           for s in ShardSource(str(tmp_path), dp_rank=1).steps({"epoch": 0, "next_step": 0})]
    assert got == [(s, [0, 1, 2]) for s in range(4)]
    resumed = [s.step for s in ShardSource(str(tmp_path), dp_rank=1).steps({"epoch": 0, "next_step": 2})]
    assert resumed == [2, 3]
    first = next(iter(ShardSource(str(tmp_path), dp_rank=1).steps({"next_step": 0}))).records[0]
    assert first.equals(synthetic.micro_batch(cfg, 0, 1, 0))


def test_missing_rank_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="rank-00003.arrow does not exist"):
        ShardSource(str(tmp_path), dp_rank=3)


def test_out_of_order_records_are_rejected():
    cfg = synthetic.SynthConfig(seed=1)
    recs = [synthetic.micro_batch(cfg, 1, 0, 0), synthetic.micro_batch(cfg, 0, 0, 0)]
    with pytest.raises(ValueError, match="out of order"):
        list(group_by_step(iter(recs), 0))
    recs = [synthetic.micro_batch(cfg, 0, 0, 1)]
    with pytest.raises(ValueError, match="micro-batch 1 arrived as number 0"):
        list(group_by_step(iter(recs), 0))


def test_synthetic_source_is_deterministic_per_rank():
    cfg = synthetic.SynthConfig(seed=9)
    a = next(iter(SyntheticSource(cfg, 0).steps({"next_step": 5})))
    b = next(iter(SyntheticSource(cfg, 0).steps({"next_step": 5})))
    c = next(iter(SyntheticSource(cfg, 1).steps({"next_step": 5})))
    assert a.step == 5 and all(x.equals(y) for x, y in zip(a.records, b.records))
    assert not a.records[0].equals(c.records[0])


def test_synthetic_source_can_cycle_a_few_generated_steps():
    cfg = synthetic.SynthConfig(seed=9, distinct_steps=2)
    steps = SyntheticSource(cfg, 0).steps({"next_step": 0})
    got = [next(steps) for _ in range(4)]
    assert [s.step for s in got] == [0, 1, 2, 3]
    assert got[2].records is got[0].records and got[3].records is got[1].records
    assert not got[0].records[0].equals(got[1].records[0])
