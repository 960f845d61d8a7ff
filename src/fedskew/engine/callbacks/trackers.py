"""Weights & Biases and MLflow (``[logging] wandb`` / ``mlflow``): every round's record
(:mod:`fedskew.engine.trackers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedskew.engine.callbacks import Record, RoundCallback, RoundTime
from fedskew.engine.trackers import Tracker, open_trackers

if TYPE_CHECKING:
    from fedskew.engine.round_loop import RoundLoop


class Trackers(RoundCallback):
    """The trackers the run's ``[logging]`` asks for, started with the run and closed with it."""

    def __init__(self) -> None:
        self.trackers: list[Tracker] = []

    def start(self, loop: RoundLoop, resume: bool) -> None:
        self.trackers = open_trackers(loop.cfg, loop.config.logging, loop.run_dir, loop.config.run.name)

    def round_end(self, loop: RoundLoop, record: Record, records: list[Record], time: RoundTime) -> None:
        for tracker in self.trackers:
            tracker.record(record)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()
