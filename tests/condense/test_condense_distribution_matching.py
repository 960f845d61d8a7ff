"""Distribution matching (DM / FedDM / FedAF) and model samplers."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedskew.condense import (
    DMConfig,
    DSAConfig,
    SyntheticSet,
    distribution_matching,
    dm_loss,
    fresh_model,
    init_synthetic,
    interpolated_model_sampler,
    model_features,
    perturbed_model_sampler,
    random_model_sampler,
    sliced_wasserstein,
)
from fedskew.core.errors import ConfigError, DataError

Toy = tuple[torch.Tensor, torch.Tensor]


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_dm_loss_matches_per_class_loop(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    net = fresh_model(factory, torch.Generator().manual_seed(0))
    net.eval()
    syn = torch.randn((5, 1, 8, 8), generator=torch.Generator().manual_seed(1))
    real_by_class, syn_by_class = [x[y == 0], x[y == 1]], [syn[:2], syn[2:]]
    with torch.no_grad():
        expected = sum(
            float(((model_features(net)(r).mean(0) - model_features(net)(s).mean(0)) ** 2).sum())
            for r, s in zip(real_by_class, syn_by_class, strict=True)
        )
        loss = float(dm_loss(model_features(net), real_by_class, syn_by_class))
    assert loss == pytest.approx(expected, rel=1e-5)
    with pytest.raises(DataError):
        dm_loss(model_features(net), real_by_class, syn_by_class[:1])


def test_gradient_reaches_synthetic_images(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    net = fresh_model(factory, torch.Generator().manual_seed(0))
    syn = torch.randn((2, 1, 8, 8), generator=torch.Generator().manual_seed(1), requires_grad=True)
    dm_loss(model_features(net), [x[y == 0], x[y == 1]], [syn[:1], syn[1:]]).backward()
    assert syn.grad is not None and (syn.grad.flatten(1).abs().sum(1) > 0).all()


def test_swd_extra_loss_reaches_synthetic_images(factory: Callable[[], nn.Module]) -> None:
    """FedAF's collaborative term: SWD between the logits of S_c and given class-c logits."""
    net = fresh_model(factory, torch.Generator().manual_seed(0))
    syn = SyntheticSet(torch.randn((4, 1, 8, 8), requires_grad=True), torch.tensor([0, 0, 1, 1]))
    target = torch.randn((3, 2), generator=torch.Generator().manual_seed(2))
    loss = sliced_wasserstein(net(syn.images[syn.labels == 0]), target, generator=torch.Generator())
    loss.backward()
    assert syn.images.grad is not None and syn.images.grad[:2].abs().sum() > 0
    assert syn.images.grad[2:].abs().sum() == 0


