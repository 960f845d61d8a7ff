"""Batched KIP (issue 34): K clients' NTK KIP in one step each, against :func:`kip` one client at a time."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedskew.components.batched_kip import _StackedKIP, kip_batched, why_kip_sequential
from fedskew.condense.kip import KIPConfig, kip, ntk_fc_relu, ntk_fc_relu_stacked, prepare_kip
from tests.helpers.batched import kip_clients

TOL = 1e-9


def test_stacked_ntk_equals_one_pair_at_a_time(float64: None) -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn((3, 5, 8), generator=g), torch.randn((3, 4, 8), generator=g)
    together = ntk_fc_relu_stacked(a, b, depth=2)
    for i in range(3):
        assert (ntk_fc_relu(a[i], b[i], depth=2) - together[i]).abs().max().item() <= TOL


def test_batched_kip_equals_each_client_alone(float64: None, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = KIPConfig(iterations=5, ipc=3, lr=0.05, target_batch=16, init="real")
    clients = kip_clients()
    alone = [kip(x, y, 4, cfg, torch.Generator().manual_seed(10 + k)) for k, (x, y) in enumerate(clients)]
    requests = [prepare_kip(x, y, 4, cfg, torch.Generator().manual_seed(10 + k)) for k, (x, y) in enumerate(clients)]
    assert all(why_kip_sequential(r) is None for r in requests)
    groups: list[tuple[int, int]] = []
    init = _StackedKIP.__init__

    def spy(self: _StackedKIP, members: list[Any]) -> None:
        init(self, members)
        groups.append((self.k, self.s))

    monkeypatch.setattr(_StackedKIP, "__init__", spy)
    together = kip_batched(requests)
    # only equal sizes step together (nothing padded): clients 0 and 2 (12 images, targets of 16), then client 1
    assert groups == [(2, 12), (1, 9)]
    for a, b, r in zip(alone, together, requests, strict=True):
        assert b.images.dtype == torch.float64 and torch.equal(a.labels, b.labels) and b.soft_labels is None
        assert (a.images - b.images).abs().max().item() <= TOL
        assert (a.images - r.images).abs().max().item() > 1e-3  # the steps moved the images


@pytest.mark.parametrize(("over", "words"), [
    ({"kernel": "rf_convnet"}, "rf_convnet kernel"),
    ({"learn_labels": True}, "learned labels"),
    ({"amp": "bf16"}, "mixed precision"),
    ({"ipc": 9}, "repeated images"),  # the second client holds 3 or 4 images a class
])
def test_what_cannot_batch_says_why(over: dict[str, Any], words: str) -> None:
    x, y = kip_clients(torch.float32)[1]
    cfg = KIPConfig(**{"ipc": 1, "init": "real", **over})
    reason = why_kip_sequential(prepare_kip(x, y, 4, cfg, torch.Generator().manual_seed(0)))
    assert reason is not None and words in reason
