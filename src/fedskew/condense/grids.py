"""Image grids of condensed (synthetic) sets.

Condensation-based methods upload 8-bit images; FedDC's privacy argument rests on what they look
like (Kim & Choi 2022, Fig. 7: FedDC+ images are unrecognisable noise). The algorithms keep the last
round's images in their checkpointed server state (``syn_images`` / ``syn_labels``), and
:func:`save_image_grid` draws them: one row per class, so a reader can judge them at a glance. The
report, ``fedskew condense`` and the TensorBoard log all draw with :func:`image_grid`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedskew.core.errors import DataError


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
    grid = image_grid(images, labels, scale=scale)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[:, :, 0] if grid.shape[2] == 1 else grid).save(out, format="PNG")
    return out
