"""Round callbacks: everything around a round that is not the round itself, one small file each.

A :class:`RoundCallback` is told when a run starts (:meth:`~RoundCallback.start`: open what it writes to,
before any client runs), when its records so far are known (:meth:`~RoundCallback.begin`: after setup or
a checkpoint's restore), after each round (:meth:`~RoundCallback.round_end`, with the round's record and
timing), of each artifact the method saves, and when the run ends, however it ends
(:meth:`~RoundCallback.close`). The standard ones (:func:`standard_callbacks`), in the order they run:
``metrics.jsonl`` and ``timing.jsonl`` (:mod:`.run_files`), checkpoints (:mod:`.checkpoints`),
TensorBoard (:mod:`.tensorboard`), W&B and MLflow (:mod:`.trackers`), ``environment.json``
(:mod:`.environment`), the progress bar (:mod:`.progress`) and the caller's ``on_round``
(:mod:`.on_round`). A run may add its own (``RoundLoop(..., callbacks=[...])``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fedskew.engine.round_loop import RoundLoop


Record = dict[str, Any]
"""One round's record, as a line of ``metrics.jsonl`` holds it."""


@dataclass(frozen=True)
class RoundTime:
    """When a round started (``time.perf_counter()``) and the seconds of its evaluation (wall-clock
    times: never in ``metrics.jsonl``)."""

    started: float
    eval_seconds: float


class RoundCallback:
    """A hook around the rounds of a run; every method does nothing unless overridden."""

    def start(self, loop: RoundLoop, resume: bool) -> None:
        """The run starts (afresh, or resuming from its checkpoint): open files, check they can be written."""

    def begin(self, loop: RoundLoop, records: list[dict[str, Any]]) -> None:
        """The records so far are known (none, or a checkpoint's); the first round comes next."""

    def round_end(self, loop: RoundLoop, record: Record, records: list[Record], time: RoundTime) -> None:
        """Round ``record["round"]`` is done; ``records`` holds it and every earlier one."""

    def artifact(self, name: str, rnd: int, tensors: dict[str, torch.Tensor]) -> None:
        """The method saved an artifact (condensed images ...) in round ``rnd``."""

    def close(self) -> None:
        """The run ended, finished or not: release what :meth:`start` opened."""


def standard_callbacks(progress: bool, on_round: Any = None) -> list[RoundCallback]:
    """The callbacks of every run, in order (``progress``: a bar; ``on_round``: called with each record)."""
    from fedskew.engine.callbacks.checkpoints import Checkpoints
    from fedskew.engine.callbacks.environment import Environment
    from fedskew.engine.callbacks.on_round import OnRound
    from fedskew.engine.callbacks.progress import ProgressBar
    from fedskew.engine.callbacks.run_files import MetricsFile, TimingFile
    from fedskew.engine.callbacks.tensorboard import TensorBoard
    from fedskew.engine.callbacks.trackers import Trackers

    callbacks: list[RoundCallback] = [
        TensorBoard(), Environment(), Trackers(), MetricsFile(), TimingFile(), Checkpoints(), ProgressBar(progress),
    ]
    if on_round is not None:
        callbacks.append(OnRound(on_round))
    return callbacks
