"""Batched KIP (HFLDD) on CUDA against each client alone (issue 34).

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.batched import kip_clients

pytestmark = pytest.mark.gpu


def test_batched_kip_on_cuda_equals_each_client_alone() -> None:
    from fedskew.components.batched_kip import kip_batched
    from fedskew.condense.kip import KIPConfig, kip, prepare_kip

    cfg = KIPConfig(iterations=5, ipc=3, lr=0.05, target_batch=16, init="real")
    clients = [(x.cuda(), y.cuda()) for x, y in kip_clients()]
    alone = [kip(x, y, 4, cfg, torch.Generator().manual_seed(10 + k)) for k, (x, y) in enumerate(clients)]
    requests = [prepare_kip(x, y, 4, cfg, torch.Generator().manual_seed(10 + k)) for k, (x, y) in enumerate(clients)]
    for a, b in zip(alone, kip_batched(requests), strict=True):
        assert b.images.device.type == "cuda"
        assert (a.images - b.images).abs().max().item() <= 1e-9