def test_interpolated_sampler(factory: Callable[[], nn.Module]) -> None:
    model = fresh_model(factory, torch.Generator().manual_seed(0))
    before = _flat(model)
    same = interpolated_model_sampler(model, factory, 1.0)(0, torch.Generator().manual_seed(1))
    assert same is not model
    for p, q in zip(same.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    half = interpolated_model_sampler(model, factory, 0.5)(0, torch.Generator().manual_seed(1))
    rand = fresh_model(factory, torch.Generator().manual_seed(1))  # the sampler's first draw is w_random
    assert torch.allclose(_flat(half), 0.5 * before + 0.5 * _flat(rand))
    zero = interpolated_model_sampler(model, factory, 0.0)(0, torch.Generator().manual_seed(1))
    assert torch.equal(_flat(zero), _flat(rand))
    assert torch.equal(_flat(model), before)  # the given model is untouched
    with pytest.raises(ConfigError):
        interpolated_model_sampler(model, factory, 1.5)


def test_perturbed_sampler_stays_in_the_ball(factory: Callable[[], nn.Module]) -> None:
    model = fresh_model(factory, torch.Generator().manual_seed(0))
    w = _flat(model)
    sampler = perturbed_model_sampler(model, factory, rho=0.5)
    g = torch.Generator().manual_seed(3)
    distances = [float((_flat(sampler(i, g)) - w).norm()) for i in range(5)]
    assert all(0.4 < d <= 0.5 + 1e-5 for d in distances)  # uniform in a high-dimensional ball: near the sphere
    assert len(set(distances)) == 5
    assert torch.equal(_flat(perturbed_model_sampler(model, factory, 0.0)(0, g)), w)


def test_random_sampler_draws_fresh_networks(factory: Callable[[], nn.Module]) -> None:
    sampler = random_model_sampler(factory)
    g = torch.Generator().manual_seed(0)
    assert not torch.equal(_flat(sampler(0, g)), _flat(sampler(1, g)))


def _eval_loss(syn: SyntheticSet, x: torch.Tensor, y: torch.Tensor, factory: Callable[[], nn.Module]) -> float:
    total = 0.0
    with torch.no_grad():
        for seed in range(5):
            net = fresh_model(factory, torch.Generator().manual_seed(100 + seed))
            parts = [syn.images[syn.labels == c] for c in (0, 1)]
            total += float(dm_loss(model_features(net), [x[y == 0], x[y == 1]], parts))
    return total / 5


def test_condensation_lowers_the_loss(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    # the tiny network's features are small, so a larger image step than DM's 1.0 is needed to move fast
    cfg = DMConfig(iterations=30, ipc=2, init="noise", real_batch=16, image_lr=10.0)
    before = init_synthetic(x, y, [0, 1], 2, "noise", torch.Generator().manual_seed(0))
    after = distribution_matching(x, y, random_model_sampler(factory), cfg, torch.Generator().manual_seed(0))
    assert torch.equal(after.labels, before.labels)
    assert _eval_loss(after, x, y, factory) < 0.5 * _eval_loss(before, x, y, factory)


def test_fedaf_style_run_with_extra_loss_and_init_set(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    global_model = fresh_model(factory, torch.Generator().manual_seed(0))
    targets = {0: torch.randn(4, 2), 1: torch.randn(4, 2)}
    calls = []

    def swd_term(model: nn.Module, syn: SyntheticSet) -> torch.Tensor:
        assert syn.images.requires_grad
        calls.append(1)
        logits = model(syn.images)
        return 1e-2 * sum(
            (sliced_wasserstein(logits[syn.labels == c], t, 16, torch.Generator()) for c, t in targets.items()),
            torch.zeros(()),
        )

    init = init_synthetic(x, y, [1, 0], 3, "mean", torch.Generator().manual_seed(0))
    cfg = DMConfig(iterations=4, momentum=0.9, clip_norm=2.0, dsa=DSAConfig())
    sampler = interpolated_model_sampler(global_model, factory, 0.9)
    a = distribution_matching(x, y, sampler, cfg, torch.Generator().manual_seed(1), init, swd_term)
    b = distribution_matching(x, y, sampler, cfg, torch.Generator().manual_seed(1), init, swd_term)
    assert len(calls) == 8
    assert torch.equal(a.labels, init.labels)  # the init set's order is kept
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, init.images)


def test_init_set_needs_real_data_of_its_classes(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    init = SyntheticSet(torch.zeros(1, 1, 8, 8), torch.tensor([5]))
    with pytest.raises(DataError):
        distribution_matching(x, y, random_model_sampler(factory), DMConfig(iterations=1), torch.Generator(), init)


def test_perturbed_run_is_reproducible(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    model = fresh_model(factory, torch.Generator().manual_seed(0))
    sampler = perturbed_model_sampler(model, factory, rho=5.0)
    cfg = DMConfig(iterations=3, ipc=2, clip_norm=2.0)
    a = distribution_matching(x, y, sampler, cfg, torch.Generator().manual_seed(4))
    b = distribution_matching(x, y, sampler, cfg, torch.Generator().manual_seed(4))
    assert torch.equal(a.images, b.images)
    assert math.isfinite(float(a.images.abs().max()))
