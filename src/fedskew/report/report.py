"""Compare finished runs: a table, curves and one self-contained HTML page.

The engine writes one run folder per (method, seed): ``config.toml``, ``metrics.jsonl`` (one JSON
object per round) and ``summary.json``. Everything here reads only those files, so a report can be
rebuilt at any time, from any mix of runs, without the code or data that produced them.

Units in everything shown to people: accuracy in percent, drops and rises in percentage points
(FedDC's "round variance", as in its Table 1), traffic in MB (10^6 bytes). Runs sharing a label are
seeds of one setting: they are shown as mean and sample standard deviation (ddof=1).
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import re
import statistics
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedskew.core.errors import FedskewError

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.toml"
REQUIRED_SUMMARY_KEYS = (
    "algorithm",
    "rounds",
    "final_accuracy",
    "best_accuracy",
    "max_drop",
    "mean_drop",
    "mean_rise",
    "mean_class_variance",
    "bytes_server_to_client",
    "bytes_client_to_server",
)
DIRECTIONS = ("server_to_client", "client_to_server", "client_to_client")
MB = 1e6

# Display names of the table's columns; a column ``x_std`` is shown inside column ``x`` as "mean ± std".
HEADERS = {
    "label": "label",
    "algorithm": "algorithm",
    "n": "n",
    "rounds": "rounds",
    "final_acc": "final acc %",
    "best_acc": "best acc %",
    "max_drop": "max drop pp",
    "mean_drop": "mean drop pp",
    "mean_rise": "mean rise pp",
    "class_var": "class var",
    "class_std_pp": "class std pp",
    "mb_server_to_client": "MB down",
    "mb_client_to_server": "MB up",
    "mb_client_to_client": "MB c2c",
    "rounds_to_target": "rounds to target",
    "mb_to_target": "MB to target",
}

_DECIMALS = {"class_var": 5, "rounds_to_target": 1}
_TEXT_COLUMNS = {"label", "algorithm"}


@dataclass
class RunData:
    """One finished run as read from its folder.

    Attributes
    ----------
    path
        The run folder.
    label
        What the run is compared under: ``summary["label"]`` or else the folder name. Runs sharing a
        label are treated as seeds of one setting.
    summary
        The parsed ``summary.json``.
    records
        The per-round objects of ``metrics.jsonl``, sorted by round.
    config
        The parsed ``config.toml``, or empty when the folder has none.
    """

    path: Path
    label: str
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)


def _is_run_folder(path: Path) -> bool:
    # A folder with metrics but no summary (an interrupted run) still counts, so that load_run
    # reports the missing summary instead of the run silently vanishing from a comparison.
    return (path / SUMMARY_FILE).is_file() or (path / METRICS_FILE).is_file()


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Run folders given directly or found below the given folders.

    Parameters
    ----------
    paths
        Each is a run folder, or a folder searched recursively for run folders (an experiment's
        parent folder).

    Returns
    -------
    list of Path
        Sorted and without duplicates, so the report's order does not depend on the file system.

    Raises
    ------
    FedskewError
        If a path does not exist or no run folder is found at all.
    """
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FedskewError(f"no such file or folder: {p}")
        if _is_run_folder(p):
            found.add(p)
        elif p.is_dir():
            found.update(f.parent for pattern in (SUMMARY_FILE, METRICS_FILE) for f in p.rglob(pattern))
    if not found:
        listed = ", ".join(str(p) for p in paths) or "(no paths given)"
        raise FedskewError(f"no run folders (with {SUMMARY_FILE}) found in: {listed}")
    return sorted(found)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FedskewError(f"missing {path.name}: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise FedskewError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FedskewError(f"missing {path.name}: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise FedskewError(f"{path}, line {lineno}: not valid JSON ({e})") from None
        # accuracy is null in rounds without an evaluation (eval_every > 1)
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("round"), int)
            or not (rec.get("accuracy") is None or _is_number(rec.get("accuracy")))
        ):
            raise FedskewError(
                f"{path}, line {lineno}: a record needs an integer round and an accuracy (a number, or null "
                "for a round without evaluation)"
            )
        records.append(rec)
    if not records:
        raise FedskewError(f"{path} holds no rounds")
    return sorted(records, key=lambda r: int(r["round"]))


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None


def _is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, int | float) and not isinstance(x, bool)


