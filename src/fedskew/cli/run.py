"""``fedskew run``: run an experiment (a config file, a built-in config, or the default one) and write its report."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from fedskew.cli.common import (
    CONFIG_HELP,
    DATA_HELP,
    OVERRIDES_HELP,
    add_import,
    config_and_overrides,
    data_dir,
    experiment_report,
    is_override,
    print_table,
)
from fedskew.core.errors import FedskewError
from fedskew.runs import CONFIG_FILE

NAME = "run"
TRAILING = "overrides"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = subparsers.add_parser(NAME, help="run an experiment (default: the built-in default experiment)")
    r.add_argument("config", nargs="?", help=f"{CONFIG_HELP} (default: default)")
    r.add_argument("overrides", nargs="*", help=OVERRIDES_HELP + "; a list where a key takes one value is a grid: "
                                                "'partition.alpha=[0.1,0.5]'")
    r.add_argument("--out", help="experiment folder (default: runs/<name>, numbered if taken)")
    r.add_argument("--data-dir", help=DATA_HELP)
    r.add_argument("--resume", metavar="RUN_DIR", nargs="?", const="",
                   help="continue a run folder from its last checkpoint; without RUN_DIR (CONFIG --out DIR --resume): "
                        "continue the experiment in DIR (finished runs kept, interrupted ones resumed)")
    r.add_argument("--only", nargs="+", metavar="LABEL",
                   help="run only the variants with these labels (a variant's label selects all its grid points; "
                        "a point's full label, that point); a KEY=VALUE word after it whose KEY is a config key "
                        "(rounds=5, partition.alpha=0.5) is an override, not a label")
    r.add_argument("--force", action="store_true", help="overwrite runs already in --out")
    r.add_argument("--label", help="label of the runs (after --only) in tables and plots; {label} is each "
                                   "variant's own label and {KEY} a config value, e.g. "
                                   "--label '{label}, tau={algorithm.tau}'")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_import(r)
    r.set_defaults(func=cmd_run)


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--only FedAvg rounds=5``: a ``KEY=VALUE`` word whose KEY is a config key is an override wherever it
    stands, so it moves from the labels to the overrides; ``--only`` left without a label is an error."""
    if not args.only:
        return
    moved = [w for w in args.only if _config_key_override(w)]
    args.only = [w for w in args.only if w not in moved] or None
    args.overrides = [*args.overrides, *moved]
    if args.only is None:
        parser.error("--only needs at least one label (the words after it were overrides)")


def _config_key_override(word: str) -> bool:
    """Whether ``word`` is ``KEY=VALUE`` with KEY a config key (``rounds``, ``partition.alpha``): an override
    wherever it stands (a label is not written so)."""
    from fedskew.config.files import TOP_LEVEL

    key, eq, _ = word.partition("=")
    dotted = re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key) is not None
    return bool(eq) and dotted and key.split(".")[0] in TOP_LEVEL


def cmd_run(args: argparse.Namespace) -> int:
    from fedskew.api import plan
    from fedskew.config import parse_overrides
    from fedskew.engine.experiment import resume_run, run_experiment

    source, words = config_and_overrides(args.config, args.overrides)  # `fedskew run rounds=5`: the default
    overrides = parse_overrides(words)
    progress = not args.no_progress
    if args.resume and is_override(args.resume):
        overrides = {**overrides, **parse_overrides([args.resume])}  # `--out DIR --resume rounds=20`
        args.resume = ""
    if args.resume == "":  # `fedskew run CONFIG --out DIR --resume`: the whole experiment
        runs, parent = plan(source, overrides, out=args.out, only=args.only, force=args.force, imports=args.imports,
                            resume=True, label=args.label)
        from fedskew.engine.experiment import run_state

        states = [run_state(parent / r.folder_name, r.typed) for r in runs]
        print(f"fedskew: {parent}: {states.count('done')} run(s) finished, {states.count('partial')} to continue, "
              f"{states.count('new')} to start", file=sys.stderr)
        run_experiment(runs, parent, data_dir=data_dir(args), progress=progress, resume=True, states=states)
        parents = [parent]
    elif args.resume:
        if source is not None:
            from fedskew.engine.checkpoint import RESUMABLE

            raise FedskewError(
                f"--resume takes no config file ({source!r}): the run folder's {CONFIG_FILE} is used; "
                f"give only overrides ({', '.join(RESUMABLE)})"
            )
        res = resume_run(Path(args.resume), overrides, data_dir=data_dir(args), progress=progress)
        parents = [res.run_dir]
    else:
        runs, parent = plan(source, overrides, out=args.out, only=args.only, force=args.force, imports=args.imports,
                            label=args.label)
        base = Path("runs") / str(runs[0].config["name"])
        if args.out is None and parent != base:  # renumbered: say so, never silently
            print(f"fedskew: {base} holds earlier runs; these go to {parent} (give --out to choose)", file=sys.stderr)
        print(f"fedskew: {len(runs)} run(s) -> {parent}", file=sys.stderr)
        run_experiment(runs, parent, data_dir=data_dir(args), progress=progress)
        parents = [parent]
    # The experiment's report, EXP/report/: after --resume RUN, that of every run of RUN's experiment folder
    from fedskew.report import write_report  # matplotlib: imported once the runs are done, not before they start

    runs_of: list[Path] = parents
    folder: Path | None = parents[0] / "report"
    try:
        runs_of, folder = experiment_report(parents) if args.resume else (parents, parents[0] / "report")
        html = write_report(runs_of, folder)
    except (FedskewError, OSError) as e:  # the runs are done and kept; only their report failed: not a success
        why = _report_error(e, folder, runs_of) if isinstance(e, OSError) else str(e)
        print(f"fedskew: error: the runs finished and are kept in {parents[0]}, but no report was written: {why}; "
              f"fix that, then `fedskew report {parents[0]}`", file=sys.stderr)
        return 1
    print_table(runs_of)
    print(f"\nrun folder: {parents[0]}\nreport:     {html}")
    return 0


def _report_error(e: OSError, report: Path | None, runs: list[Path]) -> str:
    """A failed report write in one line naming the report folder (``report``, None: the default one of ``runs``)
    on a full disk or a read-only folder, not the temporary folder it was being written into
    (:func:`fedskew.core.files.staged_folder`)."""
    from fedskew.runs import describe_os_error, report_folder

    staged = isinstance(e.filename, str | bytes) and ".partial-" in os.fsdecode(e.filename)
    return describe_os_error(OSError(e.errno, e.strerror) if staged else e, report or report_folder(runs))
