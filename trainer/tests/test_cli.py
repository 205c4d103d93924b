"""The entry point: user errors exit with status 2 and a precise message; a short run works."""

import json

import pytest

from mmfeed_trainer.__main__ import main, parse_args


@pytest.mark.parametrize("argv,message", [
    (["--synthetic", "--dp", "2"], "dp (2) * mp (1) = 2 != world size 1"),
    (["--steps", "1"], "exactly one data source"),
    (["--shards", "/nonexistent", "--steps", "1"], "rank-00000.arrow does not exist"),
    (["--synthetic", "--steps", "0"], "--steps must be > 0"),
    (["--synthetic", "--lr", "-1"], "lr must be > 0"),
    (["--synthetic", "--pp", "2"], "dp (1) * pp (2) * mp (1) = 2 != world size 1"),
    (["--synthetic", "--pp", "2", "--mp", "2"], "pipeline stages split each tower's blocks over pp ranks and need mp = 1"),
    (["--synthetic", "--pp", "2", "--allow-resize"], "--allow-resize not supported with --pp > 1 (supported there:"),
])
def test_user_errors_exit_2_with_a_message(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_flags_map_onto_the_config(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = parse_args(["--nats", "nats://127.0.0.1:4222", "--job", "demo", "--mp", "2", "--fsdp",
                      "--model", "base", "--steps", "50", "--synth-grids", "14x14,16x12"])
    assert (cfg.dp, cfg.mp, cfg.fsdp, cfg.model, cfg.steps) == (2, 2, True, "base", 50)
    assert cfg.synth.grids == ((14, 14), (16, 12))
    assert cfg.optim.total_steps == 50


def test_short_synthetic_run_prints_a_summary(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["--synthetic", "--steps", "3", "--log-every", "1", "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and len(summary["losses"]) == 3
    assert 0 <= summary["data_wait_fraction"] <= 1 and summary["samples_per_s"] > 0


def test_packed_synthetic_run_trains_like_the_padded_one(capsys, monkeypatch):
    """--pack changes how a micro-batch is computed, not what: the same losses (float32)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    runs = []
    for extra in ([], ["--pack"]):
        assert main(["--synthetic", "--steps", "3", "--log-every", "1", "--seed", "3", *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["losses"])
    assert runs[1] == pytest.approx(runs[0], rel=1e-5)


def test_pack_mismatch_with_the_plan_is_refused():
    from mmfeed_trainer.loop.train import check_pack
    check_pack(True, True, "the service")
    with pytest.raises(ValueError, match="planned packed micro-batches"):
        check_pack(True, False, "the service")
    with pytest.raises(ValueError, match="planned padded micro-batches"):
        check_pack(False, True, "the service")


def test_help_gives_each_training_flag_a_text_and_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--steps", "100"), ("--lr", "0.0003"), ("--seed", "0"), ("--log-every", "10")):
        i = out.index(f"{flag} {flag[2:].upper().replace('-', '_')} ", out.index("options:"))
        assert f"(default: {default})" in out[i:i + 200], (flag, out[i:i + 200])


@pytest.mark.parametrize("argv,message", [
    (["--synthetic", "--bogus"], "unrecognized arguments: --bogus"),
    (["--synthetic", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
])
def test_a_wrong_flag_prints_its_error_and_where_the_help_is(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2
    assert err.splitlines() == [f"python -m mmfeed_trainer: error: {message}",
                                "(python -m mmfeed_trainer --help lists the flags)"], err


def test_log_ids_writes_the_file_the_readme_names(tmp_path, capsys, monkeypatch):
    import os
    import re
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert main(["--synthetic", "--steps", "2", "--log-every", "1", "--log-ids", str(tmp_path)]) == 0
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    named = re.search(r"`--log-ids DIR`:.*?\(`(ids-rank[^`]+)`\)", readme, re.S)
    assert named, "README: no example file name for --log-ids"
    assert os.listdir(tmp_path) == [named.group(1)]
    lines = [json.loads(line) for line in (tmp_path / named.group(1)).read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1] and all(line["ids"] for line in lines)
