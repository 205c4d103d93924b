"""The trainer's --log-format json: one JSON object per log line."""

import json
import logging

from mmfeed_trainer.__main__ import _log_format, setup_logging


def test_json_log_lines(capfd):
    setup_logging("json", "3")
    try:
        logging.getLogger("mmfeed_trainer.train").info("step %d loss %.3f", 7, 2.5)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("mmfeed_trainer.stream").exception("broke")
        lines = [json.loads(l) for l in capfd.readouterr().err.splitlines()]
    finally:
        setup_logging("text", "0")
    assert lines[0]["msg"] == "step 7 loss 2.500" and lines[0]["rank"] == 3 and lines[0]["level"] == "INFO"
    assert lines[0]["logger"] == "mmfeed_trainer.train" and lines[0]["time"][:2] == "20"
    assert lines[1]["level"] == "ERROR" and "ValueError: boom" in lines[1]["exc"]


def test_log_format_is_read_before_parsing():
    assert _log_format(["--synthetic", "--log-format", "json"]) == "json"
    assert _log_format(["--log-format=json"]) == "json"
    assert _log_format(["--synthetic"]) == "text"
