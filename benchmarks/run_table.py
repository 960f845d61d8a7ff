"""Mean +- std over seeds of finished runs, grouped by a name: the table rows of docs/results.md.

    python benchmarks/run_table.py [--rounds R [R ...]] NAME=GLOB [NAME=GLOB ...]

Each GLOB matches run folders (finished ones: holding ``metrics.jsonl`` and ``summary.json``), e.g.
``"FedAF mean KL=runs/fedaf/fmnist_klmean/s*/FedAF-seed*"`` (split at the last ``=``, so a NAME may hold one,
``"FedAvg #C=2=..."``). Prints one Markdown row per name: the number of
seeds, the accuracy (%) at the given rounds (default 1, 5, 10 and 20; NIID-Bench's tables use
``--rounds 10 25``), the best and the last round's, each mean +- sample std over the seeds.
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path

DEFAULT_ROUNDS = (1, 5, 10, 20)


def _stat(values: list[float]) -> str:
    if not values:
        return ""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}"


def row(name: str, pattern: str, rounds: tuple[int, ...] = DEFAULT_ROUNDS) -> str:
    curves = []
    for folder in sorted(glob.glob(pattern)):
        path = Path(folder) / "metrics.jsonl"
        if path.is_file() and (Path(folder) / "summary.json").is_file():  # finished runs only
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            evaluated = [r for r in records if r.get("accuracy") is not None]
            curves.append({int(r["round"]): 100 * float(r["accuracy"]) for r in evaluated})
    if not curves:
        raise SystemExit(f"no finished run folder (metrics.jsonl and summary.json) matches {pattern!r}")
    at = [_stat([c[r] for c in curves if r in c]) for r in rounds]
    best = _stat([max(c.values()) for c in curves])
    last = _stat([c[max(c)] for c in curves])
    return f"| {name} | {len(curves)} | " + " | ".join(at) + f" | {best} | {last} |"


def _parse(argv: list[str]) -> tuple[tuple[int, ...], list[str]]:
    """The rounds (``--rounds R ...``, positive integers) and the NAME=GLOB arguments."""
    rounds: tuple[int, ...] = DEFAULT_ROUNDS
    if argv[:1] == ["--rounds"]:
        values = []
        argv = argv[1:]
        while argv and "=" not in argv[0]:
            value = argv.pop(0)
            if not value.isdigit() or int(value) < 1:
                raise SystemExit(f"--rounds: {value!r} is not a round number (a positive integer)")
            values.append(int(value))
        if not values:
            raise SystemExit("--rounds needs at least one round number (a positive integer)")
        rounds = tuple(values)
    if not argv or any("=" not in a for a in argv):
        raise SystemExit(__doc__)
    return rounds, argv


def main(argv: list[str]) -> None:
    rounds, pairs = _parse(argv)
    print("| runs | seeds | " + " | ".join(f"acc @{r}" for r in rounds) + " | best | last |")
    print("|" + "---|" * (len(rounds) + 4))
    for arg in pairs:
        name, pattern = arg.rsplit("=", 1)  # the last "=": a name may hold one ("#C=2"), a path seldom does
        print(row(name, pattern, rounds))


if __name__ == "__main__":
    main(sys.argv[1:])
