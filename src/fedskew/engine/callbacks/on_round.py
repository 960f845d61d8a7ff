"""The caller's ``on_round``: called with each round's record once the round is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime


class OnRound(RoundCallback):
    def __init__(self, call: Callable[[dict[str, Any]], None]) -> None:
        self.call = call

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        self.call(record)
