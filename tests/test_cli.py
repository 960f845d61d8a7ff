"""The command line: bad input ends in one line naming the problem (exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedskew.cli import main
from fedskew.config import dump
from tests.helpers.configs import tiny_config


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    errors = [line for line in err if line.startswith("fedskew: error:")]
    assert len(errors) == 1 and not any("Traceback" in line for line in err)
    return errors[0]


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    cfg = tiny_config(rounds=1)
    cfg.pop("label")
    p = tmp_path / "tiny.toml"
    p.write_text(dump(cfg))
    return p


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("partition.alpha=0", "partition.alpha must be > 0"),
        ("partition.alpha=-1", "partition.alpha must be > 0"),
        ("partition.num_clients=100000", "100000"),
        ("dataset.name=imagenet", "unknown dataset 'imagenet'"),
        ("model.name=gpt", "unknown model 'gpt'"),
        ("algorithm.name=fedmagic", "unknown algorithm 'fedmagic'"),
        ("rounds=-2", "rounds must be an integer in [1, 1_000_000]"),
        ("workers=two", "workers must be"),
    ],
)
def test_bad_values(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg_file: Path, override: str,
                    needle: str) -> None:
    line = _err(capsys, ["run", str(cfg_file), override, "--out", str(tmp_path / "o"), "--no-progress"])
    assert needle in line


def test_missing_data_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg_file: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSKEW_CACHE", str(tmp_path / "cache"))
    line = _err(capsys, ["run", str(cfg_file), "dataset.name=fashion_mnist", "--data-dir", str(tmp_path / "empty"),
                         "--out", str(tmp_path / "o"), "--no-progress"])
    assert str(tmp_path / "empty") in line


def test_corrupt_archive(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg_file: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSKEW_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "cifar-10-python.tar.gz").write_bytes(b"this is not a tarball" * 100)
    line = _err(capsys, ["run", str(cfg_file), "dataset.name=cifar10", "--data-dir", str(data),
                         "--out", str(tmp_path / "o"), "--no-progress"])
    assert "cifar-10-python.tar.gz" in line


def test_missing_config_and_bad_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not found" in _err(capsys, ["run", "nope.toml"])
    assert "unknown config key 'roundz'" in _err(capsys, ["run", "roundz=3"])


def test_existing_run_is_not_overwritten(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg_file: Path) -> None:
    out = tmp_path / "o"
    assert main(["run", str(cfg_file), "--out", str(out), "--no-progress"]) == 0
    first = (out / "fedavg-seed0" / "metrics.jsonl").read_bytes()
    line = _err(capsys, ["run", str(cfg_file), "--out", str(out), "--no-progress"])
    assert "already holds a run" in line
    assert (out / "fedavg-seed0" / "metrics.jsonl").read_bytes() == first


def test_run_prints_table_and_writes_report(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           cfg_file: Path) -> None:
    out = tmp_path / "o"
    assert main(["run", str(cfg_file), "rounds=2", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "fedavg" in printed and "final acc" in printed
    assert (out / "report" / "report.html").exists() and (out / "report" / "accuracy.png").exists()
    assert json.loads((out / "fedavg-seed0" / "summary.json").read_text())["rounds"] == 2


def test_run_with_sparse_evaluation_writes_its_report(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     cfg_file: Path) -> None:
    """eval_every > 1 leaves accuracy null in the rounds between evaluations; the report plots the others."""
    out = tmp_path / "o"
    assert main(["run", str(cfg_file), "rounds=4", "eval_every=2", "--out", str(out), "--no-progress"]) == 0
    records = [json.loads(line) for line in (out / "fedavg-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["accuracy"] is None for r in records] == [True, False, True, False]
    assert (out / "report" / "accuracy.png").exists() and (out / "report" / "bytes.png").exists()
    assert "fedavg" in (out / "report" / "results.md").read_text()


def test_list_and_partition(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg_file: Path) -> None:
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for word in ("fedavg", "centralized", "dirichlet", "convnet", "fashion_mnist"):
        assert word in listed
    lines = {line.split()[0]: line for line in listed.splitlines() if line.startswith("  ")}
    # Every kind lists its options with defaults, nested tables key by key, shared keys once per kind.
    assert "server.lr=0.001" in lines["feddm"] and "net_width=128" in lines["convnet"]
    assert "alpha=None" in lines["dirichlet"] and "num_clients" not in lines["dirichlet"]
    assert "partitioners: (all also take: client_test_fraction, num_clients, seed)" in listed
    png = tmp_path / "bubbles.png"
    assert main(["partition", str(cfg_file), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    assert "total" in capsys.readouterr().out


def test_resume_extends_a_run_with_an_override_after_the_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                               cfg_file: Path) -> None:
    """`fedskew run --resume DIR rounds=3` extends the run (the override used to be taken for a config
    file and ignored); a config file with --resume is refused by name."""
    out = tmp_path / "o"
    assert main(["run", str(cfg_file), "--out", str(out), "--no-progress"]) == 0
    run_dir = out / "fedavg-seed0"
    assert main(["run", "--resume", str(run_dir), "rounds=3", "--no-progress"]) == 0
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3]
    line = _err(capsys, ["run", str(cfg_file), "--resume", str(run_dir), "--no-progress"])
    assert "--resume takes no config file" in line and "tiny.toml" in line
    line = _err(capsys, ["run", "--resume", str(out), "--no-progress"])
    assert "experiment folder" in line and "fedavg-seed0" in line


def test_only_names_unknown_labels_and_catches_a_misplaced_override(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path, cfg_file: Path) -> None:
    out = str(tmp_path / "o")
    line = _err(capsys, ["run", str(cfg_file), "--out", out, "--no-progress", "--only", "fedavg", "FedAFF"])
    assert "'FedAFF'" in line and "'fedavg'" in line and "overrides go before" not in line
    # `--only LABEL key=value` used to run LABEL and drop the override without a word; then it was refused;
    # now (issue 46) an override is one wherever it stands, and a word that is neither is named
    line = _err(capsys, ["run", str(cfg_file), "--out", out, "--no-progress", "--only", "fedavg", "nokey=2"])
    assert "'nokey=2'" in line and "an override only where KEY is a config key" in line
    assert not (tmp_path / "o").exists()
    assert main(["run", str(cfg_file), "--out", out, "--no-progress", "--only", "fedavg", "rounds=2"]) == 0
    assert len((tmp_path / "o" / "fedavg-seed0" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("argv", "dest", "expected"),
    [
        (["run", "exp.toml", "--import", "x.py", "rounds=1"], "overrides", ["rounds=1"]),
        (["run", "exp.toml", "a=1", "--out", "d", "b=2", "--no-progress", "c=3"], "overrides", ["a=1", "b=2", "c=3"]),
        (["run", "exp.toml", "--only", "FedAvg", "--out", "d", "rounds=2"], "overrides", ["rounds=2"]),
        (["run", "exp.toml", "--only", "FedAvg", "rounds=2", "B", "partition.alpha=[0.1,0.5]"], "overrides",
         ["rounds=2", "partition.alpha=[0.1,0.5]"]),
        (["deploy", "init", "my-app", "exp.toml", "--label", "X", "rounds=2"], "overrides", ["rounds=2"]),
        (["partition", "exp.toml", "--out", "p.png", "partition.alpha=1"], "overrides", ["partition.alpha=1"]),
        (["condense", "--ipc", "3", "method=dc", "--no-progress", "eval.epochs=2"], "items",
         ["method=dc", "eval.epochs=2"]),
        (["report", "runs/a", "--out", "o", "runs/b"], "runs", ["runs/a", "runs/b"]),
    ],
)
def test_overrides_anywhere_among_the_options(argv: list[str], dest: str, expected: list[str]) -> None:
    """Words after an option used to be 'unrecognized arguments' (issue 36, point 2)."""
    from fedskew.cli import parse_args

    assert getattr(parse_args(argv), dest) == expected


def test_only_overrides_and_options_may_follow_an_option(capsys: pytest.CaptureFixture[str]) -> None:
    from fedskew.cli import parse_args

    for argv, word in ((["run", "a.toml", "--out", "d", "b.toml"], "b.toml"),
                       (["run", "--out", "d", "--bogus"], "--bogus"), (["list", "rounds=1"], "rounds=1")):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2
        assert f"unrecognized arguments: {word}" in capsys.readouterr().err


def test_an_override_after_the_options_is_applied(tmp_path: Path, cfg_file: Path) -> None:
    """`fedskew run exp.toml --out DIR --no-progress rounds=2` runs two rounds; `--out DIR --resume rounds=3`
    (the override read as --resume's value) then extends the experiment, and an override after
    `--resume --no-progress` does too."""
    out = tmp_path / "o"
    assert main(["run", str(cfg_file), "--out", str(out), "--no-progress", "rounds=2"]) == 0
    metrics = out / "fedavg-seed0" / "metrics.jsonl"
    assert len(metrics.read_text().splitlines()) == 2
    assert main(["run", str(cfg_file), "--out", str(out), "--resume", "rounds=3", "--no-progress"]) == 0
    assert len(metrics.read_text().splitlines()) == 3
    assert main(["run", str(cfg_file), "--out", str(out), "--resume", "--no-progress", "rounds=4"]) == 0
    assert len(metrics.read_text().splitlines()) == 4


def test_the_config_word_of_run_and_deploy_follows_one_rule(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file, else an override, else a built-in config; any other word is named with what is allowed, in one
    line, before anything is written (issue 47)."""
    from fedskew.cli.common import config_and_overrides

    assert config_and_overrides(str(cfg_file), ["rounds=2"]) == (str(cfg_file), ["rounds=2"])
    assert config_and_overrides("rounds=5", ["seed=1"]) == (None, ["rounds=5", "seed=1"])
    assert config_and_overrides("default", []) == ("default", [])
    assert config_and_overrides(None, []) == (None, [])
    monkeypatch.chdir(tmp_path)
    for argv in (["run", "nope"], ["deploy", "init", "app", "nope"]):
        line = _err(capsys, argv)
        assert "config 'nope' not found" in line and "built-in config (default" in line and "KEY=VALUE" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]
