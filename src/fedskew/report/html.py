"""The report of finished runs: one self-contained HTML page with the table, the plots and the audit.

The engine writes one run folder per (method, seed): ``config.toml``, ``metrics.jsonl`` (one JSON
object per round) and ``summary.json``. Everything here reads only those files (and ``audit.json``
and the synthetic images where a run has them), so a report can be rebuilt at any time, from any mix
of runs, without the code or data that produced them.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import os
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fedskew.config.variants import expand_label
from fedskew.core.figures import FigureStyle, style_of
from fedskew.core.files import staged_folder
from fedskew.metrics.catalog import column
from fedskew.progress import progress_bar
from fedskew.report.client_plots import plot_clients
from fedskew.report.order import in_config_order
from fedskew.report.plots import experiment_title, plot_curves, synthetic_grids
from fedskew.report.tables import (
    comparison_table,
    differing_line,
    separate_experiments,
    table_cells,
    table_keys,
    write_table,
)
from fedskew.runs import AUDIT_FILE, RunData, find_runs, flat_config, load_run, report_folder


def _flatten(config: dict[str, Any]) -> dict[str, str]:
    """Nested TOML tables as ``{"section.key": "value"}`` (:func:`~fedskew.runs.flat_config`), values rendered
    compactly."""
    return {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in flat_config(config).items()}


def _html_table(headers: Sequence[str], cells: Iterable[Sequence[object]],
                bold: AbstractSet[tuple[int, int]] = frozenset(), raw: AbstractSet[int] = frozenset()) -> str:
    """A table; cells at (row, column) in ``bold`` are bold, columns in ``raw`` hold HTML already."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)

    def cell(i: int, j: int, c: object) -> str:
        text = str(c) if j in raw else html.escape(str(c))
        return f"<td><b>{text}</b></td>" if (i, j) in bold else f"<td>{text}</td>"

    body = "".join(
        "<tr>" + "".join(cell(i, j, c) for j, c in enumerate(row)) + "</tr>" for i, row in enumerate(cells)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"




def best_cells(rows: list[dict[str, Any]], keys: Sequence[str]) -> set[tuple[int, int]]:
    """(row, column) of the best value of each column that has a direction (ties: all of them), with
    two or more rows to compare."""
    best: set[tuple[int, int]] = set()
    if len(rows) < 2:
        return best
    for j, key in enumerate(keys):
        better = column(key).better  # drops are negative points: the best is the largest (closest to 0)
        if better is None:
            continue
        higher = better == "higher"
        values = [(i, float(row[key])) for i, row in enumerate(rows) if isinstance(row.get(key), int | float)]
        if len(values) < 2:
            continue
        target = (max if higher else min)(v for _, v in values)
        best.update((i, j) for i, v in values if v == target)
    return best


CAPTIONS = {
    "accuracy": "Test accuracy of the global model per evaluated round (mean over seeds; shaded ± 1 sample std).",
    "class_variance": "Variance of the per-class test accuracies per round (fractions squared): how unevenly "
                      "the global model serves the classes; FedDC's class variance.",
    "bytes": "Test accuracy against the cumulative traffic, all directions (MB): the fair axis when methods "
             "send different amounts a round. Centralised training, which sends its data once, is a dashed line.",
    "client_accuracy": "Each client's accuracy on its own test split in the last evaluated round, one row per "
                       "method (clients of all seeds pooled; the box spans the middle half, the diamond is the "
                       "mean): the global model (blue) and each client's own model (orange), every client "
                       "counted. Each row names what the method evaluates as a client's own model and how many "
                       "clients had never trained; the table's \"clients worse than local\" is the share of "
                       "clients whose own model is worse than local training's (same seed and client).",
    "client_curves": "Mean (solid) and worst-10% (dashed) client accuracy of the clients' own models per round.",
    "per_class": "Per-class test accuracy per round (mean over seeds): which classes a method forgets and "
                 "relearns from round to round.",
    "synthetic": "The condensed images the clients sent in the last round, one row per class.",
}


def caption(name: str) -> str:
    """What a report figure shows, from its file name."""
    for stem, text in CAPTIONS.items():
        if name == stem or name.startswith(f"{stem}_"):
            label = name[len(stem) + 1:]
            return f"{text} ({label.replace('_', ' ')})" if label else text
    return name


def _links(run_dir: Path, out: Path) -> str:
    """Links, relative to the report, to a run's config, metrics and summary."""
    names = ("config.toml", "metrics.jsonl", "summary.json")
    rel = Path(os.path.relpath(run_dir.resolve(), out.resolve()))
    return " ".join(
        f'<a href="{html.escape(quote((rel / n).as_posix()))}">{n.split(".")[0]}</a>' for n in names
        if (run_dir / n).exists()
    )


def _runs_section(runs: list[RunData], root: Path, out: Path) -> str:
    """The header: one line per run plus its config values that differ between runs.

    Settings shared by every run go into a collapsed block: listing them per run would bury the
    few values (method, alpha, seed ...) that the comparison is actually about.
    """
    fixed = ["label", "algorithm", "seed", "rounds", "folder", "files"]
    flat = [_flatten(run.config) for run in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    differing = [k for k in keys if len({f.get(k) for f in flat}) > 1]
    shared = [k for k in keys if k not in differing]
    differing = [k for k in differing if k not in fixed]  # already shown, from the summary
    headers = [*fixed, *differing]
    cells = [
        [
            run.label,
            run.summary["algorithm"],
            run.summary.get("seed", "-"),
            run.summary["rounds"],
            os.path.relpath(run.path.resolve(), root),
            _links(run.path, out),
            *(html.escape(f.get(k, "-")) for k in differing),
        ]
        for run, f in zip(runs, flat, strict=True)
    ]
    for row in cells:
        row[:5] = [html.escape(str(c)) for c in row[:5]]
    parts = [f"<h2>Runs</h2><p>{len(runs)} run(s) under <code>{html.escape(str(root))}</code>.</p>"]
    parts.append(_html_table(headers, cells, raw=set(range(len(headers)))))
    if shared:
        rows = [[k, flat[0][k]] for k in shared]
        parts.append(
            "<details><summary>Settings shared by all runs</summary>"
            + _html_table(["setting", "value"], rows)
            + "</details>"
        )
    return "".join(parts)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
table { display: block; max-width: 100%; overflow-x: auto; }  /* a wide table scrolls, the page keeps its width */
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; }
figure { margin: 1.5em 0; }
figcaption { font-size: 0.9em; color: #444; }
"""


def _audit_section(runs: list[RunData], out: Path) -> str:
    """The privacy audit of the runs that have one (``audit.json``, written by ``fedskew audit``).

    Also writes ``audit.md`` beside ``results.md``. Empty when no run has been audited.
    """
    # Imported here: the audit pulls in torch and the engine, which the rest of the report does without.
    from fedskew.audit import AUDIT_HEADERS, AUDIT_LEGEND, audit_cells, format_audit, read_audit

    audited = [row for run in runs if (run.path / AUDIT_FILE).is_file() for row in read_audit(run.path / AUDIT_FILE)]
    if not audited:
        return ""
    (out / "audit.md").write_text(format_audit(audited) + "\n", encoding="utf-8")
    return (
        f"<h2>Privacy audit of what clients sent</h2><p>{html.escape(AUDIT_LEGEND)}</p>"
        + _html_table(AUDIT_HEADERS, [audit_cells(r) for r in audited])
    )


def _kinds(plain: list[RunData], grouped: list[RunData]) -> dict[str, tuple[str, str]]:
    """Each grouped label's (method, setting): the label before ``--group-by`` and what grouping added."""
    return {g.label: (p.label, g.label[len(p.label):].strip(" ()")) for p, g in zip(plain, grouped, strict=True)}


def _figure_html(img: Path) -> str:
    """A figure of the page: SVG and PNG files inlined as they are, a PDF figure by its PNG copy."""
    shown = img.with_suffix(".png") if img.suffix == ".pdf" else img
    mime = "image/svg+xml" if shown.suffix == ".svg" else "image/png"
    data = base64.b64encode(shown.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(img.stem)}" src="data:{mime};base64,{data}"><figcaption>'
            f"{html.escape(caption(img.stem))} <code>{html.escape(img.name)}</code></figcaption></figure>")


def write_report(paths: Sequence[Path], out_dir: Path | None = None, group_by: Sequence[str] = (),
                 label: str = "", fmt: str | None = None, dpi: int | None = None, progress: bool = False,
                 style: FigureStyle | None = None) -> Path:
    """Build the full report for the runs found under ``paths``.

    Writes ``results.md``, ``results.csv``, the plots and a self-contained ``report.html`` (plots
    inlined, so the page can be mailed or attached to an issue on its own). Runs, table rows and curves
    follow the config's order (:func:`fedskew.report.order.in_config_order`).

    Parameters
    ----------
    paths
        Run folders or folders holding them (see :func:`find_runs`).
    out_dir
        Where to write; by default ``report/`` in the runs' experiment folder when they are all of its runs
        (``EXP/report/``, the report ``fedskew run`` wrote, also for a one-run experiment), else in their
        common folder (:func:`fedskew.runs.report_folder`).
    group_by
        Dotted config keys whose values are added to the labels (see :func:`separate_experiments`);
        runs of different experiments under one label are refused.
    label
        A label template for the runs (``"{label}, KL {algorithm.kl_reduction}"``, see
        :func:`separate_experiments`); empty keeps the runs' own labels.
    fmt, dpi
        The figures' format (``png``, ``pdf`` or ``svg``; a PDF figure also gets a PNG copy, which the
        page shows) and the resolution of raster figures; None: ``style``'s.
    progress
        A progress bar of the figures on standard error (:func:`fedskew.progress.progress_bar`: plain lines
        where it is not a terminal); ``fedskew report`` shows it.
    style
        How the figures look (:class:`~fedskew.core.figures.FigureStyle`: size, font size, titles, a paper
        preset); None: the ``[report]`` table the runs' configs share (:func:`~fedskew.core.figures.style_of`).

    Returns
    -------
    Path
        The HTML file.
    """
    run_paths = find_runs(paths)
    loaded = in_config_order([load_run(p) for p in run_paths])
    style = (style or style_of(r.recorded_table("report") for r in loaded)).updated(format=fmt, dpi=dpi)
    runs = separate_experiments(loaded, group_by, label)
    kinds = None
    if group_by:  # colour = method, line style = the grouped setting
        kinds = _kinds([dataclasses.replace(r, label=expand_label(label, r.label, r.config)) if label else r
                        for r in loaded], runs)
    root = Path(os.path.commonpath([str(p.resolve()) for p in run_paths]))
    out = Path(out_dir) if out_dir is not None else report_folder(run_paths)
    if out_dir is None:
        root = out.parent  # the experiment folder of a one-run experiment, not its run folder
    with staged_folder(out) as stage:  # a write that fails leaves no partial report
        _write_report(runs, kinds, root, out, stage, style, progress)
    return out / "report.html"


def _write_report(runs: list[RunData], kinds: dict[str, tuple[str, str]] | None, root: Path, out: Path, stage: Path,
                  style: FigureStyle, progress: bool) -> None:
    """:func:`write_report`'s files, written into ``stage``; ``out`` is where they will be (the page's links)."""
    rows = comparison_table(runs)
    write_table(rows, stage)
    with progress_bar(total=3, desc=f"report of {len(runs)} run(s)", unit="step", enabled=progress) as bar:
        bar.set_postfix_str("curves")
        images = plot_curves(runs, stage, kinds=kinds, style=style)
        bar.update(1)
        bar.set_postfix_str("per-client plots")
        images += plot_clients(runs, stage, kinds=kinds, style=style)
        bar.update(1)
        bar.set_postfix_str("image grids")
        images += synthetic_grids(runs, stage, style=style)
        bar.update(1)
    headers, cells = table_cells(rows)
    keys = table_keys(rows)
    figures = "".join(_figure_html(img) for img in images)
    title = experiment_title(runs)
    mixed = differing_line(runs)  # runs of different experiments: said in one line, and no best value marked
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>fedskew report</title>'
        f"<style>{_STYLE}</style></head><body><h1>fedskew report</h1>"
        + (f"<p>{html.escape(title)}</p>" if title else "")
        + (f'<p class="note"><b>{html.escape(mixed)}</b></p>' if mixed else "")
        + _runs_section(runs, root, out)
        + "<h2>Results</h2><p>Accuracy in %; drops and rises are changes between consecutive rounds in "
        "percentage points (FedDC's round variance); class var is the per-round variance of the "
        "per-class accuracies (fractions) averaged over rounds, class std its square root in points. "
        "Runs sharing a label are seeds: mean ± sample std over n runs."
        + ("" if mixed else " The best value of each column that has one is in bold.") + "</p>"
        + _html_table(headers, cells, frozenset() if mixed else best_cells(rows, keys))
        + "<h2>Curves</h2>"
        + figures
        + _audit_section(runs, stage)
        + "</body></html>\n"
    )
    (stage / "report.html").write_text(page, encoding="utf-8")
