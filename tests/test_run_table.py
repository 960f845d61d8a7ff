"""benchmarks/run_table.py: docs/results.md's mean +- std rows over seeds, at the rounds asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import run_table


def _run(folder: Path, accuracies: list[float]) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"round": r, "accuracy": a}) for r, a in enumerate(accuracies, start=1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text("{}")


def test_rows_are_mean_and_sample_std_over_seeds_at_the_asked_rounds(tmp_path: Path, capsys) -> None:
    _run(tmp_path / "A-seed0", [0.10, 0.50, 0.40])
    _run(tmp_path / "A-seed1", [0.20, 0.30, 0.60])
    (tmp_path / "A-seed2").mkdir()  # unfinished: no summary.json, left out
    run_table.main(["--rounds", "2", "3", f"A #C=2={tmp_path}/A-seed*"])  # a name may hold "="
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| runs | seeds | acc @2 | acc @3 | best | last |"
    assert out[1] == "|---|---|---|---|---|---|"
    # round 2: 50 and 30 -> 40 +- 14.14; round 3: 40 and 60; best 50 and 60; last = round 3
    assert out[2] == "| A #C=2 | 2 | 40.00 ± 14.14 | 50.00 ± 14.14 | 55.00 ± 7.07 | 50.00 ± 14.14 |"


def test_default_rounds_are_1_5_10_20(tmp_path: Path, capsys) -> None:
    _run(tmp_path / "B-seed0", [0.01 * r for r in range(1, 21)])
    run_table.main([f"B={tmp_path}/B-seed*"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| runs | seeds | acc @1 | acc @5 | acc @10 | acc @20 |")
    assert out[2] == "| B | 1 | 1.00 ± 0.00 | 5.00 ± 0.00 | 10.00 ± 0.00 | 20.00 ± 0.00 | 20.00 ± 0.00 | 20.00 ± 0.00 |"


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0", "A=x"], "--rounds: '0' is not a round number (a positive integer)"),
    (["--rounds", "ten", "A=x"], "--rounds: 'ten' is not a round number (a positive integer)"),
    (["--rounds", "A=x"], "--rounds needs at least one round number (a positive integer)"),
])
def test_bad_rounds_are_refused_in_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as refused:
        run_table.main(argv)
    assert str(refused.value) == message


def test_a_glob_matching_no_finished_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no finished run folder"):
        run_table.main([f"C={tmp_path}/C-seed*"])
