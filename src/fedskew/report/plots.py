"""Plots of finished runs: curves per label (seeds as mean +- std), per-class heat maps, synthetic image grids."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedskew.core.errors import FedskewError
from fedskew.report.tables import DIRECTIONS, MB, group_runs
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


BAND = "shaded: mean ± 1 sample std over seeds"


DATASET_TITLES = {
    "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "cifar10_jpeg": "CIFAR-10 (JPEG)", "digits": "digits",
    "domainnet": "DomainNet", "fashion_mnist": "Fashion-MNIST", "mnist": "MNIST", "tiny_imagenet": "Tiny ImageNet",
}
"""How plot titles name the built-in datasets (others, plug-ins' among them, by their registered name)."""


def experiment_title(runs: list[RunData]) -> str:
    """What the runs were run on, for plot titles: the dataset and the partition with its parameters
    (those all runs share; "several datasets" etc. where they differ)."""
    def common(table: str) -> dict[str, Any] | None:
        tables = [{k: v for k, v in (run.config.get(table) or {}).items() if k != "data_dir"} for run in runs]
        return tables[0] if tables and all(t == tables[0] for t in tables) else None

    dataset, part = common("dataset"), common("partition")
    if not runs or not runs[0].config:
        return ""
    data = DATASET_TITLES.get(str(dataset.get("name")), str(dataset.get("name"))) if dataset else "several datasets"
    if dataset and dataset.get("train_fraction", 1.0) != 1.0:
        data += f" ({100 * float(dataset['train_fraction']):g}% of the training set)"
    if part is None:
        return f"{data}, several partitions"
    params = ", ".join(f"{k}={v}" for k, v in part.items() if k not in ("name", "seed", "num_clients"))
    clients = f", {part['num_clients']} clients" if part.get("num_clients") is not None else ""
    return f"{data}, {part.get('name')}" + (f" ({params})" if params else "") + clients


def _finish(ax: Axes, title: str, n_max: int) -> None:
    """Grid, legend (saying what the band is when some label has several seeds) and title."""
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", title=BAND if n_max > 1 else None, title_fontsize="x-small")
    if title:
        ax.set_title(title, fontsize="medium")


def plot_curves(runs: list[RunData], out_dir: Path) -> list[Path]:
    """Write the comparison plots into ``out_dir``.

    Writes ``accuracy.png`` (test accuracy per round), ``class_variance.png`` (per-round class
    variance), ``bytes.png`` (accuracy against cumulative traffic in all directions, the fair axis
    when methods send different amounts per round; centralised training, which sends its data once,
    is a horizontal line at its best accuracy) and, for each label with per-class accuracies,
    ``per_class_<label>.png`` (a classes x rounds heatmap, classes by name, that shows which classes a
    method forgets from round to round). Seeds are drawn as their mean with a +-1 std band, which the
    legend says. Titles name the dataset and the partition.

    Figures are built with the object-oriented Agg API (no pyplot), so no global backend or figure
    registry is touched and nothing is left open.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    colors = colormaps["tab10"]
    title = experiment_title(runs)
    n_max = max((len(g) for g in groups.values()), default=1)
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
            if x.size:
                _line_with_band(ax, x, stack, colors(i % 10), label)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _finish(ax, title, n_max)
        written.append(_save(fig, out_dir / name))

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, group) in enumerate(groups.items()):
        x_acc, acc = _aligned(group, _accuracy)
        if not x_acc.size:
            continue
        if all(run.summary.get("algorithm") == "centralized" for run in group):
            best = acc.max(axis=1).mean()  # data sent once, not per round: a reference, not a curve
            ax.axhline(best, color=colors(i % 10), linestyle="--", linewidth=1,
                       label=f"{label}: best {best:.1f}% (data sent once)")
            continue
        x_mb, mb = _aligned(group, _cumulative_mb)
        # traffic up to and including each evaluated round
        _line_with_band(ax, mb[:, np.isin(x_mb, x_acc)].mean(axis=0), acc, colors(i % 10), label)
    ax.set(xlabel="cumulative traffic, all directions (MB)", ylabel="test accuracy (%)")
    _finish(ax, title, n_max)
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
        ax.set(xlabel="round", ylabel="class", title=f"per-class accuracy: {label}" + (f" ({title})" if title else ""))
        ax.title.set_fontsize("medium")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        names = group[0].summary.get("class_names")
        if isinstance(names, list) and len(names) == stack.shape[1]:
            ax.set_yticks(range(len(names)), [str(n) for n in names], fontsize="small" if len(names) <= 20 else 5)
        else:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        written.append(_save(fig, out_dir / f"per_class_{slug}.png"))
    return written


CLIENT_VECTORS = (("client_accuracy", "global model"), ("personal_accuracy", "each client's own model"))
"""The per-client accuracy vectors of ``metrics.jsonl`` (partition.client_test_fraction) and what each measures."""


def _last_vector(run: RunData, key: str) -> list[float]:
    """The per-client accuracies (percent) of ``key`` in the run's last round that has them."""
    for r in reversed(run.records):
        if isinstance(r.get(key), list):
            return [float(a) * 100 for a in r[key] if is_number(a)]
    return []


def plot_clients(runs: list[RunData], out_dir: Path) -> list[Path]:
    """Plots of the per-client evaluation, for runs that have one (none otherwise).

    ``client_accuracy.png``: the distribution of the clients' accuracies on their own test splits in the
    last evaluated round, one box per label (the clients of all its seeds pooled; the box spans the middle
    half, whiskers 1.5 IQR, the diamond is the mean), for the global model and for each client's own model.
    ``client_curves.png``: mean and worst-10% client accuracy of the clients' own models per round.
    """
    groups = group_runs(runs)
    panels = [
        (key, what, {label: [a for run in group for a in _last_vector(run, key)] for label, group in groups.items()})
        for key, what in CLIENT_VECTORS
    ]
    panels = [(key, what, data) for key, what, data in panels if any(data.values())]
    if not panels:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(max(5.0, 1.1 * len(groups) * len(panels) + 2), 4.5), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (_, what, data) in zip(axes, panels, strict=True):
        labels = [label for label, values in data.items() if values]
        ax.boxplot([data[label] for label in labels], showmeans=True, widths=0.6,
                   meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black"})
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right")
        ax.set(title=what, ylim=(-2, 102))
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("accuracy on the client's own test split (%)")
    title = experiment_title(runs)
    fig.suptitle("per-client accuracy, last evaluated round (clients of all seeds)" + (f"\n{title}" if title else ""),
                 fontsize="medium")
    written = [_save(fig, out_dir / "client_accuracy.png")]

    colors = colormaps["tab10"]
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, group) in enumerate(groups.items()):
        for stat, style in (("mean", "-"), ("worst10", "--")):
            x, stack = _aligned(group, lambda run, k=f"personal_accuracy_{stat}": {
                r["round"]: float(r[k]) * 100 for r in run.records if is_number(r.get(k))
            })
            if x.size:
                mean, _ = _mean_and_std(stack)
                which = "mean" if stat == "mean" else "worst 10%"
                ax.plot(x, mean, style, color=colors(i % 10), label=f"{label}, {which}")
    ax.set(xlabel="round", ylabel="client accuracy, own model (%)",
           title="clients' own models, mean over seeds" + (f"\n{title}" if title else ""))
    ax.title.set_fontsize("medium")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    written.append(_save(fig, out_dir / "client_curves.png"))
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


def synthetic_grids(runs: list[RunData], out_dir: Path, per_class: int = 10) -> list[Path]:
    """``synthetic_<label>.png``: the condensed images each run's clients sent in its last round.

    One row per class, at most ``per_class`` images a row (the first ones sent), from the run's
    ``artifacts/synthetic/`` (FedDC, FedDC+, FedDM, FedAF and HFLDD save them); the papers' Fig. 7 view.
    The first seed of a label stands for it. Runs without synthetic data get no grid.
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from fedskew.condense.grids import save_image_grid

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
        written.append(save_image_grid(images[keep], labels[keep], out_dir / f"synthetic_{slug}.png"))
    return written
