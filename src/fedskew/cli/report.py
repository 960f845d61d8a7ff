"""``fedskew report``: plots, the comparison table and report.html for run folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedskew.cli.common import add_import, print_table

NAME = "report"
TRAILING = "runs"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = subparsers.add_parser(NAME, help="plots, comparison table and report.html for run folders")
    rp.add_argument("runs", nargs="+", help="run folders or their parents")
    rp.add_argument("--out", help="output folder (default: EXP/report when the runs are those of one experiment "
                                  "folder EXP, also a one-run one; else <common parent>/report)")
    rp.add_argument(
        "--group-by", action="append", metavar="KEY[,KEY]",
        help="config keys whose values tell runs apart in the labels (dataset.name, algorithm.tau, ...; "
             "an option a run left unset shows its default, one its method lacks shows -); runs of "
             "different experiments (dataset, partition, model) under one label are refused",
    )
    rp.add_argument("--label", default="", metavar="TEMPLATE",
                    help="relabel the runs: {label} is a run's own label, {KEY} its value of a config key, e.g. "
                         "--label '{label}, KL {algorithm.kl_reduction}' (as fedskew run --label)")
    rp.add_argument("--format", choices=["png", "pdf", "svg"],
                    help="file format of the figures (default png; a pdf figure also gets the png copy that "
                         "report.html shows, and embeds TrueType fonts, not Type 3). These options default to the "
                         "[report] table of the runs' configs")
    rp.add_argument("--dpi", type=int, help="resolution of raster figures, 50 to 1200 (default 150)")
    rp.add_argument("--preset", choices=["single", "double"],
                    help="figures for a two-column paper: single (one column, 3.3 in wide, 8 pt) or double (both "
                         "columns, 6.9 in, 9 pt); --width and --font-size win over it")
    rp.add_argument("--width", type=float, metavar="INCHES", help="figure width (default: each figure's own, "
                                                                  "7 in for the curves)")
    rp.add_argument("--height", type=float, metavar="INCHES", help="figure height (default: the figure's own "
                                                                   "aspect ratio at that width)")
    rp.add_argument("--font-size", type=float, metavar="POINTS", help="base font size (default 10)")
    rp.add_argument("--no-titles", dest="titles", action="store_false", default=None,
                    help="figures without titles (a paper's caption says what they show)")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_import(rp)
    rp.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from fedskew.core.figures import style_of
    from fedskew.report import write_report
    from fedskew.runs import find_runs, load_run

    paths = [Path(p) for p in args.runs]
    group_by = [key.strip() for item in args.group_by or [] for key in item.split(",") if key.strip()]
    # The look the runs' [report] table gives, changed by the options given.
    style = style_of(load_run(p).recorded_table("report") for p in find_runs(paths)).updated(
        format=args.format, dpi=args.dpi, preset=args.preset, width=args.width, height=args.height,
        font_size=args.font_size, titles=args.titles,
    )
    html = write_report(paths, Path(args.out) if args.out else None, group_by, args.label,
                        progress=not args.no_progress, style=style)
    print_table(paths, group_by, args.label)
    print(f"\nreport: {html}")
    return 0
