"""Issue 36, points 3, 6 and 7: shell-safe run folders, run records that reproduce on their own, trackers
(W&B and MLflow, offline) and sweeps (a list override or a ``[sweep]`` table is a grid of runs)."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

import fedskew
from fedskew.config import dump, resolve
from fedskew.core.errors import ConfigError
from tests.helpers.cli import fedskew as run_fedskew
from tests.helpers.cli import write_config
from tests.helpers.configs import tiny_config


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---- 3. shell-safe folders; a renumbered output folder is announced -----------------------------------
@pytest.mark.slow
def test_a_label_keeps_its_text_and_its_folder_is_a_safe_slug(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", rounds=1)
    res = run_fedskew("run", str(cfg), "--label", "FedAvg, lr (0.1)", "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    run = tmp_path / "o" / "FedAvg_lr_0.1-seed0"
    assert json.loads((run / "summary.json").read_text())["label"] == "FedAvg, lr (0.1)"
    assert "FedAvg, lr (0.1)" in (tmp_path / "o" / "report" / "results.md").read_text()


@pytest.mark.slow
def test_a_second_run_without_out_says_where_it_goes(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", rounds=1, name="exp")
    first = run_fedskew("run", str(cfg), "--no-progress", cwd=tmp_path)
    assert first.code == 0 and "holds earlier runs" not in first.err
    second = run_fedskew("run", str(cfg), "--no-progress", cwd=tmp_path)
    assert second.code == 0
    assert "fedskew: runs/exp holds earlier runs; these go to runs/exp-2 (give --out to choose)" in second.err


# ---- 6. self-contained run records ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_run_records_its_full_config_and_environment_and_resume_warns_on_a_change(
    tmp_path: Path, finished_run: Callable[[int], Path]
) -> None:
    run = tmp_path / "o" / "fedavg-seed0"
    shutil.copytree(finished_run(2).parent, run.parent, symlinks=True)  # `fedskew run` of the tiny config, 2 rounds
    recorded = tomllib.loads((run / "config.toml").read_text())
    # Every default is written: FedAvg's momentum and weight decay, the faults, the partition's test fraction.
    assert {"momentum", "weight_decay", "local_epochs", "lr"} <= recorded["algorithm"].keys()
    assert recorded["faults"]["dropout"] == 0.0 and recorded["partition"]["client_test_fraction"] == 0.0
    env = json.loads((run / "environment.json").read_text())
    import numpy
    import torch

    assert env["fedskew"] == fedskew.__version__ and env["torch"] == torch.__version__
    assert env["numpy"] == numpy.__version__ and env["python"].count(".") == 2 and env["device"]
    env["torch"] = "0.0.1"
    (run / "environment.json").write_text(json.dumps(env))
    res = run_fedskew("run", "--resume", str(run), "rounds=3", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    warning = [ln for ln in res.err.splitlines() if "was started with other versions" in ln]
    assert len(warning) == 1 and f"torch 0.0.1 -> {torch.__version__}" in warning[0]
    assert json.loads((run / "environment.json").read_text())["torch"] == "0.0.1"  # the record is kept


@pytest.mark.slow
def test_a_record_written_without_defaults_still_resumes(
    tmp_path: Path, finished_run: Callable[[int], Path]
) -> None:
    """Runs recorded before config.toml held every default (archived results) resume and report as before."""
    run = tmp_path / "o" / "fedavg-seed0"
    shutil.copytree(finished_run(2).parent, run.parent, symlinks=True)  # `fedskew run` of the tiny config, 2 rounds
    sparse = tiny_config(rounds=2)
    sparse["label"] = "fedavg"
    sparse["workers"] = 1
    (run / "config.toml").write_text(dump(sparse))
    res = run_fedskew("run", "--resume", str(run), "rounds=3", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    assert [r["round"] for r in _records(run)] == [1, 2, 3]


# ---- 7. trackers, offline -------------------------------------------------------------------------------
@pytest.mark.slow
def test_wandb_and_mlflow_get_every_round_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="the tracker extra (pip install wandb) is not installed")
    pytest.importorskip("mlflow", reason="the tracker extra (pip install mlflow-skinny) is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "wb").mkdir()
    out = tmp_path / "o"
    results = fedskew.run(tiny_config(rounds=2, logging={"wandb": True, "mlflow": True}), out=out, progress=False)
    recs = results.runs[0].records
    # MLflow: a file store beside the run folders, one metric file per grouped name, a step per round.
    metric = next((out / "mlruns").rglob("metrics/eval.accuracy"))
    steps = [line.split() for line in metric.read_text().splitlines()]
    assert [int(s[2]) for s in steps] == [1, 2]
    assert [float(s[1]) for s in steps] == pytest.approx([r["accuracy"] for r in recs])
    params = metric.parent.parent / "params"
    assert (params / "algorithm.name").read_text() == "fedavg"
    # W&B: an offline run named after the run folder, holding its history.
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith("tiny-seed0")
    assert any(f.suffix == ".wandb" and f.stat().st_size > 0 for f in runs[0].iterdir())
    # The run's own files are the same without trackers.
    plain = fedskew.run(tiny_config(rounds=2), out=tmp_path / "plain", progress=False)
    ours = results.runs[0].run_dir / "metrics.jsonl"
    assert (plain.runs[0].run_dir / "metrics.jsonl").read_bytes() == ours.read_bytes()


def test_a_tracker_that_is_not_installed_is_refused_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from fedskew.config import validate

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"wandb = true needs wandb, which is not installed: pip install wandb"):
        validate(tiny_config(logging={"wandb": True}))


@pytest.mark.slow
def test_a_tracker_that_fails_ends_the_run_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="the tracker extra (pip install mlflow-skinny) is not installed")
    (tmp_path / "file").write_text("not a folder")
    cfg = write_config(tmp_path / "c.toml", rounds=1, logging={"mlflow": True, "mlflow_uri": "file:" + str(
        tmp_path / "file" / "mlruns")})
    res = run_fedskew("run", str(cfg), "--out", "o", "--no-progress", cwd=tmp_path)
    errors = [ln for ln in res.err.splitlines() if ln.startswith("fedskew: error:")]
    assert res.code == 2 and "Traceback" not in res.err and len(errors) == 1 and "logging.mlflow:" in errors[0]


# ---- 7. sweeps ----------------------------------------------------------------------------------------------
def test_a_list_override_is_a_grid_and_a_list_option_is_not() -> None:
    raw = {"rounds": 1, "partition": {"name": "dirichlet", "num_clients": 4},
           "variants": [{"label": "A"}, {"label": "P", "algorithm.name": "fedprox"}]}
    runs = resolve(raw, {"partition.alpha": [0.1, 0.5], "algorithm.mu": [0.01, 0.1], "at_rounds": [1]})
    assert [r.label for r in runs] == [
        "A, alpha=0.1", "A, alpha=0.5",
        "P, alpha=0.1, mu=0.01", "P, alpha=0.1, mu=0.1",
        "P, alpha=0.5, mu=0.01", "P, alpha=0.5, mu=0.1",
    ]  # FedAvg has no mu: it is swept over alpha alone; a key is shown by its last part (issue 44)
    assert [r.config["partition"]["alpha"] for r in runs] == [0.1, 0.5, 0.1, 0.1, 0.5, 0.5]
    assert [r.config["algorithm"].get("mu") for r in runs[2:]] == [0.01, 0.1, 0.01, 0.1]
    assert all(r.config["at_rounds"] == [1] for r in runs)  # a list option stays a list
    assert runs[2].folder_name == "P_alpha_0.1_mu_0.01-seed0"
    hidden = resolve({"rounds": 1, "model": {"name": "mlp"}}, {"model.hidden": [16, 8]})
    assert len(hidden) == 1 and hidden[0].config["model"]["hidden"] == [16, 8]
    table = resolve({"rounds": 1, "sweep": {"algorithm.lr": [0.1, 0.01]}, "seeds": [0, 1]})
    assert [(r.label, r.config["seed"]) for r in table] == [
        ("fedavg, lr=0.1", 0), ("fedavg, lr=0.1", 1),
        ("fedavg, lr=0.01", 0), ("fedavg, lr=0.01", 1)]
    with pytest.raises(ConfigError, match="repeats a value"):
        resolve({"rounds": 1}, {"algorithm.lr": [0.1, 0.1]})
    with pytest.raises(ConfigError, match=r"sweep\.algorithm\.lr must be a non-empty list"):
        resolve({"rounds": 1, "sweep": {"algorithm.lr": 0.1}})


@pytest.mark.slow
def test_a_grid_runs_reports_and_resumes_as_an_experiment(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", rounds=1)
    res = run_fedskew("run", str(cfg), "algorithm.lr=[0.1,0.05]", "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.name.endswith("seed0")) == [
        "fedavg_lr_0.05-seed0", "fedavg_lr_0.1-seed0"]
    again = run_fedskew("run", str(cfg), "algorithm.lr=[0.1,0.05]", "--out", "o", "--resume", "--no-progress",
                        cwd=tmp_path)
    assert again.code == 0 and "2 run(s) finished, 0 to continue, 0 to start" in again.err


def test_results_to_frame_has_a_row_per_run_or_per_round(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas", reason="pandas is optional")
    results = fedskew.run({**tiny_config(rounds=2), "seeds": [0, 1]}, out=tmp_path / "o", progress=False)
    runs = results.to_frame()
    assert isinstance(runs, pd.DataFrame) and len(runs) == 2
    assert list(runs["seed"]) == [0, 1] and list(runs["final_accuracy"]) == [
        r.summary["final_accuracy"] for r in results.runs]
    rounds = results.to_frame(per="round")
    assert len(rounds) == 4 and list(rounds["round"]) == [1, 2, 1, 2]
    assert os.path.basename(rounds["run_dir"][0]) == "tiny-seed0"
