"""TensorBoard (``[logging] tensorboard``): every round's scalars and the artifacts' images
(:class:`~fedskew.engine.tensorboard.TensorBoardLog`)."""

from __future__ import annotations

import torch

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.engine.tensorboard import TensorBoardLog


class TensorBoard(RoundCallback):
    """Opens the run's log at the start (a folder it cannot write to is one line, before any client runs)."""

    log = TensorBoardLog(None)

    def start(self, loop: Loop, resume: bool) -> None:
        self.log = TensorBoardLog.for_run(loop.config, loop.run_dir, loop.fed.class_names, resume)

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        self.log.record(record)

    def artifact(self, name: str, rnd: int, tensors: dict[str, torch.Tensor]) -> None:
        self.log.artifact(name, rnd, tensors)

    def close(self) -> None:
        self.log.close()
