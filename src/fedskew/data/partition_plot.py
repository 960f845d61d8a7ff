"""Bubble plot of a partition's per-client class counts.

The usual picture of label skew in FL papers: one column per client, one row per class, and a
circle whose area is the number of samples of that class the client holds. It shows at a glance
how many classes each client has and how unequal the client sizes are, which a table of 200
rows does not. Both plots are drawn in the report's style (:class:`fedskew.core.figures.FigureStyle`: fonts,
dpi, TrueType fonts in a PDF), class 0 on top as in the report's per-class heat maps.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedskew.core.figures import DEFAULT_STYLE, FigureStyle

__all__ = ["bubble_plot", "heatmap_plot", "partition_plot"]

_MAX_X_TICKS = 40
_MAX_Y_TICKS = 50
_MIN_BUBBLE_PT = 6.0  # smallest diameter (points) of the largest bubble, to stay visible
_MAX_BUBBLE_PT = 40.0


HEATMAP_CLIENTS = 100
"""From this many clients on, ``style="auto"`` draws a heat map: bubbles of neighbouring clients overlap."""


def partition_plot(
    counts: np.ndarray, path: Path, title: str = "", class_names: list[str] | None = None, style: str = "auto",
    look: FigureStyle | None = None,
) -> Path:
    """The partition as a bubble chart (``style="bubble"``) or a client x class heat map (``"heatmap"``);
    ``"auto"``: a heat map from :data:`HEATMAP_CLIENTS` clients on, bubbles below. ``look``: the figure style
    (default: the report's default)."""
    if style not in ("auto", "bubble", "heatmap"):
        raise ValueError(f"style {style!r}; allowed: auto, bubble, heatmap")
    if style == "heatmap" or (style == "auto" and np.asarray(counts).shape[0] >= HEATMAP_CLIENTS):
        return heatmap_plot(counts, path, title, class_names, look)
    return bubble_plot(counts, path, title, class_names, look)


def heatmap_plot(counts: np.ndarray, path: Path, title: str = "", class_names: list[str] | None = None,
                 look: FigureStyle | None = None) -> Path:
    """Draw ``counts`` as a class x client heat map (colour: samples, on a log scale; white: none), class 0 on
    top.

    Readable at hundreds of clients, where bubbles overlap. Same arguments as :func:`bubble_plot`.
    """
    look = look or DEFAULT_STYLE
    with look.context():
        return _heatmap(counts, Path(path), look.title(title), class_names, look)


def _heatmap(counts: np.ndarray, path: Path, title: str, class_names: list[str] | None, look: FigureStyle) -> Path:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    counts = _checked(counts, class_names)
    num_clients, num_classes = counts.shape
    width = min(max(6.0, 2.0 + 0.05 * num_clients), 20.0)
    height = min(max(3.0, 1.5 + 0.35 * num_classes), 14.0)
    fig = Figure(figsize=look.size(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    shown = np.ma.masked_equal(counts.T.astype(float), 0)
    image = ax.imshow(shown, aspect="auto", origin="upper", interpolation="nearest",
                      cmap=colormaps["viridis"].with_extremes(bad="white"), norm=LogNorm(vmin=1, vmax=counts.max()))
    fig.colorbar(image, ax=ax, label="samples (log scale; white: none)")
    y_ticks = np.arange(0, num_classes, math.ceil(num_classes / _MAX_Y_TICKS))
    ax.set_yticks(y_ticks)
    if class_names is not None:
        ax.set_yticklabels([class_names[i] for i in y_ticks])
    ax.set_xticks(np.arange(0, num_clients, math.ceil(num_clients / _MAX_X_TICKS)))
    ax.tick_params(axis="x", labelrotation=90 if num_clients > _MAX_X_TICKS // 2 else 0)
    ax.set(xlabel="client", ylabel="class")
    if title:
        ax.set_title(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=look.dpi, bbox_inches="tight", pad_inches=0.05)
    return path


def _checked(counts: np.ndarray, class_names: list[str] | None) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.size == 0 or counts.min() < 0 or counts.sum() == 0:
        raise ValueError("counts must be a non-empty 2-D array of non-negative counts with a positive sum")
    if class_names is not None and len(class_names) != counts.shape[1]:
        raise ValueError(f"{len(class_names)} class names for {counts.shape[1]} classes")
    return counts


def bubble_plot(counts: np.ndarray, path: Path, title: str = "", class_names: list[str] | None = None,
                look: FigureStyle | None = None) -> Path:
    """Draw ``counts`` as a client x class bubble chart (class 0 on top) and save it (PNG, or the format the
    suffix of ``path`` names).

    Parameters
    ----------
    counts
        ``(num_clients, num_classes)`` non-negative sample counts, e.g. from
        :meth:`fedskew.data.partition.Partition.class_counts`.
    path
        Output file; missing parent directories are created.
    title
        Figure title.
    class_names
        Labels for the class axis (default: the class indices).
    look
        The figure style (:class:`~fedskew.core.figures.FigureStyle`; default: the report's default): fonts,
        dpi, titles.

    Returns
    -------
    pathlib.Path
        ``path``, for chaining.

    Notes
    -----
    The figure grows with the number of clients and classes up to a fixed size; the biggest
    bubble fills about one grid cell but never shrinks below a few points, so bubbles of
    neighbouring clients may overlap with hundreds of clients rather than vanish. The area
    legend maps bubble sizes back to sample counts. Only the Agg canvas is used (no pyplot),
    so plotting works headless and leaves no open figure behind.
    """
    look = look or DEFAULT_STYLE
    with look.context():
        return _bubbles(counts, Path(path), look.title(title), class_names, look)


def _bubbles(counts: np.ndarray, path: Path, title: str, class_names: list[str] | None, look: FigureStyle) -> Path:
    counts = _checked(counts, class_names)
    num_clients, num_classes = counts.shape

    width = min(max(6.0, 2.0 + 0.12 * num_clients), 20.0)
    height = min(max(3.0, 1.5 + 0.4 * num_classes), 14.0)
    width, height = look.size(width, height)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    left, right, bottom, top = 0.08, 0.85, 0.12, 0.9
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top)
    ax = fig.add_subplot()

    # Largest bubble about one cell wide; matplotlib's marker size is an area in points^2.
    cell = min((right - left) * width * 72 / num_clients, (top - bottom) * height * 72 / num_classes)
    diameter = min(max(0.9 * cell, _MIN_BUBBLE_PT), _MAX_BUBBLE_PT)
    area_per_sample = diameter**2 / counts.max()
    client, cls = np.nonzero(counts)
    bubbles = ax.scatter(
        client,
        cls,
        s=counts[client, cls] * area_per_sample,
        alpha=0.6,
        edgecolors="black",
        linewidths=0.3,
    )
    handles, legend_labels = bubbles.legend_elements(
        prop="sizes", num=4, func=lambda s: s / area_per_sample, fmt="{x:.0f}", alpha=0.6
    )
    ax.legend(handles, legend_labels, title="samples", loc="upper left", bbox_to_anchor=(1.01, 1.0))

    ax.set_xticks(np.arange(0, num_clients, math.ceil(num_clients / _MAX_X_TICKS)))
    y_ticks = np.arange(0, num_classes, math.ceil(num_classes / _MAX_Y_TICKS))
    ax.set_yticks(y_ticks)
    if class_names is not None:
        ax.set_yticklabels([class_names[i] for i in y_ticks])
    ax.tick_params(axis="x", labelrotation=90 if num_clients > _MAX_X_TICKS // 2 else 0)
    ax.set_xlim(-0.5, num_clients - 0.5)
    ax.set_ylim(num_classes - 0.5, -0.5)  # class 0 on top
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title)

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=look.dpi, bbox_inches="tight", pad_inches=0.05)
    return path
