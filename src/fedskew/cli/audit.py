"""``fedskew audit``: privacy checks on the synthetic images a run's clients sent; the table joins the report."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedskew.cli.common import DATA_HELP, add_import, data_dir, experiment_report

NAME = "audit"
TRAILING = "runs"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    au = subparsers.add_parser(
        NAME, help="privacy checks on the synthetic images a run's clients sent; adds the table to the report"
    )
    au.add_argument("runs", nargs="+", help="run folders or their parents")
    au.add_argument("--data-dir", help=DATA_HELP)
    au.add_argument("--max-images", type=int, default=2000, help="images sampled per run (default 2000)")
    au.add_argument("--epochs", type=int, default=50, help="epochs of the attacked model (default 50)")
    au.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_import(au)
    au.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    from fedskew.audit import AUDIT_LEGEND, audit, format_audit

    results = audit([Path(p) for p in args.runs], data_dir(args), args.max_images, args.epochs,
                    progress=not args.no_progress)
    print(format_audit(results))
    print("\n" + AUDIT_LEGEND)
    from fedskew.report import write_report

    # The report of these runs' experiment (the one `fedskew run` wrote) now shows the audit table beside the
    # results (audit.json in each run).
    runs, folder = experiment_report([Path(p) for p in args.runs])
    print(f"report: {write_report(runs, folder)}")
    return 0
