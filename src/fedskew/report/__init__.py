"""Reports on finished runs: comparison tables, curves and a self-contained HTML page.

``tables`` builds the comparison table, ``plots`` the figures, ``html`` the page; reading run
folders is :mod:`fedskew.runs`' (``RunData``, ``find_runs`` and ``load_run`` are re-exported here).

The package is also callable: ``fedskew.report(runs)`` is :func:`report`.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedskew.report.html import write_report
from fedskew.report.order import in_config_order
from fedskew.report.plots import DEFAULT_DPI, FORMATS, plot_curves
from fedskew.report.tables import comparison_table, format_table, separate_experiments, write_table
from fedskew.runs import RunData, find_runs, load_run

__all__ = [
    "DEFAULT_DPI",
    "FORMATS",
    "RunData",
    "comparison_table",
    "find_runs",
    "format_table",
    "in_config_order",
    "load_run",
    "plot_curves",
    "report",
    "separate_experiments",
    "write_report",
    "write_table",
]


def report(runs: Any, out: str | os.PathLike[str] | None = None, group_by: Sequence[str] = (), label: str = "",
           format: str = "png", dpi: int = DEFAULT_DPI) -> Path:
    """Write the report of ``runs`` (``results.md``, ``results.csv``, plots, ``report.html``); return the HTML file.

    ``runs`` is a run folder, a folder holding runs, what :func:`fedskew.run` returned (its run folders),
    or a list of these; ``out`` defaults to ``report/`` in their common parent (see :func:`write_report`);
    ``group_by`` names config keys that tell runs apart (``["dataset.name"]``, ``["algorithm.tau"]``);
    ``label`` relabels the runs from a template (``"{label}, tau={algorithm.tau}"``, as ``fedskew run --label``);
    ``format`` is the figures' file format (``"png"``, ``"pdf"`` or ``"svg"``; a PDF figure also gets the PNG
    copy the page shows) and ``dpi`` the resolution of raster figures (default 150).
    """
    items = runs if isinstance(runs, Sequence) and not isinstance(runs, str) else [runs]
    paths: list[Path] = []
    for item in items:
        dirs = getattr(item, "run_dirs", None)
        paths.extend(dirs if dirs is not None else [Path(item)])
    return write_report(paths, None if out is None else Path(out), group_by, label, format, dpi)


class _CallablePackage(types.ModuleType):
    """This package, callable: ``fedskew.report(runs, out=None)`` is :func:`report`.

    ``fedskew.report`` names this package once it is imported, so the function of that name lives on it.
    """

    def __call__(self, runs: Any, out: str | os.PathLike[str] | None = None, group_by: Sequence[str] = (),
                 label: str = "", format: str = "png", dpi: int = DEFAULT_DPI) -> Path:
        return report(runs, out, group_by, label, format, dpi)


sys.modules[__name__].__class__ = _CallablePackage
