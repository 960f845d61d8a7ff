"""The public Python API: ``fedskew.run``, ``fedskew.report``, the exported names, a cheap ``import fedskew``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fedskew
from fedskew.api import dotted
from fedskew.config import resolve
from tests.helpers.cli import environment
from tests.helpers.configs import tiny_config


def test_import_is_cheap_and_every_exported_name_resolves() -> None:
    probe = "import sys, fedskew; print(sorted(m for m in ('torch', 'numpy', 'fedskew.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], env=environment(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert sorted(fedskew.__all__) == sorted(["__version__", *fedskew._EXPORTS])
    for name in fedskew.__all__:
        assert getattr(fedskew, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedskew.nothing  # noqa: B018


def test_run_returns_the_runs_and_calls_on_round(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=2)
    cfg.pop("label")
    cfg["seeds"] = [0, 1]
    seen: list[dict[str, Any]] = []
    results = fedskew.run(cfg, out=tmp_path / "out", progress=False, on_round=seen.append, partition__alpha=0.3)
    assert results.folder == tmp_path / "out"
    assert [d.name for d in results.run_dirs] == ["fedavg-seed0", "fedavg-seed1"]
    for run in results.runs:
        assert run.summary == json.loads((run.run_dir / "summary.json").read_text())
        lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
        assert run.records == [json.loads(line) for line in lines]
        assert "alpha = 0.3" in (run.run_dir / "config.toml").read_text()
    assert list(results.summaries) == ["fedavg-seed0", "fedavg-seed1"]
    # Every round of every run, as metrics.jsonl has it, with the run's label and seed.
    assert [(r["label"], r["seed"], r["round"]) for r in seen] == [("fedavg", s, k) for s in (0, 1) for k in (1, 2)]
    assert {k: v for k, v in seen[0].items() if k not in ("label", "seed")} == results.runs[0].records[0]
    assert results.table().splitlines()[2].split()[:4] == ["fedavg", "fedavg", "2", "2"]
    html = fedskew.report(results)
    assert html == (tmp_path / "out" / "report" / "report.html").resolve() and html.is_file()
    assert fedskew.report.write_report is not None  # still the package


def test_run_takes_resolved_runs_as_they_are(tmp_path: Path) -> None:
    runs = resolve({**tiny_config(rounds=1), "label": "given"})
    results = fedskew.run(runs, out=tmp_path, progress=False)
    assert [d.name for d in results.run_dirs] == ["given-seed0"]
    with pytest.raises(fedskew.ConfigError, match="RunSpec objects are run as they are"):
        fedskew.run(runs, out=tmp_path / "again", rounds=2)
    with pytest.raises(fedskew.ConfigError, match="config must be a TOML file, a built-in config name, a dict"):
        fedskew.run(42)  # type: ignore[arg-type]


def test_keyword_overrides_are_dotted_keys() -> None:
    assert dotted({"rounds": 2, "partition__alpha": 0.5, "algorithm.server.lr": 0.1}) == {
        "rounds": 2, "partition.alpha": 0.5, "algorithm.server.lr": 0.1,
    }
