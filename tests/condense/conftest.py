"""Shared fixtures of the condensation tests: a tiny network with the features/classifier split and a
two-class 8x8 toy problem. Everything runs on one thread (reproducible and fair to shared machines)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from fedskew.core.threads import num_threads
from tests.helpers.tiny_net import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with num_threads(1):
        yield


@pytest.fixture
def factory() -> Callable[[], nn.Module]:
    return TinyNet


@pytest.fixture
def toy() -> tuple[torch.Tensor, torch.Tensor]:
    """24 noisy images per class: class 0 bright in the top half, class 1 in the bottom half."""
    g = torch.Generator().manual_seed(123)
    n = 24
    x = 0.5 * torch.randn((2 * n, 1, 8, 8), generator=g)
    x[:n, :, :4] += 1.0
    x[n:, :, 4:] += 1.0
    y = torch.cat([torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)])
    return x, y
