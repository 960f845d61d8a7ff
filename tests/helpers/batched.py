"""The batched runners' tests (issue 34): whole runs in float64, clients' condensation requests, and their
sequential results, shared by the CPU tests and tests/gpu."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedskew.condense.distribution_matching import (
    DMConfig,
    DMRequest,
    distribution_matching,
    prepare_dm,
)
from fedskew.condense.samplers import interpolated_model_sampler, perturbed_model_sampler
from fedskew.condense.swd import ClassSWD
from fedskew.config.schema import typed_config
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.round_loop import RoundLoop
from fedskew.models import create_model


# ---- whole runs (tests/engine/test_batched_clients.py, test_batched_condensation_runs.py) -----------------
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


# ---- batched distribution matching (tests/components/test_batched_condensation.py, tests/gpu) ----------
CLASSES = 4


def convnet_factory(norm: str) -> Callable[[], nn.Module]:
    return lambda: create_model("convnet", in_channels=1, num_classes=CLASSES, image_size=8, net_width=6,
                                net_depth=2, net_norm=norm)


def matching_clients() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three clients of unequal sizes; the second lacks a class and has classes of fewer real images than
    the real batch, so the stacked batch pads every client differently."""
    g = torch.Generator().manual_seed(0)
    out = []
    for n, held in ((30, 4), (11, 3), (45, 4)):
        x = torch.randn((n, 1, 8, 8), generator=g)
        y = torch.arange(n) % held
        out.append((x, y))
    return out


def requests_and_sequential(
    method: str, norm: str, cfg: DMConfig, local: str = "samples", device: str = "cpu"
) -> tuple[list[DMRequest], list[torch.Tensor]]:
    """Each client's request (for the batched run) and its sequential result, from equal fresh states, on
    ``device`` (tests/gpu uses it too)."""
    factory = convnet_factory(norm)
    torch.manual_seed(1)
    global_model = factory().to(device)
    targets = [torch.randn((CLASSES, CLASSES), generator=torch.Generator().manual_seed(9 + k)).to(device)
               for k in range(3)]

    def parts(k: int) -> tuple[Any, torch.Generator, Any]:
        model = copy.deepcopy(global_model)
        g = torch.Generator().manual_seed(100 + k)
        if method == "feddm":
            return perturbed_model_sampler(model, factory, 0.5), g, None
        v = targets[k]
        term = ClassSWD({c: v[c : c + 1] for c in range(CLASSES)}, 0.3, 16, local,
                        torch.Generator().manual_seed(7 + k))
        return interpolated_model_sampler(model, factory, 0.9), g, term

    requests, sequential = [], []
    for k, (x, y) in enumerate(matching_clients()):
        x, y = x.to(device), y.to(device)
        sampler, g, term = parts(k)
        requests.append(prepare_dm(x, y, sampler, cfg, g, None, term))
        sampler, g, term = parts(k)
        sequential.append(distribution_matching(x, y, sampler, cfg, g, None, term).images)
    return requests, sequential


# ---- batched KIP (tests/components/test_batched_kip.py, tests/gpu) ---------------------------------------
def kip_clients(dtype: torch.dtype = torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three clients of unequal sizes, the second with a class fewer: support sets of 12, 9 and 12 images, target
    batches of 16, 11 and 16."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn((n, 1, 6, 6), generator=g).to(dtype), torch.arange(n) % held)
            for n, held in ((30, 4), (11, 3), (45, 4))]
