"""``metrics.jsonl`` (one JSON line per round: deterministic, no wall-clock times) and ``timing.jsonl``
(seconds per round, kept apart so that ``metrics.jsonl`` is byte-identical across runs)."""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.runs import METRICS_FILE, TIMING_FILE


class MetricsFile(RoundCallback):
    """``metrics.jsonl``: exactly the records so far at the start (a resumed run drops the rounds after its
    checkpoint), then one line a round."""

    def begin(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        self.path = loop.run_dir / METRICS_FILE
        with open(self.path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class TimingFile(RoundCallback):
    """``timing.jsonl``: a round's seconds, counted until its metrics line is written."""

    _file: TextIO | None = None

    def begin(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        self._file = open(loop.run_dir / TIMING_FILE, "a")  # noqa: SIM115 (closed in close())

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        assert self._file is not None
        line = {"round": record["round"], "seconds": _now() - time.started, "eval_seconds": time.eval_seconds}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _now() -> float:
    return time.perf_counter()
