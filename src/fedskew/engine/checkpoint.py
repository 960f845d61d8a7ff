"""Atomic checkpoints: a run killed at any moment can be resumed from its last checkpoint.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed over the
old one, so the folder always holds one complete checkpoint. Loading uses ``weights_only=True``: a
checkpoint is never unpickled as arbitrary Python objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from fedskew.core.errors import FedskewError
from fedskew.runs import CHECKPOINT_FILE


def save_checkpoint(folder: Path, payload: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / CHECKPOINT_FILE
    tmp = folder / (CHECKPOINT_FILE + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def load_checkpoint(folder: Path) -> dict[str, Any]:
    path = folder / CHECKPOINT_FILE
    if not path.exists():
        raise FedskewError(f"no checkpoint at {path}: nothing to resume (the run stopped before its first checkpoint)")
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise FedskewError(f"cannot read checkpoint {path}: {e}") from None