def load_run(path: Path) -> RunData:
    """Read one run folder.

    Raises
    ------
    FedskewError
        Naming the file, when ``summary.json`` or ``metrics.jsonl`` is missing or corrupt, when the
        summary lacks a required key, or when ``config.toml`` (optional) cannot be parsed.
    """
    path = Path(path)
    summary_path = path / SUMMARY_FILE
    summary = _read_json(summary_path)
    missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise FedskewError(f"{summary_path} lacks {', '.join(missing)}")
    records = _read_records(path / METRICS_FILE)
    config = _read_config(path / CONFIG_FILE)
    return RunData(path, str(summary.get("label") or path.name), summary, records, config)


def _group(runs: Iterable[RunData]) -> dict[str, list[RunData]]:
    """Runs by label, labels in order of first appearance."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def _mean_std(values: Iterable[float | None], scale: float, ndigits: int) -> tuple[float | None, float | None]:
    """Mean and sample std of the non-None values times ``scale``; std is None for fewer than two."""
    vals = [float(v) * scale for v in values if v is not None]
    if not vals:
        return None, None
    std = round(statistics.stdev(vals), ndigits) if len(vals) > 1 else None
    return round(statistics.fmean(vals), ndigits), std


def _class_std_pp(run: RunData) -> float | None:
    """Mean over rounds of the per-class accuracy standard deviation, in percentage points.

    FedDC's Table 1 "class variance" values (12-33 for CIFAR-10) exceed the largest possible variance
    of fractions (0.25) and would mean implausibly small spreads if read as percent squared; their
    magnitude matches a standard deviation in points. This column makes that comparison possible.
    """
    stds = [math.sqrt(r["class_variance"]) * 100 for r in run.records if _is_number(r.get("class_variance"))]
    return statistics.fmean(stds) if stds else None


def comparison_table(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per label, aggregating seeds.

    Returns
    -------
    list of dict
        Keys: ``label``, ``algorithm``, ``n`` (runs aggregated), ``rounds``; ``final_acc``,
        ``best_acc`` and ``acc@<round>`` (for rounds in the summaries' ``accuracy_at``) in percent;
        ``max_drop``, ``mean_drop``, ``mean_rise`` in percentage points; ``class_var`` (mean per-round
        class variance of fractional accuracies) and ``class_std_pp``; each of these with a
        ``<key>_std``, the sample std over seeds (None for a single run); ``mb_<direction>`` traffic
        totals; and, when the summaries have them, ``rounds_to_target`` and ``mb_to_target`` (None unless every seed
        reached the target, since a mean over the seeds that did would flatter the method).
        Accuracies and points are rounded to 2 decimals.
    """
    at_rounds = sorted(
        {int(r) for run in runs for r in (run.summary.get("accuracy_at") or {})},
    )
    with_target = any(run.summary.get("rounds_to_target") is not None for run in runs)
    rows = []
    for label, group in _group(runs).items():
        summaries = [run.summary for run in group]
        algorithms = list(dict.fromkeys(str(s["algorithm"]) for s in summaries))
        n_rounds = sorted({int(s["rounds"]) for s in summaries})
        row: dict[str, Any] = {
            "label": label,
            "algorithm": ", ".join(algorithms),
            "n": len(group),
            "rounds": n_rounds[0] if len(n_rounds) == 1 else f"{n_rounds[0]}-{n_rounds[-1]}",
        }
        accs = {"final_acc": [s["final_accuracy"] for s in summaries]}
        accs["best_acc"] = [s["best_accuracy"] for s in summaries]
        for r in at_rounds:
            accs[f"acc@{r}"] = [(s.get("accuracy_at") or {}).get(str(r)) for s in summaries]
        for key, values in accs.items():
            row[key], row[f"{key}_std"] = _mean_std(values, 100, 2)
        for key in ("max_drop", "mean_drop", "mean_rise"):
            row[key], row[f"{key}_std"] = _mean_std((s[key] for s in summaries), 100, 2)
        row["class_var"], row["class_var_std"] = _mean_std((s["mean_class_variance"] for s in summaries), 1, 5)
        row["class_std_pp"], row["class_std_pp_std"] = _mean_std((_class_std_pp(run) for run in group), 1, 2)
        for d in DIRECTIONS:
            row[f"mb_{d}"] = _mean_std((s.get(f"bytes_{d}", 0) for s in summaries), 1 / MB, 3)[0]
        if with_target:
            reached = [s.get("rounds_to_target") is not None for s in summaries]
            row["rounds_to_target"] = (
                _mean_std((s["rounds_to_target"] for s in summaries), 1, 1)[0] if all(reached) else None
            )
            row["mb_to_target"] = (
                _mean_std((s.get("bytes_to_target") for s in summaries), 1 / MB, 3)[0] if all(reached) else None
            )
        rows.append(row)
    return rows


