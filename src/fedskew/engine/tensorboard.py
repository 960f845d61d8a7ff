"""TensorBoard event files of a run (``[logging] tensorboard = true``, the ``fedskew[tensorboard]`` extra).

The round loop hands every round's record and every saved artifact to a :class:`TensorBoardLog`; with
TensorBoard off it does nothing. The logs go to ``<run folder>/tensorboard/`` and are written beside the
run's own files, which never change with them (``metrics.jsonl`` is the same with TensorBoard on or off):

- each numeric value of a round's record as a scalar at step = round, grouped by section
  (:func:`tensorboard_tag`): ``eval/`` (accuracy, loss, class variance, per-client summaries), ``comm/``
  (the bytes), ``clients/`` (samples, and how many clients took part, failed or were rejected),
  ``privacy/`` (epsilon and the adaptive clip of a private run) and ``algorithm/`` (an algorithm's own figures);
- the run's settings in TensorBoard's hyper-parameters view (``HPARAMS``), beside ``eval/accuracy`` and
  ``eval/loss``;
- the per-class accuracies as ``per_class/<class name>`` (a class the test set lacks has none);
- the ``images`` of an artifact (the synthetic sets of the condensation methods) as an image grid
  ``images/<artifact name>``, one row per class.

A resumed run appends: its first event purges (``purge_step``) whatever the crashed run logged for
the rounds being done again, so TensorBoard shows every round once. A run started afresh first
removes the event files of an earlier run in its folder.
"""

from __future__ import annotations

import math
import os
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedskew.condense.grids import image_grid as tile
from fedskew.config.schema import RunConfig, full_config
from fedskew.core.files import write_atomic

TENSORBOARD_DIR = "tensorboard"
"""The folder of the event files inside a run folder."""
EVENT_FILES = "events.out.tfevents.*"
"""What TensorBoard's event files are called."""
GRID_LIMIT = 400
"""The most images one grid shows (a row per class, so each class gets ``GRID_LIMIT // classes``)."""
GRID_MIN_SIDE = 32
"""Smaller images are magnified (nearest neighbour) to about this many pixels a side, so 8x8 digits are legible."""


