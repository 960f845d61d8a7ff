"""Bubble plot of a partition's per-client class counts.

The usual picture of label skew in FL papers: one column per client, one row per class, and a
circle whose area is the number of samples of that class the client holds. It shows at a glance
how many classes each client has and how unequal the client sizes are, which a table of 200
rows does not.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["bubble_plot"]

_MAX_X_TICKS = 40
_MAX_Y_TICKS = 50
_MIN_BUBBLE_PT = 6.0  # smallest diameter (points) of the largest bubble, to stay visible
_MAX_BUBBLE_PT = 40.0


def bubble_plot(counts: np.ndarray, path: Path, title: str = "", class_names: list[str] | None = None) -> Path:
    """Draw ``counts`` as a client x class bubble chart and save it as a PNG.

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
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.size == 0 or counts.min() < 0 or counts.sum() == 0:
        raise ValueError("counts must be a non-empty 2-D array of non-negative counts with a positive sum")
    num_clients, num_classes = counts.shape
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for {num_classes} classes")

    width = min(max(6.0, 2.0 + 0.12 * num_clients), 20.0)
    height = min(max(3.0, 1.5 + 0.4 * num_classes), 14.0)
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
    ax.set_ylim(-0.5, num_classes - 0.5)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    return path