def _display(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cell strings: ``x`` and ``x_std`` merged into "mean ± std", all-empty columns dropped."""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if not k.endswith("_std")]
    keys = [k for k in keys if any(row.get(k) is not None for row in rows)]

    def cell(row: dict[str, Any], key: str) -> str:
        value, std = row.get(key), row.get(f"{key}_std")
        if value is None:
            return "-"
        if not isinstance(value, float):
            return str(value)
        digits = _DECIMALS.get(key, 3 if key.startswith("mb_") else 2)
        return f"{value:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")

    headers = [HEADERS.get(k, k.replace("acc@", "acc % @")) for k in keys]
    return headers, [[cell(row, k) for k in keys] for row in rows]


def format_table(rows: list[dict[str, Any]]) -> str:
    """The comparison table as aligned plain text, for printing in a terminal."""
    headers, cells = _display(rows)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(items: list[str]) -> str:
        padded = (
            item.ljust(w) if h in _TEXT_COLUMNS else item.rjust(w)
            for item, w, h in zip(items, widths, headers, strict=True)
        )
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(c) for c in cells)])


def write_table(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """Write ``results.md`` (for docs and pull requests) and ``results.csv`` (for further analysis).

    The CSV keeps means and stds in separate columns with full precision of the rows; the Markdown
    shows them as "mean ± std".
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    headers, cells = _display(rows)
    md = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join([":---", *["---:"] * (len(headers) - 1)]) + "|",
        *("| " + " | ".join(c) + " |" for c in cells),
    ]
    md_path = out_dir / "results.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    csv_path = out_dir / "results.csv"
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return md_path, csv_path


def _value(x: object) -> float:
    return float(x) if _is_number(x) else math.nan


