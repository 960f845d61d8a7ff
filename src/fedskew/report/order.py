"""The order runs are reported in: the config's, not the alphabet's.

A run folder does not record its variant's position in the config, but ``fedskew run`` starts the runs in
the config's order (variants in the order written, each variant's seeds in turn) and writes each run's
``config.toml`` as it starts it. So labels are ordered by their earliest run's ``config.toml`` time, and
the runs of a label by seed; folders with equal times (a fresh ``git clone`` of archived runs) keep the
sorted folder order. A run continued with ``--resume`` rewrites its ``config.toml`` and moves behind the
runs started before it.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedskew.runs import CONFIG_FILE, RunData


def _started(path: Path) -> float:
    try:
        return float((path / CONFIG_FILE).stat().st_mtime_ns)
    except OSError:
        return math.inf


def in_config_order(runs: list[RunData]) -> list[RunData]:
    """``runs`` (as :func:`fedskew.runs.load_run` read them, in sorted folder order) in the order their
    experiment's config gave: labels by the earliest start of their runs, then seed, then folder."""
    position = {id(run): i for i, run in enumerate(runs)}
    first: dict[str, float] = {}
    for run in runs:
        first[run.label] = min(first.get(run.label, math.inf), _started(run.path))

    def seed(run: RunData) -> float:
        value = run.summary.get("seed")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.inf

    return sorted(runs, key=lambda run: (first[run.label], seed(run), position[id(run)]))
