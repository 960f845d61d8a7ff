"""The batched runners' tests (issue 34): whole runs in float64 and KIP's clients, shared by the CPU tests and
tests/gpu."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from fedskew.config.schema import typed_config
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.round_loop import RoundLoop


# ---- whole runs (tests/engine/test_batched_clients.py, test_batched_kip_runs.py) ---------------------------
def federation64(cfg: dict[str, Any]) -> Federation:
    config = typed_config(cfg)
    fed = build_federation(config.dataset, config.partition, config.model, 0)
    return dataclasses.replace(fed, x=fed.x.double(), x_test=fed.x_test.double())


def final_model(cfg: dict[str, Any], path: Path, fed: Federation | None = None) -> dict[str, torch.Tensor]:
    loop = RoundLoop(typed_config(cfg), path, progress=False, federation=fed)
    loop.run()
    return {k: v.detach().clone() for k, v in loop.server.model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0) for k in a)


# ---- batched KIP (tests/components/test_batched_kip.py, tests/gpu) ---------------------------------------
def kip_clients(dtype: torch.dtype = torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three clients of unequal sizes, the second with a class fewer: support sets of 12, 9 and 12 images, target
    batches of 16, 11 and 16."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn((n, 1, 6, 6), generator=g).to(dtype), torch.arange(n) % held)
            for n, held in ((30, 4), (11, 3), (45, 4))]
