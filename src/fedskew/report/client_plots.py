"""Plots of the clients' own evaluation (``partition.client_test_fraction``): each client's accuracy with the
global model and with its own, per method (seeds pooled), beside the curves of :mod:`.plots`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedskew.core.figures import LINE_WIDTH, MARKER_SIZE, FigureStyle
from fedskew.report.plots import (
    _aligned,
    _mean_and_std,
    _save,
    _style,
    _title_width,
    _wrap,
    experiment_title,
    line_styles,
)
from fedskew.report.tables import group_runs
from fedskew.runs import RunData, is_number

CLIENT_VECTORS = (("client_accuracy", "global model"), ("personal_accuracy", "each client's own model"))
"""The per-client accuracy vectors of ``metrics.jsonl`` (partition.client_test_fraction) and what each measures."""


def _last_vector(run: RunData, key: str) -> list[float]:
    """The per-client accuracies (percent) of ``key`` in the run's last round that has them."""
    for r in reversed(run.records):
        if isinstance(r.get(key), list):
            return [float(a) * 100 for a in r[key] if is_number(a)]
    return []


def _own_label(group: list[RunData]) -> str:
    """A method's label with what it evaluates as a client's own model (the algorithm's ``own_model``), and how
    many of its clients had never trained when last evaluated."""
    from fedskew.algorithms.base import ALGORITHMS

    run = group[0]
    name = str(run.summary.get("algorithm", ""))
    own = getattr(ALGORITHMS.get(name), "own_model", "") if name in ALGORITHMS else ""
    epochs = run.recorded("eval.personalized_epochs", 0)
    if own and isinstance(epochs, int) and epochs > 0:
        own += f", fine-tuned {epochs} epoch{'s' if epochs > 1 else ''}"
    untrained = [r.get("untrained_clients") for run in group for r in run.records[-1:]]
    never = sum(int(u) for u in untrained if is_number(u))
    text = run.label + (f"\nown: {_wrap(own, 40)}" if own else "")
    return text + (f"\n{never} client{'s' if never != 1 else ''} never trained" if never else "")


def plot_clients(runs: list[RunData], out_dir: Path, fmt: str | None = None, dpi: int | None = None,
                 kinds: Mapping[str, tuple[str, str]] | None = None, style: FigureStyle | None = None) -> list[Path]:
    """Plots of the per-client evaluation, for runs that have one (none otherwise), as ``fmt`` files at ``dpi``
    (None: ``style``'s), in ``style``.

    ``client_accuracy.png``: the distribution of the clients' accuracies on their own test splits in the
    last evaluated round, one box per label (the clients of all its seeds pooled; the box spans the middle
    half, whiskers 1.5 IQR, the diamond is the mean), for the global model and for each client's own model.
    ``client_curves.png``: mean and worst-10% client accuracy of the clients' own models per round.
    """
    style = _style(style, fmt, dpi)
    with style.context():
        return _plot_clients(runs, Path(out_dir), style, kinds)


def _plot_clients(runs: list[RunData], out_dir: Path, style: FigureStyle,
                  kinds: Mapping[str, tuple[str, str]] | None) -> list[Path]:
    fmt, dpi = style.format, style.dpi
    groups = group_runs(runs)
    data = {key: {label: [a for run in group for a in _last_vector(run, key)] for label, group in groups.items()}
            for key, _ in CLIENT_VECTORS}
    labels = [label for label in groups if any(data[key][label] for key, _ in CLIENT_VECTORS)]
    if not labels:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One row per method (readable with a dozen), the global model's box and the own model's box side by side.
    fig = Figure(figsize=style.size(10, 1.2 + 0.55 * len(labels) * len(CLIENT_VECTORS)), layout="constrained")
    ax = fig.add_subplot()
    colours = {"client_accuracy": "#9ecae1", "personal_accuracy": "#fdae6b"}
    offsets = {"client_accuracy": 0.2, "personal_accuracy": -0.2}
    rows = list(range(len(labels), 0, -1))  # the first label on top
    for key, what in CLIENT_VECTORS:
        shown = [(row, data[key][label]) for row, label in zip(rows, labels, strict=True) if data[key][label]]
        if not shown:
            continue
        box = ax.boxplot([values for _, values in shown], positions=[row + offsets[key] for row, _ in shown],
                         orientation="horizontal", widths=0.34, showmeans=True, patch_artist=True,
                         meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black",
                                    "markersize": 5})
        for patch in box["boxes"]:
            patch.set_facecolor(colours[key])
        box["boxes"][0].set_label(what)
    ax.set_yticks(rows, [_own_label(groups[label]) for label in labels], fontsize="small")
    ax.set(xlabel="accuracy on the client's own test split (%)", xlim=(-2, 102))
    ax.grid(alpha=0.3, axis="x")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, fontsize="small", frameon=False)
    title = experiment_title(runs)
    if style.titles:
        fig.suptitle("per-client accuracy, last evaluated round (clients of all seeds)"
                     + (f"\n{_wrap(title, _title_width(ax, style))}" if title else ""), fontsize="medium")
    written = [_save(fig, out_dir / "client_accuracy", fmt, dpi)]

    styles = line_styles(list(groups), kinds)
    fig = Figure(figsize=style.size(10, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, group in groups.items():
        for stat, dashes in (("mean", "-"), ("worst10", "--")):
            x, stack = _aligned(group, lambda run, k=f"personal_accuracy_{stat}": {
                r["round"]: float(r[k]) * 100 for r in run.records if is_number(r.get(k))
            })
            if x.size:
                mean, _ = _mean_and_std(stack)
                which = "mean" if stat == "mean" else "worst 10%"
                ax.plot(x, mean, dashes, color=styles[label]["color"], marker=styles[label]["marker"],
                        markevery=max(1, len(x) // 10), markersize=MARKER_SIZE, linewidth=LINE_WIDTH,
                        label=f"{label}, {which}")
    ax.set(xlabel="round", ylabel="client accuracy, own model (%)")
    if style.titles:
        ax.set_title("clients' own models, mean over seeds"
                     + (f"\n{_wrap(title, _title_width(ax, style))}" if title else ""), fontsize="medium")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:  # below the axes, full width: a dozen methods' labels beside them squeezed the axes
        fig.legend(handles, labels, fontsize="small", loc="outside lower center", frameon=False,
                   ncols=max(1, min(len(handles), int(fig.get_figwidth() * 72 / (0.5 * style.font)
                                                      // (max(map(len, labels)) + 6)))))
    written.append(_save(fig, out_dir / "client_curves", fmt, dpi))
    return written
