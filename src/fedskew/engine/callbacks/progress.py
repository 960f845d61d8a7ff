"""The progress bar of a run: a bar in a terminal; in a log file a plain line every 10 s, no escape codes."""

from __future__ import annotations

from typing import Any

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.progress import progress_bar


class ProgressBar(RoundCallback):
    """Rounds done of the run's rounds, with the last accuracy."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def begin(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        self.bar = progress_bar(
            total=loop.config.run.rounds, initial=loop.round, desc=loop.label, unit="round",
            enabled=self.enabled, leave=False,
        )

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        if record.get("accuracy") is not None:
            self.bar.set_postfix(acc=f"{100 * record['accuracy']:.1f}%")
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
