"""Reports on finished runs: comparison tables, curves and a self-contained HTML page."""

from fedskew.report.report import (
    RunData,
    comparison_table,
    find_runs,
    format_table,
    load_run,
    plot_curves,
    write_report,
    write_table,
)

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
