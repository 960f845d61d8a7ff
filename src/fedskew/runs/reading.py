"""Reading finished runs back: a run folder's files as :class:`RunData`, finding run folders below given paths,
and where an experiment's report goes. The file boundary of the report: a finished run's ``config.toml`` is read
here and asked through :meth:`RunData.recorded` and :meth:`RunData.recorded_table`."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from fedskew.core.errors import FedskewError
from fedskew.runs.folders import CONFIG_FILE, METRICS_FILE, REQUIRED_SUMMARY_KEYS, SUMMARY_FILE


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

    def recorded_table(self, name: str) -> dict[str, Any]:
        """The ``[name]`` table the run recorded (empty where it has none), without ``data_dir``: where this
        machine keeps the files says nothing about the experiment."""
        table = self.config.get(name)
        return {k: v for k, v in table.items() if k != "data_dir"} if isinstance(table, dict) else {}

    def recorded(self, key: str, default: Any = None) -> Any:
        """The run's recorded value of a dotted config key (``eval.personalized_epochs``); ``default`` where its
        ``config.toml`` has none."""
        value: Any = self.config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return value


def is_number(x: object) -> TypeGuard[int | float]:
    """Whether ``x`` is an int or float (not a bool): a value the records may hold as a figure."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_run_folder(path: Path) -> bool:
    # A folder with metrics but no summary (an interrupted run) still counts, so that load_run
    # reports the missing summary instead of the run silently vanishing from a comparison.
    return (path / SUMMARY_FILE).is_file() or (path / METRICS_FILE).is_file()


def experiment_runs(folder: Path) -> list[Path]:
    """The run folders directly in ``folder`` (an experiment folder: ``fedskew run`` puts its runs there), sorted."""
    try:
        return sorted(d for d in Path(folder).iterdir() if d.is_dir() and _is_run_folder(d))
    except OSError:
        return []


def experiment_of(run_dirs: Sequence[Path]) -> Path | None:
    """The experiment folder of ``run_dirs``: the folder directly holding all of them (``EXP`` of ``EXP/<run>``),
    or None when they lie in different folders."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    return parents.pop() if len(parents) == 1 else None


def report_folder(run_dirs: Sequence[Path]) -> Path:
    """Where the report of ``run_dirs`` goes by default: ``report/`` in their experiment folder when they are
    all of its runs (a one-run experiment's report is the one ``fedskew run`` wrote, ``EXP/report/``, not one
    inside the run folder), else ``report/`` in their common folder (one run of several: in its run folder, so
    that the experiment's report is not replaced by a report of part of it)."""
    resolved = [Path(d).resolve() for d in run_dirs]
    home = experiment_of(resolved)
    if home is not None and set(experiment_runs(home)) == set(resolved):
        return home / "report"
    return Path(os.path.commonpath([str(d) for d in resolved])) / "report"


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


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run's config as ``{"partition.alpha": 0.1, "rounds": 30, ...}``: nested tables flattened into dotted keys,
    lists as tuples (hashable, so that a frame can group by them)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = _frozen(value)
    return flat


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


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
