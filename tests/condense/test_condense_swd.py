"""Sliced Wasserstein distance."""

from __future__ import annotations

import math

import pytest
import torch

from fedskew.condense import sliced_wasserstein
from fedskew.core.errors import DataError


def test_zero_for_identical_sets_with_finite_gradient() -> None:
    a = torch.randn((10, 4), generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    d = sliced_wasserstein(a, a.detach().clone())
    assert float(d.detach()) == pytest.approx(0.0, abs=1e-6)
    d.backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()
    # a set and the same set with every point repeated are the same measure
    assert float(sliced_wasserstein(a.detach(), a.detach().repeat(3, 1))) == pytest.approx(0.0, abs=1e-6)


def test_one_dimensional_values() -> None:
    """In 1-D every projection is +-1, so SW_p is the exact W_p."""
    a, b = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    assert float(sliced_wasserstein(a, b, num_projections=4)) == pytest.approx(1.0)
    # {0, 1} vs {0, 0.5, 1}: the quantile functions differ by 0.5 on (1/3, 2/3], so W_2^2 = 0.25 / 3
    a, b = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [0.5], [1.0]])
    assert float(sliced_wasserstein(a, b)) == pytest.approx(math.sqrt(0.25 / 3))
    assert float(sliced_wasserstein(b, a)) == pytest.approx(math.sqrt(0.25 / 3))
    assert float(sliced_wasserstein(a, b, p=1)) == pytest.approx(0.5 / 3)


def test_decreases_when_moving_one_set_towards_the_other() -> None:
    g = torch.Generator().manual_seed(1)
    target = torch.randn((30, 3), generator=g)
    moving = (torch.randn((20, 3), generator=g) + 3.0).requires_grad_(True)
    optimizer = torch.optim.SGD([moving], lr=20.0)

    def evaluate() -> float:
        with torch.no_grad():
            return float(sliced_wasserstein(moving, target, generator=torch.Generator().manual_seed(9)))

    start = evaluate()
    history = []
    for _ in range(60):
        loss = sliced_wasserstein(moving, target, num_projections=32, generator=g)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(evaluate())
    assert history[-1] < 0.25 * start
    assert history[9] < start


def test_input_checks() -> None:
    with pytest.raises(DataError):
        sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(DataError):
        sliced_wasserstein(torch.zeros(0, 2), torch.zeros(3, 2))