def image_grid(images: torch.Tensor, labels: torch.Tensor | None = None, limit: int = GRID_LIMIT,
               pad: int = 1) -> np.ndarray:
    """Tile uint8 ``(N, C, H, W)`` images into one ``(H', W', C)`` uint8 array on a white ground.

    With ``labels`` each class (in increasing order) gets a row of at most ``limit // classes`` of its
    images; without, up to ``limit`` images fill a square. Images smaller than :data:`GRID_MIN_SIDE`
    are magnified by a whole factor. The tiling is :func:`fedskew.condense.grids.image_grid`'s.
    """
    if labels is not None:
        classes = labels.unique()[:limit]
        per_row = max(1, limit // len(classes))
        keep = torch.cat([torch.nonzero(labels == k).flatten()[:per_row] for k in classes])
        images, labels = images[keep], labels[keep]
    else:
        images = images[:limit]
        labels = torch.arange(len(images)) // max(1, math.ceil(math.sqrt(len(images))))  # square rows
    zoom = max(1, GRID_MIN_SIDE // max(images.shape[2], images.shape[3]))
    return tile(images, labels, pad=pad, scale=zoom)


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread prints its own traceback when a write fails (a disk that fills mid-run),
    and the run then reports the same ``OSError`` in one line from the main thread: keep only that line."""
    previous = threading.excepthook
    if getattr(previous, "fedskew_tensorboard", False):
        return

    def hook(args: Any) -> None:
        frames = traceback.extract_tb(args.exc_traceback)
        if isinstance(args.exc_value, OSError) and any(f"{os.sep}tensorboard{os.sep}" in f.filename for f in frames):
            return
        previous(args)

    hook.fedskew_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


GROUPS = (("eval/", ("accuracy", "loss", "class_variance", "client_", "personal_")), ("comm/", ("bytes_",)),
          ("clients/", ("samples", "clients", "failed", "rejected", "untrained_clients")),
          ("privacy/", ("epsilon", "epsilon_", "privacy_")))
"""TensorBoard sections by record key prefix: evaluation, communication, participation, differential privacy
(``epsilon``, ``epsilon_max``, ``privacy_clip``); an algorithm's own figures go under ``algorithm/`` and the
per-class accuracies under ``per_class/``."""
COUNTED = {"clients": "clients/took_part", "failed": "clients/failed", "rejected": "clients/rejected"}
"""Lists of a record logged as how many they hold."""
HPARAM_METRICS = ("eval/accuracy", "eval/loss")
"""The scalars TensorBoard's hyper-parameters view shows beside each run's settings."""


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a record key: ``accuracy`` -> ``eval/accuracy``, ``bytes_server_to_client`` ->
    ``comm/bytes_server_to_client``, ``samples`` -> ``clients/samples``, ``server_loss`` ->
    ``algorithm/server_loss``."""
    for group, prefixes in GROUPS:
        if any(key == p or (p.endswith("_") and key.startswith(p)) for p in prefixes):
            return group + key
    return "algorithm/" + key


def grouped_scalars(rec: dict[str, Any], class_names: Sequence[str] = ()) -> dict[str, float]:
    """A round record's numbers under their grouped names (:func:`tensorboard_tag`), the lists of :data:`COUNTED`
    as how many they hold, and the per-class accuracies as ``per_class/<class name>`` (the class's index where
    ``class_names`` does not fit; a class the test set lacks has none): what TensorBoard and the trackers log."""
    out: dict[str, float] = {}
    for key, value in rec.items():
        if key != "round" and isinstance(value, int | float) and not isinstance(value, bool):
            out[tensorboard_tag(key)] = float(value)
        elif key in COUNTED and isinstance(value, list):
            out[COUNTED[key]] = float(len(value))
    per_class = rec.get("per_class_accuracy") or []
    names = list(class_names) if len(class_names) == len(per_class) else [str(k) for k in range(len(per_class))]
    for name, acc in zip(names, per_class, strict=True):
        if acc is not None:
            out[f"per_class/{name}"] = float(acc)
    return out


def hyperparameters(config: RunConfig) -> dict[str, Any]:
    """The single values of a run's config (dotted keys, every default filled in: the run's ``config.toml``), as
    TensorBoard's hyper-parameters view and the trackers take them."""
    out: dict[str, Any] = {}

    def walk(table: dict[str, Any], prefix: str) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, bool | int | float | str) and key not in ("plugins", "description"):
                out[prefix + key] = value

    walk(full_config(config), "")
    return out


class TensorBoardLog:
    """The TensorBoard log of one run: off (``folder`` None), or event files in ``folder``.

    Parameters
    ----------
    folder
        Where the event files go; None: TensorBoard is off and every method does nothing.
    class_names
        The federation's class names, for the per-class tags (``per_class/<name>``).
    resume
        The run continues from a checkpoint: its first event purges the steps from there on that an
        earlier writer logged. Otherwise the event files already in ``folder`` are removed.
    """

    def __init__(self, folder: Path | None, class_names: Sequence[str] = (), *, resume: bool = False,
                 hparams: dict[str, Any] | None = None) -> None:
        self.folder = folder
        self.hparams = hparams or {}
        self.class_names = [str(c) for c in class_names]
        self._resume = resume
        self._writer: Any = None  # a SummaryWriter, made at the first event (its purge step is that event's)

    @classmethod
    def for_run(cls, config: RunConfig, run_dir: Path, class_names: Sequence[str], resume: bool) -> TensorBoardLog:
        """The log the run's ``[logging]`` table asks for, with the run's config as its hyper-parameters view.

        A run started afresh leaves no event files of an earlier run in its folder, whether or not it
        logs itself.
        """
        folder = Path(run_dir) / TENSORBOARD_DIR
        if not resume:
            for old in folder.glob(EVENT_FILES):
                old.unlink()
        params = config.logging
        if params.tensorboard:  # a folder it cannot write to is one line now, not a writer thread's traceback later
            folder.mkdir(parents=True, exist_ok=True)
            probe = write_atomic(folder / ".fedskew-write-test", b"", sync=False)
            probe.unlink()
        return cls(folder if params.tensorboard else None, class_names, resume=resume, hparams=hyperparameters(config))

    def _at(self, step: int) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_threads()

            self._writer = SummaryWriter(str(self.folder), purge_step=step if self._resume else None)
            if self.hparams and not self._resume:  # the run's settings, for the hyper-parameters view
                from torch.utils.tensorboard.summary import hparams

                for summary in hparams(self.hparams, dict.fromkeys(HPARAM_METRICS, 0.0)):
                    self._writer.file_writer.add_summary(summary)
        return self._writer

    def record(self, rec: dict[str, Any]) -> None:
        """Log one round's record (as ``metrics.jsonl`` holds it) at step ``rec["round"]``."""
        if self.folder is None:
            return
        step = int(rec["round"])
        writer = self._at(step)
        for tag, value in grouped_scalars(rec, self.class_names).items():
            writer.add_scalar(tag, value, step)
        writer.flush()

    def artifact(self, name: str, step: int, tensors: dict[str, torch.Tensor]) -> None:
        """Log an artifact's ``images`` (uint8 ``(N, 1 or 3, H, W)``) as the grid ``images/<name>``; other
        artifacts, and empty ones, are not logged."""
        images = tensors.get("images")
        if self.folder is None or images is None or images.dtype != torch.uint8:
            return
        if images.dim() != 4 or images.shape[1] not in (1, 3) or images.shape[0] == 0:
            return
        labels = tensors.get("labels")
        if labels is not None and tuple(labels.shape) != (images.shape[0],):
            labels = None
        grid = image_grid(images.detach().cpu(), None if labels is None else labels.detach().cpu())
        writer = self._at(step)
        writer.add_image(f"images/{name}", grid, step, dataformats="HWC")
        writer.flush()

    def close(self) -> None:
        """Flush and close the event file (the log may be written to again: a new file is opened)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._resume = False
