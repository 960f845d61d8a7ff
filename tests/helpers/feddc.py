"""FedDC's tests: its tiny config, and a run in the test's process that records what the method condensed,
uploaded and fine-tuned on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fedskew.algorithms.feddc as feddc_module
from fedskew.condense import SyntheticSet
from fedskew.config import typed_config
from fedskew.core.message import Message
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config

FAST: dict[str, Any] = {"condense_iterations": 3, "server": {"epochs": 2}}


def feddc_config(name: str = "feddc", **algo: Any) -> dict[str, Any]:
    return tiny_config(rounds=2, checkpoint_every=0, algorithm={"name": name, **FAST, **algo})


def run_recording(
    cfg: dict[str, Any], path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[RoundLoop, list[dict[str, Any]], list[torch.Tensor], list[list[tuple[int, Message]]], list[SyntheticSet]]:
    """Run ``cfg`` in this process; return the loop, its records, every condensed set's images as the
    client made them, each round's accepted replies and each round's fine-tuning set."""
    made: list[torch.Tensor] = []
    tuned: list[SyntheticSet] = []
    real_gm, real_train = feddc_module.gradient_matching, feddc_module.train_global_on_synthetic

    def gm_spy(*args: Any, **kwargs: Any) -> SyntheticSet:
        syn = real_gm(*args, **kwargs)
        made.append(syn.images.detach().clone())
        return syn

    def train_spy(model: torch.nn.Module, syn: SyntheticSet, *args: Any, **kwargs: Any) -> Any:
        tuned.append(syn)
        return real_train(model, syn, *args, **kwargs)

    monkeypatch.setattr(feddc_module, "gradient_matching", gm_spy)
    monkeypatch.setattr(feddc_module, "train_global_on_synthetic", train_spy)
    sim = RoundLoop(typed_config(cfg), path, progress=False)
    uploads: list[list[tuple[int, Message]]] = []
    exchange = sim.exchange

    def recording_exchange(*args: Any, **kwargs: Any) -> Any:
        replies = exchange(*args, **kwargs)
        uploads.append(replies)
        return replies

    sim.server.exchange = recording_exchange
    records = sim.run().records
    return sim, records, made, uploads, tuned
