"""What a round callback is (:class:`RoundCallback`) and what it sees of the round loop (:class:`Loop`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from fedskew.algorithms.base import ServerContext
from fedskew.config.schema import RunConfig
from fedskew.engine.federation import Federation
from fedskew.metrics import Ledger
from fedskew.privacy.run import RunPrivacy

Record = dict[str, Any]
"""One round's record, as a line of ``metrics.jsonl`` holds it."""


class Loop(Protocol):
    """What a callback reads of the round loop (:class:`~fedskew.engine.round_loop.RoundLoop`); a checkpoint's
    restore also sets ``round`` and ``client_states``."""

    config: RunConfig
    run_dir: Path
    fed: Federation
    server: ServerContext
    ledger: Ledger
    device: torch.device
    label: str
    round: int
    client_states: dict[int, dict[str, Any]]
    privacy: RunPrivacy | None


@dataclass(frozen=True)
class RoundTime:
    """When a round started (``time.perf_counter()``) and the seconds of its evaluation (wall-clock
    times: never in ``metrics.jsonl``)."""

    started: float
    eval_seconds: float


class RoundCallback:
    """A hook around the rounds of a run; every method does nothing unless overridden."""

    def start(self, loop: Loop, resume: bool) -> None:
        """The run starts (afresh, or resuming from its checkpoint): open files, check they can be written."""

    def begin(self, loop: Loop, records: list[Record]) -> None:
        """The records so far are known (none, or a checkpoint's); the first round comes next."""

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        """Round ``record["round"]`` is done; ``records`` holds it and every earlier one."""

    def artifact(self, name: str, rnd: int, tensors: dict[str, torch.Tensor]) -> None:
        """The method saved an artifact (condensed images ...) in round ``rnd``."""

    def finish(self, loop: Loop, summary: dict[str, Any]) -> None:
        """Every round is done and ``summary`` is the run's (``summary.json``); :meth:`close` comes next."""

    def close(self) -> None:
        """The run ended, finished or not: release what :meth:`start` opened."""
