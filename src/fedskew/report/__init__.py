"""Reports on finished runs: comparison tables, curves and a self-contained HTML page.

``tables`` builds the comparison table, ``plots`` the figures, ``html`` the page; reading run
folders is :mod:`fedskew.runs`' (``RunData``, ``find_runs`` and ``load_run`` are re-exported here).

The package is also callable: ``fedskew.report(runs)`` is :func:`report`. Its names are imported on first use
(matplotlib with them): importing the package costs nothing until a report is drawn. How the figures look is
:mod:`fedskew.core.figures`' (:class:`FigureStyle`, re-exported here).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedskew.core.figures import DEFAULT_DPI, FORMATS, PRESETS, FigureStyle
from fedskew.runs import RunData, find_runs, load_run

if TYPE_CHECKING:
    from fedskew.report.html import write_report
    from fedskew.report.order import in_config_order
    from fedskew.report.plots import plot_curves
    from fedskew.report.tables import comparison_table, format_table, separate_experiments, write_table

_LAZY = {
    "write_report": "html", "in_config_order": "order", "plot_curves": "plots", "comparison_table": "tables",
    "format_table": "tables", "separate_experiments": "tables", "write_table": "tables",
}
"""Names imported on first use, and their modules (matplotlib comes with ``plots``)."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"fedskew.report.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT_DPI",
    "FORMATS",
    "PRESETS",
    "FigureStyle",
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
           format: str | None = None, dpi: int | None = None, *, style: FigureStyle | None = None,
           width: float | None = None, height: float | None = None, font_size: float | None = None,
           titles: bool | None = None, preset: str | None = None) -> Path:
    """Write the report of ``runs`` (``results.md``, ``results.csv``, plots, ``report.html``); return the HTML file.

    ``runs`` is a run folder, a folder holding runs, what :func:`fedskew.run` returned (its run folders),
    or a list of these; ``out`` defaults to ``report/`` in their common parent (see :func:`write_report`);
    ``group_by`` names config keys that tell runs apart (``["dataset.name"]``, ``["algorithm.tau"]``);
    ``label`` relabels the runs from a template (``"{label}, tau={algorithm.tau}"``, as ``fedskew run --label``);
    ``format`` is the figures' file format (``"png"``, ``"pdf"`` or ``"svg"``; a PDF figure also gets the PNG
    copy the page shows) and ``dpi`` the resolution of raster figures (default 150).

    How the figures look: ``style`` (a :class:`FigureStyle`; default: the ``[report]`` table of the runs'
    configs, else matplotlib-like defaults), changed by ``width`` and ``height`` (inches), ``font_size``
    (points), ``titles`` (False: none) and ``preset`` (``"single"``: one column of a two-column paper, 3.3 in
    wide at 8 pt; ``"double"``: both columns, 6.9 in at 9 pt). PDF and PostScript figures embed TrueType fonts
    (no Type 3 fonts, which paper submission checks refuse).
    """
    from fedskew.core.figures import style_of

    changes = {"width": width, "height": height, "font_size": font_size, "titles": titles, "preset": preset}
    items = runs if isinstance(runs, Sequence) and not isinstance(runs, str) else [runs]
    paths: list[Path] = []
    for item in items:
        dirs = getattr(item, "run_dirs", None)
        paths.extend(dirs if dirs is not None else [Path(item)])
    if style is None and any(v is not None for v in changes.values()):
        style = style_of(load_run(p).recorded_table("report") for p in find_runs(paths))
    if style is not None:
        style = style.updated(**changes)
    from fedskew.report.html import write_report

    return write_report(paths, None if out is None else Path(out), group_by, label, format, dpi, style=style)


class _CallablePackage(types.ModuleType):
    """This package, callable: ``fedskew.report(runs, out=None)`` is :func:`report`.

    ``fedskew.report`` names this package once it is imported, so the function of that name lives on it.
    """

    def __call__(self, runs: Any, out: str | os.PathLike[str] | None = None, group_by: Sequence[str] = (),
                 label: str = "", format: str | None = None, dpi: int | None = None, **style: Any) -> Path:
        return report(runs, out, group_by, label, format, dpi, **style)


sys.modules[__name__].__class__ = _CallablePackage
