"""Dataset files in their official release formats, made by the tests (no download)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np


def idx_bytes(arr: np.ndarray) -> bytes:
    """An IDX file: 0x0000, type 0x08 (ubyte), ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def write_idx_release(folder: Path, n_train: int, n_test: int, *, gz_train: bool, gz_test: bool) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    folder.mkdir(parents=True)
    for stem, arr in arrays.items():
        data = idx_bytes(arr)
        if (gz_train and stem.startswith("train")) or (gz_test and stem.startswith("t10k")):
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)
    return arrays
