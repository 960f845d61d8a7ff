"""Run folders: the names of the files a run writes, finding run folders, and reading them back.

The engine writes one folder per run (variant x seed), named :func:`run_folder_name`::

    config.toml       the resolved configuration of the run
    metrics.jsonl     one JSON object per round
    timing.jsonl      seconds per round
    summary.json      per-run figures
    model.pt          the final global model's weights
    checkpoints/      last.pt, the last checkpoint
    artifacts/<name>/ round_NNNN.safetensors, what an algorithm keeps per round (``synthetic``: uploads)
    audit.json        written by ``fedskew audit``

This module knows only these names and formats, so the engine, the report, the audit and the command
line agree on them without importing one another.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from fedskew.core.errors import FedskewError

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
TIMING_FILE = "timing.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_FILE = "last.pt"
ARTIFACTS_DIR = "artifacts"
SYNTHETIC_ARTIFACT = "synthetic"
"""The artifact in which condensation-based methods keep the synthetic images their clients sent."""
AUDIT_FILE = "audit.json"

REQUIRED_SUMMARY_KEYS = (
    "algorithm",
    "rounds",
    "final_accuracy",
    "best_accuracy",
    "max_drop",
    "mean_drop",
    "mean_rise",
    "mean_class_variance",
    "bytes_server_to_client",
    "bytes_client_to_server",
)


def run_folder_name(label: str, seed: object) -> str:
    """A run's folder name, ``<label>-seed<k>`` (simulator and Flower deployment alike)."""
    return f"{folder_label(label)}-seed{seed}"


def folder_label(label: str) -> str:
    """A label as one path component: ``/``, ``\\`` and control characters become ``_``."""
    return re.sub(r"[/\\\x00-\x1f]", "_", label)


def run_config_path(run_dir: Path) -> Path:
    """``run_dir/config.toml``, or an error that says what ``run_dir`` is instead.

    Passing an experiment's output folder (``--out``) where one run's folder is meant is the usual
    slip; the error then names the run folders inside it.
    """
    path = run_dir / CONFIG_FILE
    if path.is_file():
        return path
    if not run_dir.is_dir():
        raise FedskewError(f"{run_dir} is not a run folder: it does not exist")
    inside = sorted(p.parent.name for p in run_dir.glob(f"*/{CONFIG_FILE}"))
    if inside:
        shown = ", ".join(inside[:5]) + (f" (and {len(inside) - 5} more)" if len(inside) > 5 else "")
        raise FedskewError(f"{run_dir} is an experiment folder, not a run folder; pass one of its runs: {shown}")
    raise FedskewError(f"{run_dir} is not a run folder: no {CONFIG_FILE}")


def synthetic_dir(run_dir: Path) -> Path:
    """``run_dir/artifacts/synthetic``: where a run keeps the synthetic images its clients sent."""
    return run_dir / ARTIFACTS_DIR / SYNTHETIC_ARTIFACT


def synthetic_files(run_dir: Path) -> list[Path]:
    """The per-round files of :func:`synthetic_dir`, in round order (empty when there are none)."""
    return sorted(synthetic_dir(run_dir).glob("round_*.safetensors"))


@dataclass
class RunData:
    """One finished run as read from its folder.

    Attributes
    ----------
    path
        The run folder.
    label
        What the run is compared under: ``summary["label"]`` or else the folder name. Runs sharing a
        label are treated as seeds of one setting.
    summary
        The parsed ``summary.json``.
    records
        The per-round objects of ``metrics.jsonl``, sorted by round.
    config
        The parsed ``config.toml``, or empty when the folder has none.
    """

    path: Path
    label: str
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)


def is_number(x: object) -> TypeGuard[int | float]:
    """Whether ``x`` is an int or float (not a bool): a value the records may hold as a figure."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_run_folder(path: Path) -> bool:
    # A folder with metrics but no summary (an interrupted run) still counts, so that load_run
    # reports the missing summary instead of the run silently vanishing from a comparison.
    return (path / SUMMARY_FILE).is_file() or (path / METRICS_FILE).is_file()


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Run folders given directly or found below the given folders.

    Parameters
    ----------
    paths
        Each is a run folder, or a folder searched recursively for run folders (an experiment's
        parent folder).

    Returns
    -------
    list of Path
        Sorted and without duplicates, so the report's order does not depend on the file system.

    Raises
    ------
    FedskewError
        If a path does not exist or no run folder is found at all.
    """
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FedskewError(f"no such file or folder: {p}")
        if _is_run_folder(p):
            found.add(p)
        elif p.is_dir():
            found.update(f.parent for pattern in (SUMMARY_FILE, METRICS_FILE) for f in p.rglob(pattern))
    if not found:
        listed = ", ".join(str(p) for p in paths) or "(no paths given)"
        raise FedskewError(f"no run folders (with {SUMMARY_FILE}) found in: {listed}")
    return sorted(found)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FedskewError(f"missing {path.name}: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise FedskewError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FedskewError(f"missing {path.name}: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise FedskewError(f"{path}, line {lineno}: not valid JSON ({e})") from None
        # accuracy is null in rounds without an evaluation (eval_every > 1)
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("round"), int)
            or not (rec.get("accuracy") is None or is_number(rec.get("accuracy")))
        ):
            raise FedskewError(
                f"{path}, line {lineno}: a record needs an integer round and an accuracy (a number, or null "
                "for a round without evaluation)"
            )
        records.append(rec)
    if not records:
        raise FedskewError(f"{path} holds no rounds")
    return sorted(records, key=lambda r: int(r["round"]))


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None


def load_run(path: Path) -> RunData:
    """Read one run folder.

    Raises
    ------
    FedskewError
        Naming the file, when ``summary.json`` or ``metrics.jsonl`` is missing or corrupt, when the
        summary lacks a required key, or when ``config.toml`` (optional) cannot be parsed.
    """
    path = Path(path)
    summary_path = path / SUMMARY_FILE
    summary = _read_json(summary_path)
    missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise FedskewError(f"{summary_path} lacks {', '.join(missing)}")
    records = _read_records(path / METRICS_FILE)
    config = _read_config(path / CONFIG_FILE)
    return RunData(path, str(summary.get("label") or path.name), summary, records, config)
