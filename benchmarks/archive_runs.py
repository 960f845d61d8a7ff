"""Copy the small text files of finished runs into the repository's archive of runs, ``results/NAME/``.

    python benchmarks/archive_runs.py SRC [SRC ...] --to results/NAME

Each SRC is a run folder or a folder searched for run folders (``fedskew.runs.find_runs``). Of each
finished run (one with ``summary.json``) exactly ``config.toml``, ``metrics.jsonl`` and ``summary.json``
are copied to ``results/NAME/<run folder name>/``; checkpoints, models, artifacts, timings and reports
stay behind. Runs without ``summary.json`` (still running, or stopped) are skipped and named, so the
command can be run again as more seeds finish: it overwrites the three files with the source's.
``benchmarks/fidelity_table.py`` reads the archive to build ``docs/fidelity.md``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from fedskew.core.errors import FedskewError
from fedskew.runs import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, find_runs

ARCHIVED_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE)
"""What the archive keeps of a run: small text files from which every figure of a report is computed."""


def archive(sources: Sequence[Path], to: Path) -> tuple[list[Path], list[Path]]:
    """Copy the :data:`ARCHIVED_FILES` of every finished run below ``sources`` into ``to/<run folder name>/``.

    Returns
    -------
    tuple of lists
        The archived run folders (in ``to``) and the skipped source folders (no ``summary.json``).

    Raises
    ------
    FedskewError
        If a source does not exist or holds no run folder, if a finished run lacks ``metrics.jsonl``,
        or if two runs share a folder name (archive them under different NAMEs). Nothing is copied then.
    """
    finished: dict[str, Path] = {}
    skipped = []
    for run in find_runs(list(sources)):
        if not (run / SUMMARY_FILE).is_file():
            skipped.append(run)
            continue
        if not (run / METRICS_FILE).is_file():
            raise FedskewError(f"{run} has {SUMMARY_FILE} but no {METRICS_FILE}: not a complete run folder")
        if run.name in finished:
            raise FedskewError(
                f"two runs are named {run.name} ({finished[run.name]} and {run}); archive them under different names"
            )
        finished[run.name] = run
    copied = []
    for name, run in sorted(finished.items()):
        dest = to / name
        dest.mkdir(parents=True, exist_ok=True)
        for file in ARCHIVED_FILES:
            if (run / file).is_file():
                shutil.copyfile(run / file, dest / file)
        copied.append(dest)
    return copied, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, metavar="SRC", help="run folders, or folders holding them")
    parser.add_argument("--to", required=True, type=Path, help="the archive folder, e.g. results/fedaf_fmnist_klmean")
    args = parser.parse_args(argv)
    try:
        copied, skipped = archive(args.sources, args.to)
    except FedskewError as e:
        print(f"archive_runs.py: error: {e}", file=sys.stderr)
        return 2
    for run in skipped:
        print(f"skipped (no {SUMMARY_FILE}: not finished): {run}")
    for dest in copied:
        print(f"archived: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
