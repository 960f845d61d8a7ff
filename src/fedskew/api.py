"""fedskew from Python: :func:`run` an experiment and get its run folders and summaries back.

``fedskew.run`` is ``fedskew run`` as a function: the same configs (a TOML file, a built-in name, a dict
shaped like a TOML file, or runs already resolved), the same dotted overrides as keyword arguments, the
same run folders. ``fedskew.report`` (the callable package :mod:`fedskew.report`) writes the report of
what it returns. See ``docs/python-api.md``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedskew.config import RunSpec, read_config, resolve
from fedskew.config.variants import relabel
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.engine.experiment import check_devices, choose_parent, run_experiment
from fedskew.engine.round_loop import RunResult
from fedskew.runs import os_errors_name

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | RunSpec | Sequence[RunSpec] | None
"""What :func:`run` takes as its config (see there)."""


@dataclass
class Results:
    """What :func:`run` returns: the experiment folder and each run's result.

    Attributes
    ----------
    folder
        The experiment folder (``out``), holding one folder per run.
    runs
        One :class:`~fedskew.engine.round_loop.RunResult` per run (variant x seed), in config order: its
        ``run_dir``, ``summary`` (what ``summary.json`` holds) and ``records`` (``metrics.jsonl``'s lines).
    """

    folder: Path
    runs: list[RunResult] = field(default_factory=list)

    @property
    def run_dirs(self) -> list[Path]:
        """The run folders, in config order."""
        return [r.run_dir for r in self.runs]

    @property
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Each run's summary by its folder name (``<label>-seed<k>``)."""
        return {r.run_dir.name: r.summary for r in self.runs}

    def to_frame(self, per: str = "run") -> Any:
        """The results as a pandas DataFrame (``pip install pandas``; from the clone: ``pip install -e
        '.[analysis]'``), for sweeps and your own analysis.

        ``per="run"``: one row per run (its label, seed and every scalar of its summary); ``per="round"``:
        one row per run and round (label, seed and every scalar of the round's record). Either way each row
        also carries the run's resolved config (its ``config.toml``: every value it ran with, defaults
        included) as dotted columns, ``partition.alpha``, ``algorithm.lr``, ``rounds`` ..., so that
        ``frame.groupby("partition.alpha")`` sums up a sweep; a list value (``model.hidden``) is a tuple. Where
        a summary or a record has a key of the same name (``rounds``), its value is the column's.
        """
        try:
            import pandas as pd
        except ImportError:
            raise FedskewError("Results.to_frame needs pandas, which is not installed: pip install pandas (from "
                               "fedskew's clone: pip install -e '.[analysis]')") from None
        if per not in ("run", "round"):
            raise FedskewError(f"per must be 'run' or 'round', got {per!r}")
        from fedskew.runs import CONFIG_FILE, flat_config, load_run

        rows: list[dict[str, Any]] = []
        for r in self.runs:
            who = {"label": r.summary.get("label"), "seed": r.summary.get("seed"), "run_dir": str(r.run_dir)}
            config = flat_config(load_run(r.run_dir).config) if (r.run_dir / CONFIG_FILE).is_file() else {}
            tables = [r.summary] if per == "run" else r.records
            for table in tables:
                row = {**who, **{k: v for k, v in table.items() if _scalar(v) and k not in who}}
                rows.append({**row, **{k: v for k, v in config.items() if k not in row}})
        return pd.DataFrame(rows)

    def table(self) -> str:
        """The comparison table ``fedskew run`` prints (mean +- std over seeds per label), at most 120 characters
        wide (every column: the report's results.md and results.csv)."""
        from fedskew.report import comparison_table, format_table, load_run
        from fedskew.report.tables import TERMINAL_WIDTH

        return format_table(comparison_table([load_run(p) for p in self.run_dirs]), max_width=TERMINAL_WIDTH)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def run(
    config: ConfigSource = None,
    *,
    out: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    only: Sequence[str] | None = None,
    force: bool = False,
    progress: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = False,
    label: str | None = None,
    **overrides: Any,
) -> Results:
    """Run an experiment, every variant x seed of it, as ``fedskew run`` does; return where the runs are.

    Parameters
    ----------
    config
        A TOML file or a built-in config name (default: ``default``); a dict shaped like a TOML file
        (relative ``plugins`` files are relative to the current folder); or a :class:`~fedskew.config.RunSpec`
        or list of them, as :func:`fedskew.config.resolve` makes them (run as they are: no overrides).
    out
        The experiment folder (default: ``runs/<name>``, numbered if taken). One that already holds one of
        these runs is refused unless ``force``.
    data_dir
        Where the datasets are (default: ``$FEDSKEW_DATA``, else ``~/.cache/fedskew/data``).
    only
        Run only the variants with these labels (a variant's label selects all its grid points; a point's full
        label, that point).
    force
        Overwrite runs already in ``out``.
    progress
        Show a progress bar per run.
    on_round
        Called after every round with that round's record (a copy of the ``metrics.jsonl`` line, plus the
        run's ``label`` and ``seed``): for logging somewhere else.
    label
        Relabel the runs (after ``only``): ``{label}`` is each run's own label, ``{KEY}`` a dotted config
        value, e.g. ``"{label}, tau={algorithm.tau}"``.
    resume
        Continue an interrupted experiment in ``out``: finished runs are kept, interrupted ones continue
        from their last checkpoint, missing ones start (a run folder made with another config is refused).
    **overrides
        Dotted overrides, as on the command line: ``rounds=5``, ``**{"partition.alpha": 0.5}``, or the same
        with ``__`` for the dot, ``partition__alpha=0.5``.

    Returns
    -------
    Results
        The experiment folder and each run's folder, summary and records.

    Raises
    ------
    FedskewError
        A bad config, value, plug-in or dataset, as the command line reports them (one line).

    Notes
    -----
    With ``workers`` other than 1, client jobs run in spawned worker processes, which import the calling
    script again: call ``run`` under ``if __name__ == "__main__":``. Algorithms, models, datasets and
    partitioners the script itself defines reach them that way; in a notebook, put them in a file and pass
    ``plugins=["my_file.py"]`` (an override of the config key), or set ``workers=1``.
    """
    runs, parent = plan(config, dotted(overrides), out=out, only=only, force=force, resume=resume, label=label)
    results = run_experiment(
        runs, parent, data_dir=None if data_dir is None else str(data_dir), progress=progress, on_round=on_round,
        resume=resume,
    )
    return Results(parent, results)


def plan(
    config: ConfigSource,
    overrides: Mapping[str, Any],
    *,
    out: str | os.PathLike[str] | None = None,
    only: Sequence[str] | None = None,
    force: bool = False,
    imports: Sequence[str] = (),
    resume: bool = False,
    label: str | None = None,
) -> tuple[list[RunSpec], Path]:
    """The runs of ``config`` with ``overrides`` (and plug-ins ``imports``) and the folder they go to.

    Everything is checked before anything is written (the config, the labels of ``only``, the devices,
    that ``out`` holds none of these runs); then the folder is made.
    """
    if isinstance(config, RunSpec) or (
        isinstance(config, Sequence) and not isinstance(config, str) and all(isinstance(r, RunSpec) for r in config)
    ):
        if overrides or imports:
            raise ConfigError("overrides apply to a config file or dict; RunSpec objects are run as they are")
        runs = [config] if isinstance(config, RunSpec) else list(config)
        if not runs:
            raise ConfigError("no runs given: an empty list of RunSpec objects")
    elif isinstance(config, Mapping):
        runs = resolve(copy.deepcopy(dict(config)), dict(overrides), where="config dict", imports=imports,
                       relabelled=label is not None, only=only or None)
    elif config is None or isinstance(config, str | os.PathLike):
        source = None if config is None else os.fspath(config)
        runs = resolve(read_config(source), dict(overrides), where=source or "default", imports=imports,
                       relabelled=label is not None, only=only or None)
    else:
        raise ConfigError(f"config must be a TOML file, a built-in config name, a dict or RunSpec objects, "
                          f"got {type(config).__name__}")
    if only:
        runs = select_labels(runs, list(only))
    if label is not None:  # after --only, which names the config's own labels
        runs = relabel(runs, label)
    check_devices([r.typed for r in runs])
    name = runs[0].typed.run.name
    parent = choose_parent(None if out is None else os.fspath(out), name, runs, force, resume)
    with os_errors_name(parent):  # an unwritable out is refused before the run starts
        parent.mkdir(parents=True, exist_ok=True)
    return runs, parent


def dotted(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword overrides as dotted keys: ``partition__alpha`` is ``partition.alpha``."""
    return {key.replace("__", "."): value for key, value in overrides.items()}


def select_labels(runs: list[RunSpec], wanted: list[str]) -> list[RunSpec]:
    """The runs whose label is in ``wanted``; every label in ``wanted`` must name one.

    A run is selected by its label or by one of its :attr:`~fedskew.config.RunSpec.selectors`: a point of a grid
    by its variant's label too (every point of the variant), or by its full label.

    ``--only`` takes several labels, so an override written after it (``--only FedAF rounds=5``) would
    otherwise be read as a label and silently dropped.
    """
    names = {r.label: None for r in runs} | {s: None for r in runs for s in r.selectors}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        hint = ""
        if any("=" in w for w in unknown):
            hint = "; a KEY=VALUE word is an override only where KEY is a config key (rounds=5, partition.alpha=0.5)"
        variants = list(dict.fromkeys(r.selectors[-1] if r.selectors else r.label for r in runs))
        shown = ", ".join(map(repr, variants[:20]))
        if len(variants) > 20:
            shown += f" (and {len(variants) - 20} more)"
        points = len({r.label for r in runs})
        grid = ""
        if points > len(variants):
            grid = f", or a grid point's full label ({points} points, e.g. {runs[0].label!r})"
        raise FedskewError(f"--only: no run is labelled {', '.join(map(repr, unknown))}; "
                           f"this config's labels: {shown}{grid}{hint}")
    return [r for r in runs if r.label in wanted or any(s in wanted for s in r.selectors)]
