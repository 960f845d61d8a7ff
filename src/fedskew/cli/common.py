"""What several ``fedskew`` commands share: help texts, ``--import``, the data folder, the rule that tells a
config word from an override, and the experiment's report and table.

Heavy modules (torch, the engine, the report) are imported inside the functions, so that ``fedskew --help``
and a mistyped command answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedskew.core.errors import ConfigError

IMPORT_HELP = (
    "import a module or .py file first (repeatable): the algorithms, models, datasets and partitioners it "
    "registers are usable by name"
)

OVERRIDES_HELP = "dotted overrides, e.g. rounds=5 partition.alpha=0.5, anywhere among the options"

DATA_HELP = "folder laid out like shared/datasets (default: $FEDSKEW_DATA, else ~/.cache/fedskew/data)"

CONFIG_HELP = "TOML config file or built-in config name"


def add_import(parser: argparse.ArgumentParser) -> None:
    """The ``--import MODULE_OR_FILE`` option every command takes (``args.imports``, loaded by ``main``)."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help=IMPORT_HELP)


def data_dir(args: argparse.Namespace) -> str | None:
    """The data folder: ``--data-dir``, else ``$FEDSKEW_DATA``, else None (the cache's)."""
    return args.data_dir or os.environ.get("FEDSKEW_DATA") or None


def is_override(word: str) -> bool:
    """Whether a command-line word is a ``KEY=VALUE`` override: it holds ``=`` and names no existing file or
    folder (``fedskew run rounds=5``, ``--resume rounds=20``)."""
    return "=" in word and not Path(word).exists()


def config_and_overrides(word: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """The config and the overrides of ``fedskew run`` and ``fedskew deploy``, whose CONFIG word is optional.

    The rule, in this order: no word is the built-in ``default`` config (None is returned); a word naming an
    existing file or folder is a config file; a word with ``=`` is the first ``KEY=VALUE`` override and the
    config is ``default`` (:func:`is_override`); the name of a built-in config is that config. Any other word
    is a one-line :class:`ConfigError` naming it and what is allowed.
    """
    if word is None or Path(word).exists():
        return word, overrides
    if is_override(word):
        return None, [word, *overrides]
    from fedskew.config import builtin_configs

    names = builtin_configs()
    if word in names:
        return word, overrides
    raise ConfigError(f"config {word!r} not found: give a TOML file, a built-in config ({', '.join(names)}) "
                      "or KEY=VALUE overrides")


def print_table(paths: list[Path], group_by: list[str] | None = None, label: str = "") -> None:
    """Print the comparison table of the runs under ``paths`` (after a line naming the keys they differ in, when
    they come from different experiments)."""
    from fedskew.report import (
        comparison_table,
        find_runs,
        format_table,
        in_config_order,
        load_run,
        separate_experiments,
    )
    from fedskew.report.tables import TERMINAL_WIDTH, differing_line

    runs = separate_experiments(in_config_order([load_run(p) for p in find_runs(paths)]), group_by or (), label)
    mixed = differing_line(runs)
    if mixed:
        print(f"fedskew: {mixed}", file=sys.stderr)
    print(format_table(comparison_table(runs), max_width=TERMINAL_WIDTH))


def experiment_report(run_dirs: list[Path]) -> tuple[list[Path], Path | None]:
    """The runs and report folder of the experiment that ``run_dirs`` belong to: every run of their experiment
    folder and its ``report/`` (the report ``fedskew run`` wrote, which ``audit`` and ``--resume`` update),
    or ``run_dirs`` and None (the default folder) when they are not the runs of one folder."""
    from fedskew.runs import experiment_of, experiment_runs, find_runs

    runs = find_runs(run_dirs)
    home = experiment_of(runs)
    if home is not None and {p.resolve() for p in runs} <= set(experiment_runs(home)):
        return experiment_runs(home), home / "report"
    return runs, None
