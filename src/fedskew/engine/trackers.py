"""Experiment trackers a run reports to besides its own files: Weights & Biases and MLflow.

``[logging] wandb = true`` (``pip install wandb``) and ``[logging] mlflow = true`` (``pip install
mlflow-skinny``) make the round loop hand each round's record to the tracker, as it does to TensorBoard:
every numeric value under the same grouped name (:func:`~fedskew.engine.tensorboard.tensorboard_tag`:
``eval/accuracy``, ``comm/bytes_server_to_client`` ...) at step = round, and the run's settings as the
tracker's config / params. Neither changes a run's own files. Both work offline: W&B with
``WANDB_MODE=offline`` (its files in the run folder's ``wandb/``, or under ``WANDB_DIR`` when that is set),
MLflow with a file store (``logging.mlflow_uri = "file:/path/mlruns"``, or ``MLFLOW_TRACKING_URI``; by default
``<run folder>/../mlruns``).

An MLflow tracking server (an ``http(s)://`` URI) is tried before anything runs (:func:`check_mlflow_server`): one
that cannot be reached within :data:`MLFLOW_CONNECT_S` seconds is one line naming it, where MLflow's own retries
once stalled the run for 255 s without a word. A run also lowers those retries (:data:`MLFLOW_HTTP_DEFAULTS`,
unless the environment sets them), so a server lost mid-run ends it in one line within about a minute.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from fedskew.config.schema import RunConfig
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

    def __init__(self, config: RunConfig, run_dir: Path, project: str) -> None:
        import wandb

        run_id = f"{run_dir.parent.name}-{run_dir.name}"[-128:].replace("/", "_")
        where = os.environ.get("WANDB_DIR") or str(run_dir.resolve())
        self._run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow",
                               config=hyperparameters(config), dir=where, reinit="finish_previous")

    def record(self, rec: dict[str, Any]) -> None:
        self._run.log(grouped_scalars(rec), step=int(rec["round"]))

    def close(self) -> None:
        self._run.finish()


MLFLOW_CONNECT_S = 3.0
"""Seconds :func:`check_mlflow_server` waits for a tracking server (or its proxy) to accept a connection."""

MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
"""MLflow's request retries and timeout during a run, where the environment does not set them (MLflow's own: 7
retries with a doubling back-off, 255 s in all, and 120 s a request)."""


def check_mlflow_server(uri: str) -> None:
    """Refuse in one line an ``http(s)://`` tracking server that does not accept a connection within
    :data:`MLFLOW_CONNECT_S` seconds (through the proxy the environment names for it, if any). Other URIs (a
    file store, a database, Databricks) are left to MLflow. The line names the URI without its user and password.
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:  # a port that is not a number, or out of range
        raise FedskewError(f"logging.mlflow: the tracking URI {_shown(parts)} is not valid ({e})") from None
    if not host:
        raise FedskewError(f"logging.mlflow: the tracking URI {_shown(parts)} names no host")
    proxy = urllib.request.getproxies().get(parts.scheme)
    target = (host, port)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        target = (via.hostname or host, via.port or 80)
    try:
        socket.create_connection(target, timeout=MLFLOW_CONNECT_S).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e) or type(e).__name__).lower()
        through = f" through the proxy {target[0]}:{target[1]}" if target != (host, port) else ""
        raise FedskewError(
            f"logging.mlflow: the tracking server {_shown(parts)} cannot be reached{through} ({why} within "
            f"{MLFLOW_CONNECT_S:.0f} s); start it, or set logging.mlflow_uri to another server or to a folder "
            "(file:/path/mlruns)"
        ) from None


def _shown(parts: urllib.parse.SplitResult) -> str:
    """A URI as an error line shows it: without a user and password."""
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_tracking_servers(configs: Iterable[Any]) -> None:
    """:func:`check_mlflow_server` for every run config (:class:`~fedskew.config.schema.RunConfig`) that reports to
    MLflow, each URI once: before any run starts, so that a server that cannot be reached writes nothing."""
    uris = {c.logging.mlflow_uri or _env_uri() for c in configs if c.logging.mlflow}
    for uri in sorted(u for u in uris if u):
        check_mlflow_server(uri)


class MlflowTracker:
    """One MLflow run per fedskew run, in MLflow experiment ``experiment`` (the config's ``name``)."""

    def __init__(self, config: RunConfig, run_dir: Path, uri: str, experiment: str) -> None:
        import mlflow

        self._mlflow = mlflow
        uri = uri or _env_uri() or (run_dir.parent / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a plain folder: works offline, no database
        for name, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        check_mlflow_server(uri)
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment)
        self._run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({k: str(v)[:500] for k, v in hyperparameters(config).items()})

    def record(self, rec: dict[str, Any]) -> None:
        metrics = {k.replace("/", "."): v for k, v in grouped_scalars(rec).items()}  # MLflow names: no "/"
        self._mlflow.log_metrics(metrics, step=int(rec["round"]))

    def close(self) -> None:
        self._mlflow.end_run()


def _env_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", "")


def open_trackers(config: RunConfig, run_dir: Path) -> list[Tracker]:
    """The trackers ``[logging]`` asks for, started for the run in ``run_dir``, under the experiment's ``name``
    (a missing package was refused when the config was checked: :class:`~fedskew.config.schema.LoggingParams`)."""
    params, experiment = config.logging, config.run.name
    trackers: list[Tracker] = []
    if params.wandb:
        trackers.append(OneLine("wandb", lambda: WandbTracker(config, run_dir, params.wandb_project)))
    if params.mlflow:
        trackers.append(OneLine("mlflow", lambda: MlflowTracker(config, run_dir, params.mlflow_uri, experiment)))
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
