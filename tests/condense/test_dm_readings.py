"""Distribution matching's real side without a graph, and its two readings of BatchNorm statistics (issue 45)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedskew.condense import DMConfig, distribution_matching, dm_loss, model_features, random_model_sampler
from fedskew.condense.distribution_matching import couples_batch
from fedskew.core.errors import ConfigError
from fedskew.models import create_model

dm_module = importlib.import_module("fedskew.condense.distribution_matching")

def _convnet(norm: str) -> Callable[[], nn.Module]:
    return lambda: create_model("convnet", in_channels=1, num_classes=3, image_size=8, net_width=4, net_depth=2,
                                net_norm=norm)


def _batches(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    real = [torch.randn((n, 1, 8, 8), generator=g) for n in (7, 5, 9)]
    syn = torch.randn((6, 1, 8, 8), generator=g, requires_grad=True)
    return real, syn


def _reference(h: nn.Module, real: list[torch.Tensor], syn: list[torch.Tensor], pooled: bool) -> torch.Tensor:
    """L_DM by its definition: one pass of everything (pooled), or all real then all synthetic images."""
    if pooled:
        emb = h(torch.cat([*real, *syn]))
        real_emb, syn_emb = emb[: sum(len(r) for r in real)], emb[sum(len(r) for r in real):]
    else:
        real_emb, syn_emb = h(torch.cat(real)).detach(), h(torch.cat(syn))
    loss, a, b = torch.zeros(()), 0, 0
    for r, s in zip(real, syn, strict=True):
        loss = loss + ((real_emb[a : a + len(r)].mean(0) - syn_emb[b : b + len(s)].mean(0)) ** 2).sum()
        a, b = a + len(r), b + len(s)
    return loss


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("reading", ["separate", "pooled"])
@pytest.mark.parametrize("norm", ["batchnorm", "instancenorm", "none"])
def test_each_reading_is_its_definition(norm: str, reading: str) -> None:
    """Loss and image gradient equal the reading's definition; with BatchNorm the readings differ, without it
    they are one computation."""
    torch.manual_seed(0)
    net = _convnet(norm)().train().requires_grad_(False)
    h = model_features(net)
    real, syn = _batches()
    parts = [syn[:2], syn[2:4], syn[4:]]
    loss = dm_loss(h, real, parts, reading)
    (grad,) = torch.autograd.grad(loss, [syn])
    pooled = reading == "pooled" and norm == "batchnorm"
    expected = _reference(h, real, parts, pooled)
    (expected_grad,) = torch.autograd.grad(expected, [syn])
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-12)
    assert torch.allclose(grad, expected_grad, rtol=1e-10, atol=1e-14)
    other = dm_loss(h, real, parts, "pooled" if reading == "separate" else "separate").detach()
    if norm == "batchnorm":
        assert couples_batch(h) and abs(float(other) - float(loss.detach())) > 1e-6
    else:
        assert not couples_batch(h) and float(other) == pytest.approx(float(loss.detach()), rel=1e-12)


@pytest.mark.parametrize("norm", ["batchnorm", "instancenorm"])
def test_real_images_go_through_without_a_graph(norm: str) -> None:
    """Only the synthetic images are embedded with a graph (the real ones are constants of the loss), unless
    BatchNorm statistics are pooled."""
    net = _convnet(norm)().train().requires_grad_(False)
    h = model_features(net)
    seen: list[tuple[int, bool]] = []
    h[0].register_forward_hook(lambda m, i, o: seen.append((o.shape[0], o.requires_grad)))
    real, syn = _batches()
    dm_loss(h, real, [syn[:2], syn[2:4], syn[4:]], "separate").backward()
    assert sorted(seen) == [(6, True), (21, False)]
    seen.clear()
    dm_loss(h, real, [syn[:2], syn[2:4], syn[4:]], "pooled")
    assert sorted(seen) == ([(27, True)] if norm == "batchnorm" else [(6, True), (21, False)])


@pytest.mark.usefixtures("float64")
def test_real_chunks_give_the_one_pass_means(monkeypatch: pytest.MonkeyPatch) -> None:
    """A network without a batch coupling embeds its real images in chunks on a CPU: the same loss."""
    net = _convnet("instancenorm")().train().requires_grad_(False)
    h = model_features(net)
    real, syn = _batches(1)
    parts = [syn[:2], syn[2:4], syn[4:]]
    whole = float(dm_loss(h, real, parts).detach())
    seen: list[int] = []
    h[0].register_forward_hook(lambda m, i, o: seen.append(o.shape[0]) if not o.requires_grad else None)
    monkeypatch.setattr(dm_module, "REAL_CHUNK", 4)
    assert float(dm_loss(h, real, parts).detach()) == pytest.approx(whole, rel=1e-12)
    assert seen == [4, 4, 4, 4, 4, 1]


def test_bn_statistics_is_checked_and_reaches_the_matching() -> None:
    with pytest.raises(ConfigError, match="bn_statistics"):
        DMConfig(bn_statistics="both")
    real, syn = _batches()
    with pytest.raises(ConfigError, match="bn_statistics must be one of separate, pooled, got 'x'"):
        dm_loss(model_features(_convnet("none")()), real, [syn[:2], syn[2:4], syn[4:]], "x")
    x = torch.cat(real).detach()
    y = torch.tensor([0] * 7 + [1] * 5 + [2] * 9)
    results = {}
    for reading in ("separate", "pooled"):
        cfg = DMConfig(iterations=2, ipc=1, real_batch=8, bn_statistics=reading)
        results[reading] = distribution_matching(x, y, random_model_sampler(_convnet("batchnorm")), cfg,
                                                 torch.Generator().manual_seed(0)).images
    assert not torch.equal(results["separate"], results["pooled"])


@pytest.mark.parametrize("name", ["feddm", "fedaf"])
def test_the_methods_pass_their_reading_to_the_matching(name: str) -> None:
    """``algorithm.bn_statistics`` of FedDM and FedAF is the DMConfig's; a bad value is refused in one line."""
    from types import SimpleNamespace

    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.config import resolve

    base = {"dataset": {"name": "digits"}, "algorithm": {"name": name}}
    for reading in ("separate", "pooled"):
        spec = resolve({**base, "algorithm": {"name": name, "bn_statistics": reading}})[0]
        assert spec.typed.algorithm.params.bn_statistics == reading
        method = ALGORITHMS.get(name)
        assert method.dm_config(SimpleNamespace(params=spec.typed.algorithm.params), "mean", None).bn_statistics \
            == reading  # what the client's distribution_matching gets
    assert resolve(base)[0].typed.algorithm.params.bn_statistics == "pooled"
    with pytest.raises(ConfigError, match=r"algorithm\.bn_statistics must be one of 'separate', 'pooled', got 'x'"):
        resolve({**base, "algorithm": {"name": name, "bn_statistics": "x"}})
