"""Issue 46, point 7: the papercuts a new user met, each fixed (or documented, where the docs say so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedskew.cli import parse_args
from fedskew.config import parse_overrides
from fedskew.report import comparison_table, find_runs, format_table, load_run
from fedskew.report.tables import table_cells
from tests.helpers.report_runs import write_run


def test_the_missing_file_error_names_the_config_key_to_download() -> None:
    from fedskew.data.download import missing_file_error

    message = str(missing_file_error("mnist", Path("/data/mnist/x.gz"), "https://example.org/x.gz"))
    assert "dataset.download=true" in message and "load with download=True" not in message


def test_overrides_after_only_are_overrides() -> None:
    """`--only FedAvg rounds=5` took rounds=5 for a label (later: refused it); a label stays a label."""
    args = parse_args(["run", "exp.toml", "--only", "FedAvg", "rounds=5", "FedAvg (alpha=0.1)", "algorithm.lr=0.1"])
    assert args.only == ["FedAvg", "FedAvg (alpha=0.1)"]
    assert args.overrides == ["rounds=5", "algorithm.lr=0.1"]
    with pytest.raises(SystemExit):
        parse_args(["run", "exp.toml", "--only", "rounds=5"])  # no label left


def test_a_list_of_words_needs_no_toml_quoting() -> None:
    assert parse_overrides(["algorithm.name=[fedavg,fedprox]"]) == {"algorithm.name": ["fedavg", "fedprox"]}
    assert parse_overrides(["dataset.domains=[sketch, real]"]) == {"dataset.domains": ["sketch", "real"]}
    assert parse_overrides(["x=[a, 0.5, true]"]) == {"x": ["a", 0.5, True]}
    assert parse_overrides(['x=["a,b", c]']) == {"x": '["a,b", c]'}  # not TOML, not plain words: left as written
    assert parse_overrides(["model.hidden=[[16],[32,32]]"]) == {"model.hidden": [[16], [32, 32]]}


def test_grouped_labels_stay_apart_in_the_terminal_table(tmp_path: Path) -> None:
    """--group-by labels share their first 40 characters; cut at the end, every row read the same."""
    for i, alpha in enumerate((0.1, 0.5)):
        write_run(tmp_path / str(i), "fedavg", 0, [0.1, 0.2, 0.3])
        summary = json.loads((tmp_path / str(i) / "summary.json").read_text())
        label = f"FedAvg (algorithm.lr=0.05, partition.min_size=10, partition.alpha={alpha})"
        (tmp_path / str(i) / "summary.json").write_text(json.dumps({**summary, "label": label}))
    text = format_table(comparison_table([load_run(p) for p in find_runs([tmp_path])]), max_width=120)
    shown = [line.split("  ")[0] for line in text.splitlines()[2:4]]
    assert len(set(shown)) == 2 and all(s.endswith(f"{a})") for s, a in zip(shown, ("0.1", "0.5"), strict=True))


def test_rounds_to_target_says_the_target(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "fedavg", 0, [0.1, 0.35, 0.5])
    with (tmp_path / "a" / "config.toml").open("r+") as f:
        text = f.read()
        f.seek(0)
        f.write("target_accuracy = 0.3\n" + text)
    rows = comparison_table([load_run(tmp_path / "a")])
    headers, cells = table_cells(rows)
    assert "rounds to 30%" in headers and "MB to 30%" in headers and "target acc %" not in headers
    assert cells[0][headers.index("rounds to 30%")] == "2"
    assert rows[0]["target_acc"] == 30.0  # results.csv keeps it as a column


