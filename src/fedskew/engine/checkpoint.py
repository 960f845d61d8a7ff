"""Atomic checkpoints: a run killed at any moment can be resumed from its last checkpoint.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed over the
old one, so the folder always holds one complete checkpoint; a write that fails (a full disk) removes
its temporary file and leaves the last checkpoint as it was. Loading uses ``weights_only=True``: a
checkpoint is never unpickled as arbitrary Python objects, and :func:`load_checkpoint` checks its
layout. A checkpoint also keeps the text of the run's ``config.toml`` as it was when the checkpoint was
written, so that :func:`check_resume` can refuse a config edited since.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedskew.config.resume import same_run, tables_of
from fedskew.config.schema import RESUMABLE
from fedskew.core.errors import FedskewError
from fedskew.core.files import torch_bytes, write_atomic
from fedskew.runs import CHECKPOINT_FILE, CONFIG_FILE

REQUIRED: dict[str, type] = {
    "round": int, "model": dict, "server_state": dict, "client_states": dict, "ledger": dict, "records": str,
}
"""The entries of a checkpoint and their types (``records``: the metrics so far, as JSON text)."""

CONFIG_KEY = "config"
"""The entry holding the run's ``config.toml`` text (absent in checkpoints of runs without one)."""


def save_checkpoint(folder: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as ``folder/last.pt`` atomically, adding the run's config text (``folder/../config.toml``)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder.parent / CONFIG_FILE
    if CONFIG_KEY not in payload and config.is_file():
        payload = {**payload, CONFIG_KEY: config.read_text(encoding="utf-8")}
    final = folder / CHECKPOINT_FILE
    write_atomic(final, torch_bytes(payload))  # a failed write is an OSError; last.pt stays as it was
    return final


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """Read ``folder/last.pt`` and check its layout; any problem is a :class:`FedskewError` of one line.

    Checked: the entries of :data:`REQUIRED` and their types, a round >= 0, a model of tensors, and
    records that are JSON holding exactly rounds ``1 ... round``.
    """
    path = folder / CHECKPOINT_FILE
    if not path.exists():
        raise FedskewError(f"no checkpoint at {path}: nothing to resume (the run stopped before its first checkpoint)")
    try:
        ck = torch.load(path, weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise FedskewError(f"cannot read checkpoint {path}: {_first_line(e)}") from None
    if not isinstance(ck, dict):
        raise FedskewError(f"{path} is not a fedskew checkpoint (it holds a {type(ck).__name__}, not a table)")
    missing = [k for k in REQUIRED if k not in ck]
    if missing:
        raise FedskewError(f"checkpoint {path} lacks {', '.join(missing)}: it is damaged or not a fedskew checkpoint")
    for key, kind in REQUIRED.items():
        if not isinstance(ck[key], kind) or isinstance(ck[key], bool):
            raise FedskewError(f"checkpoint {path}: {key} must be a {kind.__name__}, found {type(ck[key]).__name__}")
    if ck["round"] < 0:
        raise FedskewError(f"checkpoint {path}: round must be >= 0, found {ck['round']}")
    bad = [k for k, v in ck["model"].items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise FedskewError(f"checkpoint {path}: model entry {bad[0]!r} is not a tensor")
    try:
        records = json.loads(ck["records"])
    except json.JSONDecodeError as e:
        raise FedskewError(f"checkpoint {path}: its records are not valid JSON ({e})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and type(r.get("round")) is int for r in records):
        raise FedskewError(f"checkpoint {path}: its records are not a list of round records")
    rounds = [r["round"] for r in records]
    if rounds != list(range(1, ck["round"] + 1)):
        raise FedskewError(
            f"checkpoint {path} is at round {ck['round']} but its records hold rounds {_span(rounds)}: "
            "it is damaged or was edited"
        )
    return ck


def check_resume(
    ck: Mapping[str, Any], path: Path, config: Mapping[str, Any], rounds: int,
    model: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Refuse to resume from checkpoint ``ck`` (read from ``path``) what would mix or lose results.

    Parameters
    ----------
    ck
        A checkpoint from :func:`load_checkpoint`.
    path
        Its file, for the messages.
    config
        The run's config as its folder holds it now (before a resume's overrides).
    rounds
        The rounds the resumed run will have (the config's, or a resume override's).
    model
        The state dict of the model the run builds; the checkpoint's must have its keys and shapes (None:
        not checked).
    """
    done = int(ck["round"])
    if done > rounds:
        raise FedskewError(
            f"{path} is at round {done}, beyond the run's rounds = {rounds}: a resume may only continue or extend "
            f"a run (give rounds >= {done}), and never shortens one"
        )
    if isinstance(ck.get(CONFIG_KEY), str):
        try:
            then = tomllib.loads(ck[CONFIG_KEY])
        except tomllib.TOMLDecodeError:
            raise FedskewError(f"checkpoint {path}: the config it keeps is not valid TOML") from None
        changed = tables_of(same_run(then, config))
        if changed:
            raise FedskewError(
                f"{path.parent.parent / CONFIG_FILE} was edited after the checkpoint of round {done} (changed: "
                f"{', '.join(changed)}); restore it to resume, or start a new run (a resume may change only "
                f"{', '.join(RESUMABLE)})"
            )
    if model is None:
        return
    saved = ck["model"]
    for key, tensor in model.items():
        if key not in saved:
            raise FedskewError(f"checkpoint {path} does not fit this run's model: it lacks {key!r}")
        if tuple(saved[key].shape) != tuple(tensor.shape):
            raise FedskewError(
                f"checkpoint {path} does not fit this run's model: {key!r} has shape {tuple(saved[key].shape)}, "
                f"the model {tuple(tensor.shape)}"
            )
    extra = sorted(set(saved) - set(model))
    if extra:
        raise FedskewError(f"checkpoint {path} does not fit this run's model: it has {extra[0]!r}, the model does not")


def _span(rounds: list[int]) -> str:
    if not rounds:
        return "none"
    return f"{rounds[0]} ... {rounds[-1]} ({len(rounds)} records)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
