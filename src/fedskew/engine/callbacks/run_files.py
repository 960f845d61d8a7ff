"""The run folder's own files: ``metrics.jsonl`` (one JSON line per round: deterministic, no wall-clock times),
``timing.jsonl`` (seconds per round, kept apart so that ``metrics.jsonl`` is byte-identical across runs), the
method's artifacts (``artifacts/<name>/round_NNNN.safetensors``), and at the end ``model.pt`` and
``summary.json``."""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

import torch

from fedskew.core.device import to_cpu
from fedskew.core.files import torch_bytes, write_atomic
from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.runs import ARTIFACTS_DIR, METRICS_FILE, MODEL_FILE, SUMMARY_FILE, TIMING_FILE


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


class ArtifactFiles(RoundCallback):
    """``artifacts/<name>/round_NNNN.safetensors``: what the method saves in a round (condensed images ...)."""

    def start(self, loop: Loop, resume: bool) -> None:
        self.folder = loop.run_dir / ARTIFACTS_DIR

    def artifact(self, name: str, rnd: int, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save

        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
        write_atomic(folder / f"round_{rnd:04d}.safetensors", data, sync=False)


class FinalFiles(RoundCallback):
    """``model.pt`` (the global model, on the CPU), then ``summary.json``: the summary last, since it marks the
    run finished (``fedskew run --resume`` keeps a run that has one)."""

    def finish(self, loop: Loop, summary: dict[str, Any]) -> None:
        write_atomic(loop.run_dir / MODEL_FILE, torch_bytes(to_cpu(loop.server.model.state_dict())), sync=False)
        write_atomic(loop.run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n", sync=False)


def _now() -> float:
    return time.perf_counter()
