"""benchmarks/fidelity_table.py and benchmarks/archive_runs.py: docs/fidelity.md is generated from the claims
manifest and the archived run folders in results/, and cannot drift from them.

Run folders here are real files (config.toml, metrics.jsonl, summary.json of a few rounds, the summary made
by ``fedskew.metrics.summarize_run`` as the engine makes it), written in ``tmp_path``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import archive_runs
from benchmarks import fidelity_table as ft
from fedskew.core.errors import FedskewError
from fedskew.metrics import summarize_run
from tests.helpers.cli import environment

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fidelity_table.py"


def write_run(folder: Path, label: str, seed: int, accuracies: list[float], *, finished: bool = True) -> Path:
    """A run folder of ``len(accuracies)`` rounds, as the engine writes it (``finished``: with summary.json)."""
    records = [
        {"round": r, "accuracy": a, "class_variance": 0.01 * r, "bytes_server_to_client": 1000,
         "bytes_client_to_server": 500}
        for r, a in enumerate(accuracies, start=1)
    ]
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        f'rounds = {len(accuracies)}\nseed = {seed}\nlabel = "{label}"\n\n[dataset]\nname = "fashion_mnist"\n\n'
        '[partition]\nname = "dirichlet"\nalpha = 0.02\n\n[model]\nname = "convnet"\n', encoding="utf-8"
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    if finished:
        summary = summarize_run(records, at_rounds=[2])
        summary.update(algorithm="fedaf", label=label, seed=seed)
        (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    (folder / "timing.jsonl").write_text('{"round": 1, "seconds": 1.0}\n', encoding="utf-8")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.pt").write_bytes(b"not archived")
    return folder


CLAIM = """
[[coverage]]
spec = "the paper's headline claim"
rows = ["a-beats-b"]

