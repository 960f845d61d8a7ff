"""Gradient matching (DC / FedDC)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.condense import DSAConfig, GMConfig, SyntheticSet, fresh_model, gradient_matching, match_distance
from fedskew.condense.gradient_matching import _clip_per_class
from fedskew.core.errors import ConfigError

Toy = tuple[torch.Tensor, torch.Tensor]


def _toy_gradients() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g_syn = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 0.0]), torch.ones(2, 1, 1, 2)]
    g_real = [
        torch.tensor([[1.0, 1.0], [0.0, 2.0]]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([1.0, -1.0, 2.0, 2.0]).reshape(2, 1, 1, 2),
    ]
    return g_syn, g_real


def test_match_distance_hand_computed() -> None:
    g_syn, g_real = _toy_gradients()
    # cosine (FedDC Eq. 6), one term per tensor:
    #   W: <[1,0,0,1], [1,1,0,2]> = 3, norms sqrt(2) sqrt(6) -> 1 - sqrt(3)/2
    #   b: <[1,0], [1,1]> = 1, norms 1, sqrt(2)            -> 1 - 1/sqrt(2)
    #   conv: <[1,1,1,1], [1,-1,2,2]> = 4, norms 2 sqrt(10) -> 1 - 2/sqrt(10)
    expected = (1 - math.sqrt(3) / 2) + (1 - 1 / math.sqrt(2)) + (1 - 2 / math.sqrt(10))
    assert float(match_distance(g_syn, g_real, "cosine")) == pytest.approx(expected, rel=1e-6)
    # dc: per output row, biases ignored:
    #   W rows: [1,0]/[1,1] -> 1 - 1/sqrt(2); [0,1]/[0,2] -> 0
    #   conv rows (out=2, 1*1*2): [1,1]/[1,-1] -> 1; [1,1]/[2,2] -> 0
    expected_dc = (1 - 1 / math.sqrt(2)) + 1.0
    assert float(match_distance(g_syn, g_real, "dc")) == pytest.approx(expected_dc, rel=1e-6)


@pytest.mark.parametrize("kind", ["dc", "cosine"])
def test_match_distance_zero_for_identical(kind: str) -> None:
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(shape, generator=g) for shape in [(4, 3, 3, 3), (4,), (10, 16), (10,)]]
    assert float(match_distance(grads, [t.clone() for t in grads], kind)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError):
        match_distance(grads, grads, "l2")


def test_gradient_reaches_synthetic_images(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    net = fresh_model(factory, torch.Generator().manual_seed(0))
    params = list(net.parameters())
    syn = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(1), requires_grad=True)
    g_real = torch.autograd.grad(F.cross_entropy(net(x[y == 0]), y[y == 0]), params)
    g_syn = torch.autograd.grad(F.cross_entropy(net(syn), torch.zeros(1, dtype=torch.int64)), params, create_graph=True)
    for kind in ("dc", "cosine"):
        syn.grad = None
        match_distance(g_syn, g_real, kind).backward(retain_graph=True)
        assert syn.grad is not None and torch.isfinite(syn.grad).all() and syn.grad.abs().sum() > 0


def test_clip_per_class() -> None:
    grad = torch.cat([torch.full((1, 1, 2, 2), 10.0), torch.full((1, 1, 2, 2), 0.1)])  # norms 20 and 0.2
    _clip_per_class(grad, 2, 5.0)
    assert float(grad[0].norm()) == pytest.approx(5.0)
    assert torch.allclose(grad[1], torch.full((1, 2, 2), 0.1))


def _mean_distance(syn: SyntheticSet, x: torch.Tensor, y: torch.Tensor, factory: Callable[[], nn.Module]) -> float:
    """Average over fixed networks of the summed per-class distance to the full real class gradients."""
    total = 0.0
    for seed in range(4):
        net = fresh_model(factory, torch.Generator().manual_seed(100 + seed))
        params = list(net.parameters())
        for c in (0, 1):
            g_real = torch.autograd.grad(F.cross_entropy(net(x[y == c]), y[y == c]), params)
            xs = syn.images[syn.labels == c]
            g_syn = torch.autograd.grad(F.cross_entropy(net(xs), syn.labels[syn.labels == c]), params)
            total += float(match_distance(g_syn, g_real, "cosine"))
    return total / 4


def test_condensation_lowers_the_matching_loss(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    cfg = GMConfig(iterations=25, ipc=1)
    before = SyntheticSet(torch.randn((2, 1, 8, 8), generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1]))
    after = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(after.labels, torch.tensor([0, 1]))
    assert not torch.equal(after.images, before.images)
    assert _mean_distance(after, x, y, factory) < 0.8 * _mean_distance(before, x, y, factory)


def test_same_seed_same_result(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    cfg = GMConfig(iterations=3, ipc=2, init="real", momentum=0.9, weight_decay=4e-5, distance="dc")
    a = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(7))
    b = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(7))
    c = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(8))
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, c.images)


def test_dc_schedule_with_dsa_runs(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    cfg = GMConfig(iterations=2, ipc=2, outer_loop=3, inner_loop=2, init="real", dsa=DSAConfig(flip=False))
    out = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0), progress=True)
    assert out.images.shape == (4, 1, 8, 8) and torch.isfinite(out.images).all()
    cfg.dsa = None
    trained = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0))
    cfg.inner_loop = 0
    untrained = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0))
    assert not torch.equal(trained.images, untrained.images)  # the inner network training matters


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        GMConfig(distance="l1")
    with pytest.raises(ConfigError):
        GMConfig(clip_norm=0.0)
    with pytest.raises(ConfigError):
        GMConfig(init="zeros")


def _double_noise_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the synthetic initialisation float64 so that batched and looped runs compare exactly."""
    gm = importlib.import_module("fedskew.condense.gradient_matching")  # the package re-exports a function of that name
    original = gm.start_set

    def init64(*args: object, **kwargs: object) -> SyntheticSet:
        syn = original(*args, **kwargs)  # type: ignore[arg-type]
        return SyntheticSet(syn.images.double(), syn.labels)

    monkeypatch.setattr(gm, "start_set", init64)


