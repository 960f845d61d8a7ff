"""Weights & Biases and MLflow (``[logging] wandb`` / ``mlflow``): every round's record
(:mod:`fedskew.engine.trackers`)."""

from __future__ import annotations

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.engine.trackers import Tracker, open_trackers


class Trackers(RoundCallback):
    """The trackers the run's ``[logging]`` asks for, started with the run and closed with it."""

    def __init__(self) -> None:
        self.trackers: list[Tracker] = []

    def start(self, loop: Loop, resume: bool) -> None:
        self.trackers = open_trackers(loop.config, loop.run_dir)

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        for tracker in self.trackers:
            tracker.record(record)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()
