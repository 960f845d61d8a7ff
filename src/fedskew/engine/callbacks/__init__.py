"""Round callbacks: everything around a round that is not the round itself, one small file each.

A :class:`RoundCallback` is told when a run starts (:meth:`~RoundCallback.start`: open what it writes to,
before any client runs), when its records so far are known (:meth:`~RoundCallback.begin`: after setup or
a checkpoint's restore), after each round (:meth:`~RoundCallback.round_end`, with the round's record and
timing), of each artifact the method saves, when every round is done (:meth:`~RoundCallback.finish`, with the
run's summary) and when the run ends, however it ends (:meth:`~RoundCallback.close`). The standard ones
(:func:`standard_callbacks`), in the order they run: the artifacts' files (:mod:`.run_files`), TensorBoard
(:mod:`.tensorboard`), ``environment.json`` (:mod:`.environment`), W&B and MLflow (:mod:`.trackers`),
``metrics.jsonl`` and ``timing.jsonl`` (:mod:`.run_files`), checkpoints (:mod:`.checkpoints`), the progress bar
(:mod:`.progress`), ``model.pt`` and ``summary.json`` (:mod:`.run_files`), and the caller's ``on_round``
(:mod:`.on_round`). A run may add its own (``RoundLoop(..., callbacks=[...])``).
"""

from __future__ import annotations

from collections.abc import Callable

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.engine.callbacks.checkpoints import Checkpoints
from fedskew.engine.callbacks.environment import Environment
from fedskew.engine.callbacks.on_round import OnRound
from fedskew.engine.callbacks.progress import ProgressBar
from fedskew.engine.callbacks.run_files import ArtifactFiles, FinalFiles, MetricsFile, TimingFile
from fedskew.engine.callbacks.tensorboard import TensorBoard
from fedskew.engine.callbacks.trackers import Trackers

__all__ = ["Loop", "Record", "RoundCallback", "RoundTime", "standard_callbacks"]


def standard_callbacks(progress: bool, on_round: Callable[[Record], None] | None = None) -> list[RoundCallback]:
    """The callbacks of every run, in order (``progress``: a bar; ``on_round``: called with each record)."""
    callbacks: list[RoundCallback] = [
        ArtifactFiles(), TensorBoard(), Environment(), Trackers(), MetricsFile(), TimingFile(), Checkpoints(),
        ProgressBar(progress), FinalFiles(),
    ]
    if on_round is not None:
        callbacks.append(OnRound(on_round))
    return callbacks