@pytest.mark.parametrize(
    ("model", "options", "cfg"),
    [
        ("cnn", {}, {}),
        ("convnet", {"net_width": 8}, {"ipc": 2, "distance": "dc"}),
        ("convnet", {"net_width": 8, "net_norm": "groupnorm", "net_act": "swish"}, {"momentum": 0.9}),
        ("convnet", {"net_width": 8, "net_pooling": "maxpooling"}, {"dsa": DSAConfig()}),
    ],
)
def test_batched_synthetic_side_equals_the_class_loop(
    model: str, options: dict[str, object], cfg: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vmap path gives the images the class-by-class loop gives (float64: to rounding)."""
    from fedskew.condense.gradient_matching import batchable
    from fedskew.models import create_model

    _double_noise_init(monkeypatch)
    size = 32 if model == "cnn" else 16
    with torch.random.fork_rng(devices=[]):
        torch.set_default_dtype(torch.float64)
        try:
            gen = torch.Generator().manual_seed(3)
            x = torch.randn(26, 3, size, size, generator=gen)
            y = torch.tensor([0] * 12 + [4] * 9 + [7] * 3 + [9] * 2)

            def factory() -> nn.Module:
                return create_model(model, in_channels=3, num_classes=10, image_size=size, **options)

            assert batchable(factory())
            gm_cfg = GMConfig(iterations=3, real_batch=8, **cfg)  # type: ignore[arg-type]
            looped = gradient_matching(x, y, factory, gm_cfg, torch.Generator().manual_seed(0), batched_ok=False)
            batched = gradient_matching(x, y, factory, gm_cfg, torch.Generator().manual_seed(0))
            start_cfg = GMConfig(iterations=0, ipc=gm_cfg.ipc)
            start = gradient_matching(x, y, factory, start_cfg, torch.Generator().manual_seed(0))
        finally:
            torch.set_default_dtype(torch.float32)
    assert (looped.images - start.images).abs().max() > 1e-3  # the images moved
    torch.testing.assert_close(batched.images, looped.images, rtol=0, atol=1e-10)
    assert torch.equal(batched.labels, looped.labels)


@pytest.mark.parametrize("norm", ["batchnorm", "layernorm"])
def test_networks_the_batched_path_cannot_take_use_the_loop(norm: str) -> None:
    """BatchNorm (whole-batch statistics) and LayerNorm (wrong batched second derivative) keep the loop."""
    from fedskew.condense.gradient_matching import batchable
    from fedskew.models import create_model

    def factory() -> nn.Module:
        return create_model("convnet", in_channels=1, num_classes=10, image_size=16, net_width=8, net_norm=norm)

    assert not batchable(factory())
    x = torch.randn(12, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0] * 6 + [1] * 6)
    cfg = GMConfig(iterations=2, ipc=2)
    default = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0))
    looped = gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0), batched_ok=False)
    assert torch.equal(default.images, looped.images)
