"""SyntheticSet, 8-bit round trip, initialisation and seeded model construction."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedskew.condense import DMConfig, GMConfig, KIPConfig, SyntheticSet, UInt8Set, fresh_model, init_synthetic
from fedskew.core.errors import ConfigError, DataError

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def test_uint8_round_trip_is_lossless_after_first_quantisation() -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.arange(256, dtype=torch.uint8)
    u = values[torch.randint(256, (5, 3, 8, 8), generator=g)]
    u[0] = values.reshape(1, 16, 16)[:, :8, :8]  # make sure low and high values appear
    u[1] = values.reshape(1, 16, 16)[:, 8:, 8:]
    q = UInt8Set(u, torch.arange(5))
    back = SyntheticSet.from_uint8(q, MEAN, STD).to_uint8(MEAN, STD)
    assert torch.equal(back.images, u)
    assert back.images.dtype == torch.uint8

    s = SyntheticSet(3 * torch.randn((4, 3, 6, 6), generator=g), torch.arange(4))
    once = s.to_uint8(MEAN, STD)
    twice = SyntheticSet.from_uint8(once, MEAN, STD).to_uint8(MEAN, STD)
    assert torch.equal(once.images, twice.images)
    assert int(once.images.min()) == 0 and int(once.images.max()) == 255  # clamped, not wrapped


def test_uint8_keeps_labels_and_soft_labels_and_checks_channels() -> None:
    soft = torch.rand(2, 3)
    s = SyntheticSet(torch.zeros(2, 1, 4, 4), torch.tensor([0, 2]), soft)
    u = s.to_uint8([0.5], [0.25])
    assert torch.equal(u.labels, s.labels) and u.soft_labels is not None
    assert torch.equal(u.soft_labels, soft)
    assert int(u.images[0, 0, 0, 0]) == 128  # 0 in normalised space is the mean, 0.5 * 255 = 127.5 -> 128
    with pytest.raises(ConfigError):
        s.to_uint8(MEAN, STD)


def test_by_class() -> None:
    s = SyntheticSet(torch.arange(4.0).reshape(4, 1, 1, 1), torch.tensor([3, 3, 1, 1]))
    groups = s.by_class()
    assert list(groups) == [3, 1]
    assert groups[1].flatten().tolist() == [2.0, 3.0]


def test_init_modes(toy: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = toy
    g = torch.Generator().manual_seed(1)
    noise = init_synthetic(x, y, [1, 0], 3, "noise", g)
    assert noise.images.shape == (6, 1, 8, 8) and noise.labels.tolist() == [1, 1, 1, 0, 0, 0]

    real = init_synthetic(x, y, [0, 1], 3, "real", g)
    for img, label in zip(real.images, real.labels, strict=True):
        matches = (x == img).flatten(1).all(dim=1)
        assert matches.any() and set(y[matches].tolist()) == {int(label)}
    assert len({tuple(i.flatten().tolist()) for i in real.images[:3]}) == 3  # distinct images

    mean = init_synthetic(x, y, [0, 1], 2, "mean", g, mean_samples=100)  # all images of the class
    assert torch.allclose(mean.images[0], x[y == 0].mean(dim=0), atol=1e-6)
    assert torch.allclose(mean.images[3], x[y == 1].mean(dim=0), atol=1e-6)

    few = init_synthetic(x[:2], y[:2], [0], 5, "real", g)  # two images of class 0, five wanted
    assert few.images.shape[0] == 5


def test_init_errors(toy: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = toy
    with pytest.raises(DataError):
        init_synthetic(x, y, [0, 7], 1, "real", torch.Generator())
    with pytest.raises(ConfigError):
        init_synthetic(x, y, [0], 1, "zeros", torch.Generator())
    assert init_synthetic(x, y, [7], 1, "noise", torch.Generator()).labels.tolist() == [7]


def test_init_is_reproducible(toy: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = toy
    for mode in ("noise", "real", "mean"):
        a = init_synthetic(x, y, [0, 1], 2, mode, torch.Generator().manual_seed(5))
        b = init_synthetic(x, y, [0, 1], 2, mode, torch.Generator().manual_seed(5))
        assert torch.equal(a.images, b.images)


def test_fresh_model_is_seeded_and_leaves_global_rng_alone(factory: Callable[[], nn.Module]) -> None:
    state = torch.random.get_rng_state()
    a = fresh_model(factory, torch.Generator().manual_seed(3))
    b = fresh_model(factory, torch.Generator().manual_seed(3))
    c = fresh_model(factory, torch.Generator().manual_seed(4))
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert not torch.equal(pa, pc)


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (DMConfig, {"iterations": -1}, "iterations must be an integer >= 0, got -1"),
        (DMConfig, {"init": "zeros"}, "init must be one of ('noise', 'real', 'mean'), got 'zeros'"),
        (DMConfig, {"clip_norm": 0.0}, "clip_norm must be > 0, got 0.0"),
        (GMConfig, {"inner_loop": -2}, "inner_loop must be an integer >= 0, got -2"),
        (GMConfig, {"outer_loop": 0}, "outer_loop must be an integer >= 1, got 0"),
        (GMConfig, {"distance": "l2"}, "distance must be one of ('dc', 'cosine'), got 'l2'"),
        (KIPConfig, {"reg": -1e-3}, "reg must be >= 0, got -0.001"),
        (KIPConfig, {"kernel": "rbf"}, "kernel must be one of"),
        (KIPConfig, {"amp": "fp8"}, "amp must be one of 'off', 'bf16', 'fp16', got 'fp8'"),
    ],
)
def test_each_condensation_config_names_the_bad_option_and_what_is_allowed(
    cls: type, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        cls(**options)
    assert str(caught.value).startswith(message)
    cls(**{k: v for k, v in vars(cls()).items()})  # the defaults pass their own checks
