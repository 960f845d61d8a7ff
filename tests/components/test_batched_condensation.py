"""Batched distribution matching (issue 34): K clients' FedDM and FedAF condensations in one step each,
against :func:`distribution_matching` one client at a time, in float64."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fedskew.components import batched_condensation, batched_dm_networks
from fedskew.components.batched_condensation import (
    _group_key,
    _StackedDM,
    condense_batched,
    why_dm_sequential,
)
from fedskew.components.batched_slots import slot_width
from fedskew.condense import DSAConfig, sliced_wasserstein, sliced_wasserstein_stacked
from fedskew.condense.distribution_matching import (
    BN_STATISTICS,
    DMConfig,
    DMRequest,
    prepare_dm,
)
from fedskew.condense.samplers import perturbed_model_sampler, random_model_sampler
from fedskew.models.registry import FedModel
from tests.helpers.batched import CLASSES, convnet_factory, matching_clients, requests_and_sequential

TOL = 1e-9


@pytest.mark.parametrize("bn_statistics", BN_STATISTICS)
@pytest.mark.parametrize(("max_slots", "stacked_sampler"), [(1, True), (2, True), (2, False)])
@pytest.mark.parametrize("norm", ["instancenorm", "batchnorm"])
@pytest.mark.parametrize(("method", "local"), [("feddm", ""), ("fedaf", "samples"), ("fedaf", "mean")])
def test_batched_matching_equals_each_client_alone(
    float64: None, monkeypatch: pytest.MonkeyPatch, norm: str, method: str, local: str, max_slots: int,
    stacked_sampler: bool, bn_statistics: str,
) -> None:
    """Each client's networks from its own sampler, or all clients' at once (the default); both readings of
    the batch statistics (the same computation with instance norm)."""
    monkeypatch.setattr(batched_condensation, "MAX_SLOTS_PER_CLIENT", max_slots)
    monkeypatch.setattr(batched_condensation, "USE_STACKED_SAMPLER", stacked_sampler)
    clip = 0.05 if method == "feddm" else None  # FedDM's clipping, small enough to act at every step
    cfg = DMConfig(iterations=4, ipc=3, image_lr=0.5, momentum=0.9, real_batch=8, init="real", clip_norm=clip,
                   bn_statistics=bn_statistics)
    requests, sequential = requests_and_sequential(method, norm, cfg, local)
    assert all(why_dm_sequential(r) is None for r in requests)
    stacked = _StackedDM(requests)
    pooled = norm == "batchnorm" and bn_statistics == "pooled"
    # real (min(8, a class's)) and synthetic (3 a class) images: one pass of both, or a pass of each
    passes = {"pooled": [42, 20, 44]} if pooled else {"real": [30, 11, 32], "syn": [12, 9, 12]}
    assert {name: stacked.passes[name].batch for name in passes} == passes
    assert ("eval" in stacked.passes) == (method == "fedaf" and norm == "batchnorm")
    # one slot a client, or the larger clients over two slots each (the pooled pass: width 22, 110 samples
    # not 132; the real pass: width 16, 80 samples not 96)
    first = stacked.passes["pooled" if pooled else "real"]
    assert first.mask is not None  # the clients' batches are padded
    wide = {"pooled": (3, 44), "real": (3, 32)} if max_slots == 1 else {"pooled": (5, 22), "real": (5, 16)}
    assert (first.slots, first.width) == wide["pooled" if pooled else "real"]
    assert stacked.plan.batch_norm == (norm == "batchnorm")
    assert (stacked.sampler is not None) == stacked_sampler
    batched = condense_batched(requests)
    for alone, together, r in zip(sequential, batched, requests, strict=True):
        assert together.images.dtype == torch.float64
        assert torch.equal(together.labels, r.labels)
        assert (alone - together.images).abs().max().item() <= TOL
        assert (alone - r.start).abs().max().item() > 1e-3  # the steps moved the images


def test_the_readings_differ_with_batchnorm(float64: None) -> None:
    """With BatchNorm the two readings are two computations, and requests of each condense in groups of their
    own."""
    base = dict(iterations=3, ipc=2, image_lr=0.5, momentum=0.0, real_batch=8, init="real")
    separate, _ = requests_and_sequential("fedaf", "batchnorm", DMConfig(**base, bn_statistics="separate"))
    pooled, _ = requests_and_sequential("fedaf", "batchnorm", DMConfig(**base, bn_statistics="pooled"))
    assert _group_key(separate[0]) != _group_key(pooled[0])
    for a, b in zip(condense_batched(separate), condense_batched(pooled), strict=True):
        assert (a.images - b.images).abs().max().item() > 1e-4


def test_clipping_acts_per_client(float64: None) -> None:
    """The batched clip scales each client by its own norm: without clipping the images end elsewhere."""
    base = dict(iterations=3, ipc=2, image_lr=0.5, momentum=0.0, real_batch=8, init="real")
    clipped, _ = requests_and_sequential("feddm", "instancenorm", DMConfig(**base, clip_norm=0.05))
    free, _ = requests_and_sequential("feddm", "instancenorm", DMConfig(**base, clip_norm=None))
    for a, b in zip(condense_batched(clipped), condense_batched(free), strict=True):
        assert (a.images - b.images).abs().max().item() > 1e-4


def test_stacked_swd_equals_one_pair_at_a_time(float64: None) -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn((5, 7, 4), generator=g), torch.randn((5, 3, 4), generator=g)
    draws = torch.Generator().manual_seed(4)
    one = [sliced_wasserstein(a[i], b[i], 16, draws) for i in range(5)]
    draws = torch.Generator().manual_seed(4)
    theta = torch.stack([torch.randn((4, 16), generator=draws) for _ in range(5)])
    together = sliced_wasserstein_stacked(a, b, theta)
    assert (torch.stack(one) - together).abs().max().item() <= TOL
    same = sliced_wasserstein_stacked(a[:1], a[:1], theta[:1])
    assert same.item() == 0.0


def _request(**over: Any) -> DMRequest:
    factory = over.pop("factory", convnet_factory("instancenorm"))
    cfg = DMConfig(iterations=1, ipc=1, real_batch=4, init="real", **over.pop("cfg", {}))
    sampler = over.pop("sampler", None) or perturbed_model_sampler(factory(), factory, 0.1)
    x, y = matching_clients()[0]
    return prepare_dm(x, y, sampler, cfg, torch.Generator().manual_seed(0), None, over.pop("extra", None))


class _Custom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _custom_net() -> nn.Module:
    return FedModel(nn.Sequential(nn.Conv2d(1, 2, 3), _Custom(), nn.Flatten()), nn.Linear(72, CLASSES))


def _untracked_bn() -> nn.Module:
    return FedModel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, track_running_stats=False), nn.Flatten()),
                    nn.Linear(72, CLASSES))


@pytest.mark.parametrize(("over", "words"), [
    ({"cfg": {"amp": "bf16"}}, "mixed precision"),
    ({"cfg": {"dsa": DSAConfig()}}, "DSA"),
    ({"extra": lambda model, syn: syn.images.sum()}, "extra loss term"),
    ({"sampler": random_model_sampler(convnet_factory("instancenorm"))}, "does not say its network"),
    ({"factory": _custom_net}, "does not know a layer"),
    ({"factory": _untracked_bn}, "does not know a layer"),
    ({"factory": convnet_factory("layernorm")}, "does not know a layer"),
])
def test_what_cannot_batch_says_why(over: dict[str, Any], words: str) -> None:
    reason = why_dm_sequential(_request(**over))
    assert reason is not None and words in reason


def test_batchable_requests_say_nothing() -> None:
    assert why_dm_sequential(_request()) is None
    assert why_dm_sequential(_request(factory=convnet_factory("batchnorm"))) is None


def test_slot_width_pads_least_within_the_slots_allowed() -> None:
    assert slot_width([42, 20, 44], 3) == 44  # one slot a client
    assert slot_width([42, 20, 44], 6) == 22  # 2 + 1 + 2 slots of 22: 110 samples
    assert slot_width([10, 10], 4) == 10  # equal sizes: no padding, the widest
    assert slot_width([7], 2) == 7


@pytest.mark.parametrize("bn_statistics", BN_STATISTICS)
@pytest.mark.parametrize("norm", ["instancenorm", "batchnorm"])
def test_the_gpu_layout_on_a_cpu(float64: None, monkeypatch: pytest.MonkeyPatch, norm: str, bn_statistics: str) -> None:
    """What a GPU runs, here: NCHW batches (no channels-last) and each sample's statistics in one ``var_mean``."""
    monkeypatch.setattr(batched_condensation, "CHANNELS_LAST_DEVICES", set())
    monkeypatch.setattr(batched_dm_networks, "TWO_PASS_DEVICES", set())
    cfg = DMConfig(iterations=3, ipc=3, image_lr=0.5, momentum=0.9, real_batch=8, init="real",
                   bn_statistics=bn_statistics)
    requests, sequential = requests_and_sequential("fedaf", norm, cfg)
    assert not _StackedDM(requests).channels_last
    for alone, together in zip(sequential, condense_batched(requests), strict=True):
        assert (alone - together.images).abs().max().item() <= TOL
