"""Image grids of condensed (synthetic) sets.

Condensation-based methods upload 8-bit images; FedDC's privacy argument rests on what they look
like (Kim & Choi 2022, Fig. 7: FedDC+ images are unrecognisable noise). The algorithms keep the last
round's images in their checkpointed server state (``syn_images`` / ``syn_labels``), and
:func:`save_image_grid` draws them: one row per class, so a reader can judge them at a glance. The
report, ``fedskew condense`` and the TensorBoard log all draw with :func:`image_grid`; the report and
``fedskew condense`` name each row by its class (:func:`labelled_grid_figure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedskew.core.errors import DataError

if TYPE_CHECKING:  # matplotlib and PIL are imported where a figure or a file is made: a run that logs to
    from matplotlib.figure import Figure  # TensorBoard tiles images with image_grid and needs neither


def image_grid(images: torch.Tensor, labels: torch.Tensor, pad: int = 2, scale: int = 1) -> np.ndarray:
    """Arrange uint8 images in a grid, one row per class (increasing label), as an (H, W, C) array.

    Parameters
    ----------
    images
        uint8 (N, C, H, W) with C = 1 (grey) or 3 (RGB).
    labels
        (N,) integer labels.
    pad
        White pixels between and around the images.
    scale
        Integer magnification (nearest neighbour), so 28x28 images stay legible.
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] not in (1, 3):
        raise DataError(f"expected uint8 images (N, 1 or 3, H, W), got {tuple(images.shape)} {images.dtype}")
    if labels.shape != (images.shape[0],) or images.shape[0] == 0:
        raise DataError(f"expected {images.shape[0]} > 0 labels, got shape {tuple(labels.shape)}")
    if pad < 0 or scale < 1:
        raise DataError(f"need pad >= 0 and scale >= 1, got {pad} and {scale}")
    pics = images.permute(0, 2, 3, 1).numpy()
    if scale > 1:
        pics = pics.repeat(scale, axis=1).repeat(scale, axis=2)
    _, h, w, c = pics.shape
    classes = sorted(set(labels.tolist()))
    rows = [np.nonzero(labels.numpy() == k)[0] for k in classes]
    cols = max(len(r) for r in rows)
    grid = np.full((pad + len(rows) * (h + pad), pad + cols * (w + pad), c), 255, dtype=np.uint8)
    for i, idx in enumerate(rows):
        for j, n in enumerate(idx):
            top, left = pad + i * (h + pad), pad + j * (w + pad)
            grid[top : top + h, left : left + w] = pics[n]
    return grid


def save_image_grid(images: torch.Tensor, labels: torch.Tensor, path: str | Path, scale: int = 2) -> Path:
    """Write :func:`image_grid` of ``images`` as a PNG at ``path`` (parent folders are created)."""
    from PIL import Image

    grid = image_grid(images, labels, scale=scale)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[:, :, 0] if grid.shape[2] == 1 else grid).save(out, format="PNG")
    return out


def labelled_grid_figure(images: torch.Tensor, labels: torch.Tensor, class_names: Sequence[str] | None = None,
                         title: str = "", scale: int = 2) -> Figure:
    """:func:`image_grid` as a matplotlib figure with each row named: the class name (``class k`` where
    ``class_names`` does not cover it), so a grid of 8 rows for 10 classes says which 8 they are.

    The figure is sized so that each image pixel takes about ``scale`` output pixels at 100 dpi (plus the
    margin for the names and the title); save it with :func:`save_figure` or ``Figure.savefig``.
    """
    from matplotlib.figure import Figure

    grid = image_grid(images, labels, pad=2, scale=1)
    classes = sorted(set(labels.tolist()))
    h = int(images.shape[2])
    names = [str(class_names[k]) if class_names is not None and 0 <= k < len(class_names) else f"class {k}"
             for k in classes]
    margin_in = 0.12 + 0.075 * max(len(n) for n in names)  # room for the longest name (small font)
    width_in = max(grid.shape[1] * scale / 100, 1.5) + margin_in
    height_in = max(grid.shape[0] * scale / 100, 1.0) + (0.45 if title else 0.1)
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(grid[:, :, 0] if grid.shape[2] == 1 else grid, cmap="gray" if grid.shape[2] == 1 else None,
              vmin=0, vmax=255, interpolation="nearest")
    ax.set_yticks([2 + i * (h + 2) + (h - 1) / 2 for i in range(len(classes))], names, fontsize="small")
    ax.set_xticks([])
    ax.tick_params(axis="y", length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    if title:
        ax.set_title(title, fontsize="small")
    return fig


def save_figure(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write ``fig`` to ``path`` in the format its suffix names (png, pdf, svg) with a tight bounding box:
    nothing a title, a label or a colour bar holds is clipped."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, bbox_inches="tight", pad_inches=0.05)
    return out
