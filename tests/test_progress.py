"""Progress output: tqdm's bar in a terminal, plain lines (no escape codes) elsewhere (issue 36, point 8)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tqdm import tqdm

from fedskew.progress import ENV, PlainProgress, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_forced_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)


def test_a_log_file_gets_one_plain_line_per_round() -> None:
    log = io.StringIO()
    with progress_bar(total=3, desc="FedAvg", unit="round", every_s=0, file=log) as bar:
        assert isinstance(bar, PlainProgress)
        for acc in (10.0, 20.0, 30.0):
            bar.set_postfix(acc=f"{acc:.1f}%")
            bar.update(1)
    lines = log.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("FedAvg: 1/3 round, acc=10.0%") and lines[-1].startswith("FedAvg: 3/3 round, acc=30.0%")
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()


def test_a_log_file_gets_a_line_per_interval_and_the_last_one() -> None:
    log = io.StringIO()
    bar = progress_bar(total=100, desc="audit", every_s=3600, file=log)
    for _ in range(99):
        bar.update(1)
    assert log.getvalue() == ""  # nothing within the interval...
    bar.update(1)
    assert log.getvalue().startswith("audit: 100/100 it")  # ...but the end is always reported
    bar.close()
    assert len(log.getvalue().splitlines()) == 1


def test_an_interrupted_bar_reports_where_it_stopped_and_iterables_work() -> None:
    log = io.StringIO()
    bar = progress_bar(total=10, desc="x", every_s=3600, file=log)
    bar.update(4)
    bar.close()
    assert log.getvalue().startswith("x: 4/10 it")
    log = io.StringIO()
    assert list(progress_bar(range(3), desc="y", every_s=0, file=log)) == [0, 1, 2]
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == ["y: 1/3 it", "y: 2/3 it", "y: 3/3 it"]


def test_a_terminal_gets_tqdm_and_no_progress_gets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    term = Terminal()
    bar = progress_bar(total=2, desc="FedAvg", unit="round", file=term)
    assert isinstance(bar, tqdm) and not bar.disable
    bar.update(2)
    bar.close()
    assert "\r" in term.getvalue()  # tqdm's redraws, fine on a terminal
    quiet = Terminal()
    with progress_bar(total=2, enabled=False, file=quiet) as bar:
        bar.update(2)
    assert quiet.getvalue() == ""
    monkeypatch.setenv(ENV, "plain")
    assert isinstance(progress_bar(total=1, file=Terminal()), PlainProgress)
    monkeypatch.setenv(ENV, "off")
    assert progress_bar(total=1, file=io.StringIO()).disable
    monkeypatch.setenv(ENV, "bar")
    assert isinstance(progress_bar(total=1, file=io.StringIO()), tqdm)


def test_the_round_loops_calls_resumed_at_round_10() -> None:
    """The calls the engine's round loop makes (docs: where the engine should call progress_bar)."""
    log = io.StringIO()
    bar = progress_bar(total=12, initial=10, desc="FedAvg", unit="round", enabled=True, leave=False, every_s=0,
                       file=log)
    with bar:
        for acc in (0.5, 0.625):
            bar.set_postfix(acc=f"{100 * acc:.1f}%")
            bar.update(1)
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == [
        "FedAvg: 11/12 round, acc=50.0%", "FedAvg: 12/12 round, acc=62.5%"]


@pytest.mark.slow
def test_a_run_into_a_log_file_writes_plain_lines(tmp_path: Path) -> None:
    """``fedskew run ... 2> log``: no carriage returns or escape codes, a line per run's end and per 10 s."""
    from tests.helpers.cli import fedskew, write_config

    cfg = write_config(tmp_path / "c.toml", rounds=3, seeds=[0, 1])
    res = fedskew("run", str(cfg), "--out", "o", cwd=tmp_path)  # stderr is a pipe, as a log file
    assert res.code == 0, res.err
    assert "\r" not in res.err and "\x1b" not in res.err
    lines = res.err.splitlines()
    assert sum(line.startswith("fedavg: 3/3 round") for line in lines) == 2  # each run's last line
    assert any(line.startswith("o: 2/2 run") for line in lines)  # the experiment's