def _aligned(group: list[RunData], values: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rounds present in every run of ``group`` and a (runs, rounds, ...) array of ``values(run)``.

    ``values`` maps a run to ``{round: value}``; aligning on round numbers (not positions) keeps
    seeds comparable when one of them skipped an evaluation.
    """
    per_run = [values(run) for run in group]
    common = sorted(set.intersection(*(set(v) for v in per_run)))
    return np.array(common, dtype=np.int64), np.array([[v[r] for r in common] for v in per_run], dtype=float)


def _accuracy(run: RunData) -> dict[int, float]:
    """Accuracy in percent per evaluated round (rounds without evaluation are left out)."""
    return {r["round"]: float(r["accuracy"]) * 100 for r in run.records if _is_number(r.get("accuracy"))}


def _class_variance(run: RunData) -> dict[int, float]:
    return {r["round"]: float(r["class_variance"]) for r in run.records if _is_number(r.get("class_variance"))}


def _cumulative_mb(run: RunData) -> dict[int, float]:
    totals = (sum(_value(r.get(f"bytes_{d}", 0)) for d in DIRECTIONS) for r in run.records)
    return dict(zip((r["round"] for r in run.records), np.cumsum(list(totals)) / MB, strict=True))


def _per_class(run: RunData) -> dict[int, list[float]]:
    return {
        r["round"]: [_value(a) * 100 for a in r["per_class_accuracy"]]
        for r in run.records
        if isinstance(r.get("per_class_accuracy"), list)
    }


def _mean_and_std(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Mean over the first axis and the sample std (None for a single run)."""
    mean = stack.mean(axis=0)
    return mean, (stack.std(axis=0, ddof=1) if len(stack) > 1 else None)


def _line_with_band(ax: Axes, x: np.ndarray, stack: np.ndarray, color: Any, label: str) -> None:
    mean, std = _mean_and_std(stack)
    ax.plot(x, mean, color=color, label=label if len(stack) == 1 else f"{label} (n={len(stack)})")
    if std is not None:
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _unique_slug(label: str, used: set[str]) -> str:
    """:func:`_slug` of ``label``, made distinct from those in ``used`` ("FedDC" and "FedDC+" share one)."""
    slug = _slug(label)
    while slug in used:
        slug += "_"
    used.add(slug)
    return slug


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def plot_curves(runs: list[RunData], out_dir: Path) -> list[Path]:
    """Write the comparison plots into ``out_dir``.

    Writes ``accuracy.png`` (test accuracy per round), ``class_variance.png`` (per-round class
    variance), ``bytes.png`` (accuracy against cumulative traffic in all directions, the fair axis
    when methods send different amounts per round) and, for each label with per-class accuracies,
    ``per_class_<label>.png`` (a classes x rounds heatmap that shows which classes a method forgets
    from round to round). Seeds are drawn as their mean with a +-1 std band.

    Figures are built with the object-oriented Agg API (no pyplot), so no global backend or figure
    registry is touched and nothing is left open.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = _group(runs)
    colors = colormaps["tab10"]
    curves = [
        ("accuracy.png", "round", "test accuracy (%)", _accuracy),
        ("class_variance.png", "round", "class variance (fractions squared)", _class_variance),
    ]
    written = []
    for name, xlabel, ylabel, values in curves:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        ax = fig.add_subplot()
        for i, (label, group) in enumerate(groups.items()):
            x, stack = _aligned(group, values)
            _line_with_band(ax, x, stack, colors(i % 10), label)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        written.append(_save(fig, out_dir / name))

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, group) in enumerate(groups.items()):
        x_mb, mb = _aligned(group, _cumulative_mb)
        x_acc, acc = _aligned(group, _accuracy)
        # traffic up to and including each evaluated round
        _line_with_band(ax, mb[:, np.isin(x_mb, x_acc)].mean(axis=0), acc, colors(i % 10), label)
    ax.set(xlabel="cumulative traffic, all directions (MB)", ylabel="test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    written.append(_save(fig, out_dir / "bytes.png"))

    cmap = colormaps["viridis"].with_extremes(bad="lightgrey")
    used: set[str] = set()
    for label, group in groups.items():
        rounds, stack = _per_class_stack(group)
        if rounds.size == 0 or stack.shape[1] == 0:
            continue
        slug = _unique_slug(label, used)
        fig = Figure(figsize=(7, 3.5), layout="constrained")
        ax = fig.add_subplot()
        image = ax.imshow(
            stack.T,
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            cmap=cmap,
            vmin=0,
            vmax=100,
            extent=(rounds[0] - 0.5, rounds[-1] + 0.5, -0.5, stack.shape[1] - 0.5),
        )
        fig.colorbar(image, ax=ax, label="accuracy (%)")
        ax.set(xlabel="round", ylabel="class", title=f"per-class accuracy: {label}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        written.append(_save(fig, out_dir / f"per_class_{slug}.png"))
    return written


def _per_class_stack(group: list[RunData]) -> tuple[np.ndarray, np.ndarray]:
    """Rounds and the (rounds, classes) per-class accuracy averaged over seeds, NaN where absent."""
    per_run = [_per_class(run) for run in group]
    common = sorted(set.intersection(*(set(v) for v in per_run)))
    n_classes = max(len(v[r]) for v in per_run for r in common) if common else 0
    stack = np.full((len(group), len(common), n_classes), np.nan)
    for i, v in enumerate(per_run):
        for j, r in enumerate(common):
            stack[i, j, : len(v[r])] = v[r]
    present = ~np.isnan(stack)
    counts = present.sum(axis=0)
    sums = np.where(present, stack, 0.0).sum(axis=0)
    mean = np.divide(sums, counts, out=np.full(counts.shape, np.nan), where=counts > 0)
    return np.array(common), mean


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested TOML tables as ``{"section.key": "value"}``, values rendered compactly."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value, default=str) if not isinstance(value, str) else value
    return flat


def _html_table(headers: Sequence[str], cells: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _runs_section(runs: list[RunData], root: Path) -> str:
    """The header: one line per run plus its config values that differ between runs.

    Settings shared by every run go into a collapsed block: listing them per run would bury the
    few values (method, alpha, seed ...) that the comparison is actually about.
    """
    fixed = ["label", "algorithm", "seed", "rounds", "folder"]
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
            *(f.get(k, "-") for k in differing),
        ]
        for run, f in zip(runs, flat, strict=True)
    ]
    parts = [f"<h2>Runs</h2><p>{len(runs)} run(s) under <code>{html.escape(str(root))}</code>.</p>"]
    parts.append(_html_table(headers, cells))
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
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; }
figure { margin: 1.5em 0; }
"""


def synthetic_grids(runs: list[RunData], out_dir: Path, per_class: int = 10) -> list[Path]:
    """``synthetic_<label>.png``: the condensed images each run's clients sent in its last round.

    One row per class, at most ``per_class`` images a row (the first ones sent), from the run's
    ``artifacts/synthetic/`` (FedDC, FedDC+, FedDM and FedAF save them); the papers' Fig. 7 view.
    The first seed of a label stands for it. Runs without synthetic data get no grid.
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from fedskew.report.grids import save_image_grid

    written: list[Path] = []
    used: set[str] = set()
    for label, group in _group(runs).items():
        files = sorted((group[0].path / "artifacts" / "synthetic").glob("round_*.safetensors"))
        if not files:
            continue
        try:
            data = load_file(str(files[-1]))
            images, labels = data["images"], data["labels"]
        except (OSError, SafetensorError, KeyError) as e:
            raise FedskewError(f"cannot read synthetic images {files[-1]}: {e}") from None
        keep = torch.cat([torch.nonzero(labels == c).flatten()[:per_class] for c in torch.unique(labels)])
        slug = _unique_slug(label, used)
        written.append(save_image_grid(images[keep], labels[keep], out_dir / f"synthetic_{slug}.png"))
    return written


def _audit_section(runs: list[RunData], out: Path) -> str:
    """The privacy audit of the runs that have one (``audit.json``, written by ``fedskew audit``).

    Also writes ``audit.md`` beside ``results.md``. Empty when no run has been audited.
    """
    from fedskew.audit import AUDIT_HEADERS, AUDIT_LEGEND, audit_cells, format_audit, read_audit

    audited = [read_audit(run.path / "audit.json") for run in runs if (run.path / "audit.json").is_file()]
    if not audited:
        return ""
    (out / "audit.md").write_text(format_audit(audited) + "\n", encoding="utf-8")
    return (
        f"<h2>Privacy audit of the synthetic images sent</h2><p>{html.escape(AUDIT_LEGEND)}</p>"
        + _html_table(AUDIT_HEADERS, [audit_cells(r) for r in audited])
    )


def write_report(paths: Sequence[Path], out_dir: Path | None = None) -> Path:
    """Build the full report for the runs found under ``paths``.

    Writes ``results.md``, ``results.csv``, the plots and a self-contained ``report.html`` (plots
    inlined as base64 PNG, so the page can be mailed or attached to an issue on its own).

    Parameters
    ----------
    paths
        Run folders or folders holding them (see :func:`find_runs`).
    out_dir
        Where to write; by default ``report/`` in the runs' common parent folder (inside the run
        folder itself when there is only one run).

    Returns
    -------
    Path
        The HTML file.
    """
    run_paths = find_runs(paths)
    runs = [load_run(p) for p in run_paths]
    root = Path(os.path.commonpath([str(p.resolve()) for p in run_paths]))
    out = Path(out_dir) if out_dir is not None else root / "report"
    rows = comparison_table(runs)
    write_table(rows, out)
    images = plot_curves(runs, out) + synthetic_grids(runs, out)
    headers, cells = _display(rows)
    figures = "".join(
        f'<figure><img alt="{html.escape(img.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(img.read_bytes()).decode("ascii")}"><figcaption>{html.escape(img.name)}'
        "</figcaption></figure>"
        for img in images
    )
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>fedskew report</title>'
        f"<style>{_STYLE}</style></head><body><h1>fedskew report</h1>"
        + _runs_section(runs, root)
        + "<h2>Results</h2><p>Accuracy in %; drops and rises are changes between consecutive rounds in "
        "percentage points (FedDC's round variance); class var is the per-round variance of the "
        "per-class accuracies (fractions) averaged over rounds, class std its square root in points. "
        "Runs sharing a label are seeds: mean ± sample std over n runs.</p>"
        + _html_table(headers, cells)
        + "<h2>Curves</h2>"
        + figures
        + _audit_section(runs, out)
        + "</body></html>\n"
    )
    html_path = out / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return html_path
