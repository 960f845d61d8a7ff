"""Plots of finished runs: curves per label (seeds as mean +- std), per-class heat maps, synthetic image grids."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedskew.core.errors import FedskewError
from fedskew.core.figures import (
    DATASET_TITLES,
    DEFAULT_DPI,
    DEFAULT_STYLE,
    FORMATS,
    LINE_WIDTH,
    MARKER_SIZE,
    FigureStyle,
    check_format,
    dataset_title,
    partition_title,
)
from fedskew.report.tables import DIRECTIONS, MB, group_runs

__all__ = ["DATASET_TITLES", "DEFAULT_DPI", "FORMATS", "FigureStyle", "check_format", "plot_curves", "synthetic_grids"]
from fedskew.runs import RunData, is_number, synthetic_files


def _value(x: object) -> float:
    return float(x) if is_number(x) else math.nan


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
    return {r["round"]: float(r["accuracy"]) * 100 for r in run.records if is_number(r.get("accuracy"))}


def _epsilon(run: RunData) -> dict[int, float]:
    """A private run's epsilon after each round (``[privacy]``; none for other runs)."""
    return {r["round"]: float(r["epsilon"]) for r in run.records if is_number(r.get("epsilon"))}


def _class_variance(run: RunData) -> dict[int, float]:
    return {r["round"]: float(r["class_variance"]) for r in run.records if is_number(r.get("class_variance"))}


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


LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
"""Line styles in order of use (solid, dashed, dash-dot, dotted, dash-dot-dot, sparse dots)."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
"""Marker shapes in order of use."""


def line_styles(labels: Sequence[str], kinds: Mapping[str, tuple[str, str]] | None = None) -> dict[str, dict[str, Any]]:
    """Colour, line style and marker of each label's curve, so that every curve can be told apart in colour,
    in grey and where two curves are identical (different dashes and markers at different points).

    Without ``kinds``: label ``i`` gets colour ``i``, line style ``i`` and marker ``i`` (cycling). With
    ``kinds`` (label -> (method, setting), from ``--group-by``): colour and marker follow the method, line
    style the grouped setting, so "FedAvg (alpha=0.1)" and "FedAvg (alpha=0.5)" share a colour and differ in
    dashes, and "FedProx (alpha=0.1)" shares FedAvg's dashes in another colour. Colours are tab10's.
    """
    colors = colormaps["tab10"]
    styles: dict[str, dict[str, Any]] = {}
    if kinds:
        methods = list(dict.fromkeys(kinds.get(label, (label, ""))[0] for label in labels))
        settings = list(dict.fromkeys(kinds.get(label, (label, ""))[1] for label in labels))
        for label in labels:
            method, setting = kinds.get(label, (label, ""))
            m, k = methods.index(method), settings.index(setting)
            styles[label] = {"color": colors(m % 10), "linestyle": LINE_STYLES[k % len(LINE_STYLES)],
                             "marker": MARKERS[m % len(MARKERS)], "hollow": k % 2 == 1}
    else:
        for i, label in enumerate(labels):
            styles[label] = {"color": colors(i % 10), "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
                             "marker": MARKERS[i % len(MARKERS)], "hollow": i % 2 == 1}
    for i, label in enumerate(labels):
        styles[label]["order"] = i
    return styles


def _line_with_band(ax: Axes, x: np.ndarray, stack: np.ndarray, style: Mapping[str, Any], label: str,
                    n_labels: int = 1) -> None:
    """The mean curve with its markers (about ten a curve, staggered between labels so that identical curves
    show every label's markers) and, for several seeds, a ±1 std band."""
    mean, std = _mean_and_std(stack)
    step = max(1, math.ceil(len(x) / 10))
    order = int(style.get("order", 0))
    offset = (order * max(1, step // max(n_labels, 1))) % step
    # Every curve equally wide, with equal markers (a method plotted last is as visible as the first); where
    # curves coincide, their dashes and their markers, at different rounds, still tell them apart.
    ax.plot(x, mean, color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
            markevery=(offset, step), markersize=MARKER_SIZE, linewidth=LINE_WIDTH,
            markerfacecolor="none" if style.get("hollow") else style["color"],
            label=label if len(stack) == 1 else f"{label} (n={len(stack)})")
    if std is not None:
        ax.fill_between(x, mean - std, mean + std, color=style["color"], alpha=0.15, linewidth=0)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _unique_slug(label: str, used: set[str]) -> str:
    """:func:`_slug` of ``label``, made distinct from those in ``used`` ("FedDC" and "FedDC+" share one)."""
    slug = _slug(label)
    while slug in used:
        slug += "_"
    used.add(slug)
    return slug


def _style(style: FigureStyle | None, fmt: str | None, dpi: int | None) -> FigureStyle:
    """``style`` (default: :data:`DEFAULT_STYLE`) with the format and dpi given, checked."""
    return (style or DEFAULT_STYLE).updated(format=fmt, dpi=dpi)


def _save(fig: Figure, path: Path, fmt: str = "png", dpi: int = DEFAULT_DPI) -> Path:
    """Write ``fig`` as ``path`` (a name without suffix) plus the suffix of ``fmt``, with a tight bounding box
    (nothing clipped); a PDF figure also gets a PNG copy, which report.html shows (a page cannot show a PDF
    inline). Returns the file written in ``fmt``. Called inside the figure's :meth:`FigureStyle.context`
    (TrueType fonts in a PDF)."""
    from fedskew.condense.grids import save_figure

    out = save_figure(fig, path.parent / f"{path.name}.{fmt}", dpi)  # not with_suffix: "alpha_0.1" has a dot
    if fmt == "pdf":
        save_figure(fig, path.parent / f"{path.name}.png", dpi)
    return out


def _wrap(text: str, width: int = 75) -> str:
    """``text`` on lines of at most ``width`` characters (titles that would run past the figure's edges)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)) or text


BAND = "shaded: mean ± 1 sample std over seeds"


def experiment_title(runs: list[RunData]) -> str:
    """What the runs were run on, for plot titles: the dataset and the partition with the parameters that say
    what it is (:func:`~fedskew.core.figures.partition_title`: ``Dirichlet α=0.1, 10 clients``, not how it is
    drawn, ``min_size`` or ``max_retries``), those all runs share; "several datasets" etc. where they differ."""
    def shared(table: str) -> bool:
        return all(run.recorded_table(table) == runs[0].recorded_table(table) for run in runs)

    if not runs or not runs[0].config:
        return ""
    first = runs[0]
    data = dataset_title(first.recorded("dataset.name")) if shared("dataset") else "several datasets"
    fraction = first.recorded("dataset.train_fraction", 1.0)
    if shared("dataset") and fraction != 1.0:
        data += f" ({100 * float(fraction):g}% of the training set)"
    if not shared("partition"):
        return f"{data}, several partitions"
    name, clients = first.recorded("partition.name", ""), first.recorded("partition.num_clients")
    return f"{data}, {partition_title(name, clients, first.recorded_table('partition'))}"


LONG_LABEL = 28
"""Characters: a legend with a label this long (``--group-by`` adds ``(partition.alpha=0.1)``) or with more
than four labels goes below the axes, full width, rather than beside them (where it squeezed the axes)."""


def _finish(ax: Axes, title: str, n_max: int, style: FigureStyle = DEFAULT_STYLE) -> None:
    """Grid, legend (below the axes from five labels on or with long labels, so it hides no curve and leaves the
    axes the figure's width; saying what the band is when some label has several seeds) and the title (without
    ``style.titles``: none), wrapped to the figure's width."""
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        band = BAND if n_max > 1 else None
        longest = max(len(label) for label in labels)
        if len(handles) > 4 or longest > LONG_LABEL:
            fig = ax.get_figure()
            assert isinstance(fig, Figure)
            width_chars = fig.get_figwidth() * 72 / (0.85 * style.font * 0.6)  # small font, about 0.6 em a char
            ncols = max(1, min(len(handles), int(width_chars // (longest + 6))))
            fig.legend(handles, labels, fontsize="small", title=band, title_fontsize="x-small",
                       loc="outside lower center", ncols=ncols, frameon=False)
        else:
            ax.legend(fontsize="small", title=band, title_fontsize="x-small")
    if title and style.titles:
        ax.set_title(_wrap(title, _title_width(ax, style)), fontsize="medium")


def _title_width(ax: Axes, style: FigureStyle, share: float = 1.0) -> int:
    """How many characters of a title fit the figure's width (at the title's font size), at most 100."""
    fig = ax.get_figure()
    inches = fig.get_figwidth() if isinstance(fig, Figure) else 7.0
    return max(20, min(100, int(share * inches * 72 / (style.font * 0.65))))


def plot_curves(runs: list[RunData], out_dir: Path, fmt: str | None = None, dpi: int | None = None,
                kinds: Mapping[str, tuple[str, str]] | None = None, style: FigureStyle | None = None) -> list[Path]:
    """Write the comparison plots into ``out_dir``, as ``fmt`` files (png, pdf or svg) at ``dpi`` (None: those of
    ``style``), in ``style`` (:class:`~fedskew.core.figures.FigureStyle`: size, fonts, titles).

    Writes ``accuracy.png`` (test accuracy per round), ``class_variance.png`` (per-round class
    variance), ``bytes.png`` (accuracy against cumulative traffic in all directions, the fair axis
    when methods send different amounts per round; centralised training, which sends its data once,
    is a horizontal line at its best accuracy) and, for each label with per-class accuracies,
    ``per_class_<label>.png`` (a classes x rounds heatmap, classes by name, that shows which classes a
    method forgets from round to round). Seeds are drawn as their mean with a +-1 std band, which the
    legend says. Titles name the dataset and the partition. Each label's curve has its own colour, line
    style and markers (:func:`line_styles`; with ``kinds``, from ``--group-by``, colour = method and line
    style = the grouped setting), so identical curves stay visible and the figures read in grey.

    Figures are built with the object-oriented Agg API (no pyplot), so no global backend or figure
    registry is touched and nothing is left open.
    """
    style = _style(style, fmt, dpi)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with style.context():
        return _plot_curves(runs, out_dir, style, kinds)


def _plot_curves(runs: list[RunData], out_dir: Path, style: FigureStyle,
                 kinds: Mapping[str, tuple[str, str]] | None) -> list[Path]:
    fmt, dpi = style.format, style.dpi
    groups = group_runs(runs)
    styles = line_styles(list(groups), kinds)
    title = style.title(experiment_title(runs))
    n_max = max((len(g) for g in groups.values()), default=1)
    curves = [
        ("accuracy", "round", "test accuracy (%)", _accuracy),
        ("class_variance", "round", "class variance (fractions squared)", _class_variance),
    ]
    written = []
    for name, xlabel, ylabel, values in curves:
        fig = Figure(figsize=style.size(7, 4.5), layout="constrained")
        ax = fig.add_subplot()
        for label, group in groups.items():
            x, stack = _aligned(group, values)
            if x.size:
                _line_with_band(ax, x, stack, styles[label], label, len(groups))
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _finish(ax, title, n_max, style)
        written.append(_save(fig, out_dir / name, fmt, dpi))

    fig = Figure(figsize=style.size(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, group in groups.items():
        x_acc, acc = _aligned(group, _accuracy)
        if not x_acc.size:
            continue
        if all(run.summary.get("algorithm") == "centralized" for run in group):
            best = acc.max(axis=1).mean()  # data sent once, not per round: a reference, not a curve
            ax.axhline(best, color=styles[label]["color"], linestyle="--", linewidth=LINE_WIDTH,
                       label=f"{label}: best {best:.1f}% (data sent once)")
            continue
        x_mb, mb = _aligned(group, _cumulative_mb)
        # traffic up to and including each evaluated round
        _line_with_band(ax, mb[:, np.isin(x_mb, x_acc)].mean(axis=0), acc, styles[label], label, len(groups))
    ax.set(xlabel="cumulative traffic, all directions (MB)", ylabel="test accuracy (%)")
    _finish(ax, title, n_max, style)
    written.append(_save(fig, out_dir / "bytes", fmt, dpi))

    if any(_epsilon(run) for run in runs):
        written.append(_privacy_curve(groups, styles, title, n_max, style, out_dir))

    cmap = colormaps["viridis"].with_extremes(bad="lightgrey")
    used: set[str] = set()
    for label, group in groups.items():
        rounds, stack = _per_class_stack(group)
        if rounds.size == 0 or stack.shape[1] == 0:
            continue
        slug = _unique_slug(label, used)
        fig = Figure(figsize=style.size(7, 3.5), layout="constrained")
        ax = fig.add_subplot()
        image = ax.imshow(  # class 0 on top, as a table lists classes
            stack.T,
            aspect="auto",
            origin="upper",
            interpolation="nearest",
            cmap=cmap,
            vmin=0,
            vmax=100,
            extent=(rounds[0] - 0.5, rounds[-1] + 0.5, stack.shape[1] - 0.5, -0.5),
        )
        fig.colorbar(image, ax=ax, label="accuracy (%)")
        ax.set(xlabel="round", ylabel="class")
        if style.titles:  # the label on a line of its own, the experiment below it, both wrapped: nothing runs past
            width = _title_width(ax, style, 0.85)  # the colour bar takes the rest
            ax.set_title(_wrap(f"per-class accuracy: {label}", width) + (f"\n{_wrap(title, width)}" if title else ""),
                         fontsize="medium")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        names = group[0].summary.get("class_names")
        if isinstance(names, list) and len(names) == stack.shape[1]:
            ax.set_yticks(range(len(names)), [str(n) for n in names], fontsize="small" if len(names) <= 20 else 5)
        else:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        written.append(_save(fig, out_dir / f"per_class_{slug}", fmt, dpi))
    return written


def _privacy_curve(groups: dict[str, list[RunData]], styles: dict[str, dict[str, Any]], title: str, n_max: int,
                   style: FigureStyle, out_dir: Path) -> Path:
    """``privacy.png``: test accuracy against the epsilon spent so far (rounds evaluated in every seed), one curve
    per private label: the privacy-utility trade-off of ``[privacy]`` runs."""
    fig = Figure(figsize=style.size(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, group in groups.items():
        x_acc, acc = _aligned(group, _accuracy)
        x_eps, eps = _aligned(group, _epsilon)
        keep = np.isin(x_eps, x_acc)
        if x_acc.size and keep.any():
            shared = np.isin(x_acc, x_eps)
            _line_with_band(ax, eps[:, keep].mean(axis=0), acc[:, shared], styles[label], label, len(groups))
    ax.set(xlabel="epsilon spent (privacy.delta of each run)", ylabel="test accuracy (%)")
    _finish(ax, title, n_max, style)
    return _save(fig, out_dir / "privacy", style.format, style.dpi)


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


def synthetic_grids(runs: list[RunData], out_dir: Path, per_class: int = 10, fmt: str | None = None,
                    dpi: int | None = None, style: FigureStyle | None = None) -> list[Path]:
    """``synthetic_<label>.<fmt>``: the condensed images each run's clients sent in its last round.

    One row per class sent, named by the class (the dataset's class names where the run recorded them;
    a label-skewed federation may send fewer classes than it has), at most ``per_class`` images a row
    (the first ones sent), from the run's
    ``artifacts/synthetic/`` (FedDC, FedDC+, FedDM, FedAF and HFLDD save them); the papers' Fig. 7 view.
    The first seed of a label stands for it. Runs without synthetic data get no grid. ``fmt`` and ``dpi``
    (None: ``style``'s) and ``style``'s font size and titles apply (an image grid keeps its own size: one image
    pixel a few output pixels).
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from fedskew.condense.grids import labelled_grid_figure

    style = _style(style, fmt, dpi)
    fmt, dpi = style.format, style.dpi
    written: list[Path] = []
    used: set[str] = set()
    for label, group in group_runs(runs).items():
        files = synthetic_files(group[0].path)
        if not files:
            continue
        try:
            data = load_file(str(files[-1]))
            images, labels = data["images"], data["labels"]
        except (OSError, SafetensorError, KeyError) as e:
            raise FedskewError(f"cannot read synthetic images {files[-1]}: {e}") from None
        keep = torch.cat([torch.nonzero(labels == c).flatten()[:per_class] for c in torch.unique(labels)])
        slug = _unique_slug(label, used)
        names = group[0].summary.get("class_names")
        sent = files[-1].stem.rpartition("_")[2].lstrip("0") or "0"  # round_0030.safetensors: round 30
        scale = max(2, round(32 / int(images.shape[2])))  # about 32 pixels an image: 8x8 digits drawn 4x
        with style.context():
            fig = labelled_grid_figure(images[keep], labels[keep], names if isinstance(names, list) else None,
                                       title=style.title(_wrap(f"{label}: images sent in round {sent}", 60)),
                                       scale=scale)
            written.append(_save(fig, Path(out_dir) / f"synthetic_{slug}", fmt, dpi))
    return written
