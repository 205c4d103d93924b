"""The trainer's --log-format json: one JSON object per log line."""

import json

from mmfeed_trainer.__main__ import main


def test_json_log_lines(capfd, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["--synthetic", "--steps", "2", "--log-every", "1", "--log-format", "json"]) == 0
    lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("{")]
    records = [json.loads(l) for l in lines]
    steps = [r for r in records if r["msg"].startswith("step ")]
    assert len(steps) == 2, records
    assert all(r["level"] == "INFO" and r["rank"] == 0 and r["logger"].startswith("mmfeed_trainer") for r in steps)
