"""Reports on finished runs: comparison tables, curves and a self-contained HTML page.

``tables`` builds the comparison table, ``plots`` the figures, ``html`` the page; reading run
folders is :mod:`fedskew.runs`' (``RunData``, ``find_runs`` and ``load_run`` are re-exported here).
"""

from fedskew.report.html import write_report
from fedskew.report.plots import plot_curves
from fedskew.report.tables import comparison_table, format_table, write_table
from fedskew.runs import RunData, find_runs, load_run

__all__ = [
    "RunData",
    "comparison_table",
    "find_runs",
    "format_table",
    "load_run",
    "plot_curves",
    "write_report",
    "write_table",
]
