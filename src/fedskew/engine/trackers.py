"""Experiment trackers a run reports to besides its own files: Weights & Biases and MLflow.

``[logging] wandb = true`` (``pip install wandb``) and ``[logging] mlflow = true`` (``pip install
mlflow-skinny``) make the round loop hand each round's record to the tracker, as it does to TensorBoard:
every numeric value under the same grouped name (:func:`~fedskew.engine.tensorboard.tensorboard_tag`:
``eval/accuracy``, ``comm/bytes_server_to_client`` ...) at step = round, and the run's settings as the
tracker's config / params. Neither changes a run's own files. Both work offline: W&B with
``WANDB_MODE=offline`` (its files in the run folder's ``wandb/``, or under ``WANDB_DIR`` when that is set),
MLflow with a file store (``logging.mlflow_uri = "file:/path/mlruns"``, or ``MLFLOW_TRACKING_URI``; by default
``<run folder>/../mlruns``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fedskew.config.schema import LoggingParams
from fedskew.core.errors import FedskewError
from fedskew.engine.tensorboard import grouped_scalars, hyperparameters


class Tracker(Protocol):
    """Something a run reports each round's record to."""

    def record(self, rec: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    """One W&B run per fedskew run (its name: the run folder's); a resumed run continues the same W&B run.

    W&B's files (``wandb/``: the offline run, its logs) go into the run folder, beside the run's own files, not
    into the current folder (or the temporary folder when that cannot be written); ``WANDB_DIR``, when set,
    still chooses another folder."""

    def __init__(self, cfg: dict[str, Any], run_dir: Path, project: str) -> None:
        import wandb

        run_id = f"{run_dir.parent.name}-{run_dir.name}"[-128:].replace("/", "_")
        where = os.environ.get("WANDB_DIR") or str(run_dir.resolve())
        self._run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow",
                               config=hyperparameters(cfg), dir=where, reinit="finish_previous")

    def record(self, rec: dict[str, Any]) -> None:
        self._run.log(grouped_scalars(rec), step=int(rec["round"]))

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """One MLflow run per fedskew run, in MLflow experiment ``experiment`` (the config's ``name``)."""

    def __init__(self, cfg: dict[str, Any], run_dir: Path, uri: str, experiment: str) -> None:
        import mlflow

        self._mlflow = mlflow
        uri = uri or _env_uri() or (run_dir.parent / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a plain folder: works offline, no database
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment)
        self._run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({k: str(v)[:500] for k, v in hyperparameters(cfg).items()})

    def record(self, rec: dict[str, Any]) -> None:
        metrics = {k.replace("/", "."): v for k, v in grouped_scalars(rec).items()}  # MLflow names: no "/"
        self._mlflow.log_metrics(metrics, step=int(rec["round"]))

    def close(self) -> None:
        self._mlflow.end_run()


def _env_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", "")


def open_trackers(cfg: dict[str, Any], params: LoggingParams, run_dir: Path, experiment: str) -> list[Tracker]:
    """The trackers ``[logging]`` asks for, started for the run in ``run_dir`` (a missing package was refused
    when the config was checked: :class:`~fedskew.config.schema.LoggingParams`)."""
    trackers: list[Tracker] = []
    if params.wandb:
        trackers.append(OneLine("wandb", lambda: WandbTracker(cfg, run_dir, params.wandb_project)))
    if params.mlflow:
        trackers.append(OneLine("mlflow", lambda: MlflowTracker(cfg, run_dir, params.mlflow_uri, experiment)))
    return trackers


class OneLine:
    """A tracker whose failures (a server that refuses, a full disk) end the run in one line naming it,
    as TensorBoard's do; the run's own files are kept and it resumes."""

    def __init__(self, name: str, start: Callable[[], Tracker]) -> None:
        self.name = name
        self._tracker = self._guard(start)

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as e:  # the tracker's own exception types; a user's problem, not a bug of the run
            text = " ".join(str(e).split())
            raise FedskewError(f"logging.{self.name}: {type(e).__name__}: {text[:300]}") from None

    def record(self, rec: dict[str, Any]) -> None:
        self._guard(lambda: self._tracker.record(rec))

    def close(self) -> None:
        self._guard(self._tracker.close)