[[claims]]
id = "a-beats-b"
paper = "Paper"
ref = "Table 1"
claim = "A is at least 10 points above B."
paper_number = "A 90, B 70"
measure = "best accuracy within 3 rounds (%)"
metric = "best_acc"
labels = { a = "Method A", b = "Method B" }
runs = @RUNS@
@EXTRA@
holds = "a - b >= 10"
partial = "a > b"
show = ["a - b"]
scale_downs = "3 rounds (paper 20)"
commands = ['fedskew run a.toml "seeds=[S]"']
"""
BOTH_ARCHIVED = '{ a = "results/a/A-seed*", b = "results/b/B-seed*" }'
A_ARCHIVED = '{ a = "results/a/A-seed*" }'


def claim_text(runs: str = BOTH_ARCHIVED, extra: str = "") -> str:
    return CLAIM.replace("@RUNS@", runs).replace("@EXTRA@", extra)


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """results/a: two finished seeds of A (best 80 and 82) and one unfinished; results/b: B (best 75, 77)."""
    write_run(tmp_path / "results/a/A-seed0", "A", 0, [0.5, 0.8, 0.7])
    write_run(tmp_path / "results/a/A-seed1", "A", 1, [0.6, 0.7, 0.82])
    write_run(tmp_path / "results/a/A-seed2", "A", 2, [0.99], finished=False)
    write_run(tmp_path / "results/b/B-seed0", "B", 0, [0.75, 0.7, 0.7])
    write_run(tmp_path / "results/b/B-seed1", "B", 1, [0.7, 0.77, 0.7])
    return tmp_path


def manifest(tmp_path: Path, text: str) -> ft.Manifest:
    path = tmp_path / "claims.toml"
    path.write_text(text, encoding="utf-8")
    return ft.load_manifest(path)


def row_line(page: str, claim_id: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| [{claim_id}]"))


def test_a_row_is_computed_from_the_archived_runs(archive: Path) -> None:
    page = ft.render(manifest(archive, claim_text()), archive)
    row = row_line(page, "a-beats-b")
    # best accuracies 80 and 82 (the unfinished seed 2 does not count), 75 and 77: mean ± sample std
    assert "Method A [a]: **81.00 ± 1.41** (2 seeds: 0, 1; archived runs)" in row
    assert "Method B [b]: **76.00 ± 1.41** (2 seeds: 0, 1; archived runs)" in row
    assert "**partial**" in row and "`a - b` = 5.00" in row  # 5 points: the direction, not the 10 points
    assert ft.RECORDED_NOTE not in row
    details = page.split("### a-beats-b", 1)[1]
    assert "`results/a/A-seed0`, `results/a/A-seed1`" in details and "A-seed2" not in details
    assert 'fedskew run a.toml "seeds=[S]"' in details


def test_a_recorded_figure_renders_as_recorded(archive: Path) -> None:
    recorded = 'recorded = { b = "70.00 ± 1.00" }\nrecorded_seeds = [0, 1, 2]\nsource = "docs/results.md, section X"'
    page = ft.render(manifest(archive, claim_text(A_ARCHIVED, recorded)), archive)
    row = row_line(page, "a-beats-b")
    assert "Method B [b]: **70.00 ± 1.00** (3 seeds: 0, 1, 2; recorded)" in row
    assert "(2 seeds: 0, 1; archived runs)" in row
    assert ft.RECORDED_NOTE in row  # the row says so, not only the details
    assert "**holds**" in row and "`a - b` = 11.00" in row
    assert "recorded from docs/results.md, section X: Method B." in page


def test_an_arm_without_finished_runs_is_not_run_yet(tmp_path: Path) -> None:
    write_run(tmp_path / "results/a/A-seed0", "A", 0, [0.5, 0.6], finished=False)
    recorded = 'recorded = { b = "70" }\nrecorded_seeds = [0]\nsource = "docs/results.md, section X"'
    row = row_line(ft.render(manifest(tmp_path, claim_text(A_ARCHIVED, recorded)), tmp_path), "a-beats-b")
    assert "**not run yet**" in row and "no finished run matches `results/a/A-seed*`" in row


def test_paper_scale_is_not_run_unless_given(archive: Path) -> None:
    page = ft.render(manifest(archive, claim_text()), archive)
    assert row_line(page, "a-beats-b").endswith("| not run |")
    paper_scale = (
        '\n[claims.paper_scale]\nrecorded = { a = "91.0 ± 0.5", b = "70.1 ± 0.4" }\n'
        'recorded_seeds = [0, 1, 2]\nsource = "docs/results.md, section GPU"\ncommands = ["fedskew run paper.toml"]'
    )
    row = row_line(ft.render(manifest(archive, claim_text() + paper_scale), archive), "a-beats-b")
    last = row.rsplit("|", 2)[1]
    assert "Method A [a]: **91.0 ± 0.5** (3 seeds: 0, 1, 2; recorded)" in last and "**holds**" in last


def test_a_measurement_without_scale_downs_is_its_own_paper_scale(archive: Path) -> None:
    text = claim_text().replace('scale_downs = "3 rounds (paper 20)"', 'scale_downs = "none: the paper\'s setting"')
    row = row_line(ft.render(manifest(archive, text), archive), "a-beats-b")
    assert row.endswith("| the measured column (no scale-down) |")
    assert "not run" not in row.rsplit("|", 2)[1]


@pytest.mark.slow
def test_check_detects_drift(archive: Path) -> None:
    (archive / "claims.toml").write_text(claim_text(), encoding="utf-8")
    doc = archive / "docs" / "fidelity.md"

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(SCRIPT), "--manifest", str(archive / "claims.toml"), "--root", str(archive)]
        return subprocess.run([*argv, *args], env=environment(), capture_output=True, text=True, timeout=120)

    assert script("--check", "--out", str(doc)).returncode == 1  # no page yet
    assert script("--out", str(doc)).returncode == 0
    assert script("--check", "--out", str(doc)).returncode == 0
    write_run(archive / "results/a/A-seed3", "A", 3, [0.5, 0.9, 0.9])  # a new seed archived, page not rebuilt
    res = script("--check", "--out", str(doc))
    assert res.returncode == 1 and "out of date" in res.stderr and "84.00 ± 5.29" in res.stdout


@pytest.mark.slow
def test_docs_fidelity_is_up_to_date() -> None:
    """The page in the repository is what the manifest and results/ give: regenerate it after changing either."""
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], env=environment(), capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_manifest_covers_the_spec_claims() -> None:
    claims = ft.load_manifest(ft.MANIFEST)  # parses, every claim checked
    ids = [c.id for c in claims.claims]
    assert len(ids) == len(set(ids))
    assert claims.coverage
    for entry in claims.coverage:
        assert entry["rows"] and set(entry["rows"]) <= set(ids), entry["spec"]
    covered = {r for entry in claims.coverage for r in entry["rows"]}
    assert set(ids) <= covered, f"rows not named in any coverage entry: {sorted(set(ids) - covered)}"
    for claim in claims.claims:
        assert claim.status or claim.measured.scale_downs, claim.id
        assert claim.status or claim.measured.commands, claim.id


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (('holds = "a - b >= 10"', 'holds = "a - c >= 10"'), "names 'c', not an arm"),
        (('holds = "a - b >= 10"', 'holds = "__import__(\'os\')"'), "calls something other than abs, min or max"),
        (('show = ["a - b"]', 'colour = "red"'), "unknown key 'colour'"),
        (('"results/b/B-seed*"', '"/abs/B-seed*"'), "must be a glob under results/"),
        (('labels = { a = "Method A", b = "Method B" }', 'labels = { a = "Method A", b = "Method B", c = "C" }'),
         "needs runs or a recorded figure"),
        (('rows = ["a-beats-b"]', 'rows = ["a-beats-c"]'), "names no row or a missing one"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_the_problem(tmp_path: Path, change: tuple[str, str], needle: str) -> None:
    text = claim_text().replace(*change)
    with pytest.raises(FedskewError) as err:
        manifest(tmp_path, text)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_recorded_figure_must_be_a_number() -> None:
    assert ft.parse_recorded("-1.90 ± 0.22", "x") == (-1.90, 0.22)
    assert ft.parse_recorded("2,143", "x") == (2143.0, None)
    with pytest.raises(FedskewError, match="not a figure"):
        ft.parse_recorded("about 40", "x")


def test_archive_copies_exactly_the_three_files_of_finished_runs(tmp_path: Path) -> None:
    src = tmp_path / "runs"
    write_run(src / "s0/A-seed0", "A", 0, [0.5, 0.6])
    write_run(src / "s1/A-seed1", "A", 1, [0.5, 0.7])
    write_run(src / "s2/A-seed2", "A", 2, [0.5], finished=False)
    (src / "s0" / "report").mkdir()
    (src / "s0" / "report" / "results.md").write_text("| table |\n")
    copied, skipped = archive_runs.archive([src], tmp_path / "results/a")
    assert [p.name for p in copied] == ["A-seed0", "A-seed1"] and skipped == [src / "s2/A-seed2"]
    for run in copied:
        assert sorted(p.name for p in run.iterdir()) == ["config.toml", "metrics.jsonl", "summary.json"]
        source = src / f"s{run.name[-1]}" / run.name
        assert (run / "summary.json").read_bytes() == (source / "summary.json").read_bytes()
    assert sorted(p.name for p in (tmp_path / "results/a").iterdir()) == ["A-seed0", "A-seed1"]
    write_run(tmp_path / "other/A-seed0", "A", 0, [0.1])
    with pytest.raises(FedskewError, match="two runs are named A-seed0"):
        archive_runs.archive([src, tmp_path / "other"], tmp_path / "results/b")
    assert not (tmp_path / "results/b").exists()
