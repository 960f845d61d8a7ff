"""Batched distribution matching (FedDM, FedAF) on CUDA against each client alone (issue 34).

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from fedskew.components.batched_condensation import condense_batched
from fedskew.condense.distribution_matching import DMConfig
from tests.helpers.batched import kip_clients, requests_and_sequential

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("norm", "bn_statistics"), [("instancenorm", "separate"), ("batchnorm", "separate"),
                                                     ("batchnorm", "pooled")])
@pytest.mark.parametrize("method", ["feddm", "fedaf"])
def test_batched_matching_on_cuda_equals_each_client_alone(
    no_tf32: None, dtype: torch.dtype, norm: str, bn_statistics: str, method: str
) -> None:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        clip = 0.05 if method == "feddm" else None
        cfg = DMConfig(iterations=4, ipc=3, image_lr=0.5, momentum=0.9, real_batch=8, init="real", clip_norm=clip,
                       bn_statistics=bn_statistics)
        requests, sequential = requests_and_sequential(method, norm, cfg, device="cuda")
        batched = condense_batched(requests)
    finally:
        torch.set_default_dtype(before)
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    for alone, together in zip(sequential, batched, strict=True):
        assert together.images.device.type == "cuda" and together.images.dtype == dtype
        assert (alone - together.images).abs().max().item() <= tol


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
