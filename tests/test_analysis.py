"""Issue 46, points 5 and 6: analysis from Python (``Results.to_frame()`` rows carry the run's resolved config as
dotted columns) and MLflow's records read back with the command docs/configuration.md gives, which works with the
``trackers`` extra (mlflow-skinny: no ``mlflow ui``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedskew
from tests.helpers.configs import tiny_config

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_to_frame_rows_carry_the_resolved_config_as_dotted_columns(tmp_path: Path) -> None:
    pytest.importorskip("pandas", reason="the analysis extra (pip install pandas) is not installed")
    results = fedskew.run(tiny_config(rounds=2), **{"partition.alpha": [0.5, 1.0]}, out=tmp_path / "o", progress=False)
    runs = results.to_frame()
    assert len(runs) == 2
    assert sorted(runs["partition.alpha"]) == [0.5, 1.0]
    assert runs["algorithm.lr"].tolist() == [0.1, 0.1] and runs["model.hidden"].tolist() == [(32,), (32,)]
    assert runs["algorithm.momentum"].tolist() == [0.0, 0.0]  # a default the config left unset, as recorded
    by_alpha = runs.groupby("partition.alpha")["final_accuracy"].mean()  # what the issue could not do
    assert len(by_alpha) == 2
    assert runs["rounds"].tolist() == [2, 2]  # the summary's and the config's agree; one column
    rounds = results.to_frame("round")
    assert len(rounds) == 4 and set(rounds.groupby("partition.alpha")["round"].max()) == {2}


def _docs_block(page: str, first_line: str) -> list[str]:
    """The lines of the fenced bash block of ``page`` that starts with ``first_line``."""
    for block in re.findall(r"^```bash\n(.*?)^```$", (DOCS / page).read_text(), re.MULTILINE | re.DOTALL):
        if block.startswith(first_line):
            return block.strip().splitlines()
    raise AssertionError(f"{page} has no bash block starting {first_line!r}")


@pytest.mark.slow
def test_mlflow_records_read_back_as_documented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mlflow ui --backend-store-uri file:...`` crashed with the installed extra (mlflow-skinny has no UI), and
    the file store needs MLFLOW_ALLOW_FILE_STORE=true: the documented commands work with what is installed."""
    pytest.importorskip("mlflow", reason="the tracker extra (pip install mlflow-skinny) is not installed")
    pytest.importorskip("pandas", reason="mlflow.search_runs gives a pandas DataFrame")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(rounds=2, name="default", label="FedAvg", logging={"mlflow": True})
    fedskew.run(cfg, out="runs/default", progress=False)
    lines = _docs_block("configuration.md", "export MLFLOW_TRACKING_URI=")
    venv = Path(sys.executable).parent
    script = "\n".join(["set -euo pipefail", "unset MLFLOW_ALLOW_FILE_STORE",
                        *(line.replace(".venv/bin/", f"{venv}/") for line in lines)])
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"\bdefault\b.*runs/default/mlruns", res.stdout)  # the experiment, listed
    row = next(line for line in res.stdout.splitlines() if "FedAvg-seed0" in line)
    assert "0.5" in row.split()  # its partition.alpha param, and its last accuracy beside it
    summary = json.loads((tmp_path / "runs" / "default" / "FedAvg-seed0" / "summary.json").read_text())
    assert float(row.split()[-1]) == pytest.approx(summary["final_accuracy"])
