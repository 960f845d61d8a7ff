"""Devices and mixed precision in the condensation library, as far as a CPU machine can check them.

bf16 autocast runs on the CPU, so every method is run with ``amp = "bf16"``: the images stay float32
and finite. The draws a seed makes are compared across devices by :mod:`tests.helpers.device_draws`
(here the CPU with itself; tests/gpu/test_condense_gpu.py compares CUDA with the CPU). The samplers'
reuse of one network is checked against building a new network per step, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedskew.condense import (
    DMConfig,
    DSAConfig,
    GMConfig,
    KIPConfig,
    SyntheticSet,
    distribution_matching,
    fresh_model,
    gradient_matching,
    interpolated_model_sampler,
    kip,
    perturbed_model_sampler,
    random_model_sampler,
    sliced_wasserstein,
)
from fedskew.condense.evaluate import EvalConfig, evaluate_synthetic
from fedskew.condense.samplers import ball_offset
from fedskew.core.errors import ConfigError
from fedskew.models.layout import use_channels_last
from tests.helpers.device_draws import assert_same, computed, draws

Toy = tuple[torch.Tensor, torch.Tensor]
CPU = torch.device("cpu")


def _finite_float32(syn: SyntheticSet, like: torch.Tensor) -> None:
    assert syn.images.dtype == torch.float32 and syn.images.shape[1:] == like.shape[1:]
    assert bool(torch.isfinite(syn.images).all())


def _swd_term(model: nn.Module, syn: SyntheticSet) -> torch.Tensor:
    logits = model(syn.images)
    return 0.01 * sliced_wasserstein(logits[syn.labels == 0], logits[syn.labels == 1], 8, torch.Generator())


@pytest.mark.parametrize("sampler", ["random", "perturbed", "interpolated"])
def test_dm_runs_in_bf16_and_returns_float32(factory: Callable[[], nn.Module], toy: Toy, sampler: str) -> None:
    x, y = toy
    base = fresh_model(factory, torch.Generator().manual_seed(0))
    samplers = {
        "random": random_model_sampler(factory),
        "perturbed": perturbed_model_sampler(base, factory, 1.0),
        "interpolated": interpolated_model_sampler(base, factory, 0.9),
    }
    cfg = DMConfig(iterations=3, ipc=2, real_batch=8, clip_norm=2.0, dsa=DSAConfig(), amp="bf16")
    seen: list[torch.dtype] = []
    net = samplers[sampler]

    def watched(step: int, g: torch.Generator) -> nn.Module:
        model = net(step, g)
        if not seen:
            model.features.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        return model

    syn = distribution_matching(x, y, watched, cfg, torch.Generator().manual_seed(1), extra_loss=_swd_term)
    _finite_float32(syn, x)
    assert seen and seen[0] == torch.bfloat16  # the networks ran in bf16, the images did not


@pytest.mark.parametrize("batched", [True, False])
def test_gm_runs_in_bf16_and_returns_float32(factory: Callable[[], nn.Module], toy: Toy, batched: bool) -> None:
    x, y = toy
    cfg = GMConfig(iterations=2, ipc=2, real_batch=8, outer_loop=2, inner_loop=1, dsa=DSAConfig(), amp="bf16")
    _finite_float32(gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0), batched_ok=batched), x)


@pytest.mark.parametrize("kernel", ["ntk", "rf_convnet"])
def test_kip_runs_in_bf16_and_returns_float32(toy: Toy, kernel: str) -> None:
    x, y = toy
    cfg = KIPConfig(iterations=2, ipc=2, target_batch=16, kernel=kernel, rf_width=4, depth=2, learn_labels=True,
                    amp="bf16")
    syn = kip(x, y, 2, cfg, torch.Generator().manual_seed(0))
    _finite_float32(syn, x)
    assert syn.soft_labels is not None and syn.soft_labels.dtype == torch.float32


def test_amp_words_and_fp16_without_cuda_are_refused(factory: Callable[[], nn.Module], toy: Toy) -> None:
    for make in (DMConfig, GMConfig, KIPConfig):
        with pytest.raises(ConfigError, match=r"^amp must be one of 'off', 'bf16', 'fp16', got 'fp8'$"):
            make(amp="fp8")
    if torch.cuda.is_available():
        return
    x, y = toy
    g = torch.Generator()
    with pytest.raises(ConfigError, match=r"amp 'fp16' needs a CUDA device"):
        distribution_matching(x, y, random_model_sampler(factory), DMConfig(iterations=1, amp="fp16"), g)
    with pytest.raises(ConfigError, match=r"amp 'fp16' needs a CUDA device"):
        gradient_matching(x, y, factory, GMConfig(iterations=1, amp="fp16"), g)
    with pytest.raises(ConfigError, match=r"amp 'fp16' needs a CUDA device"):
        kip(x, y, 2, KIPConfig(iterations=1, amp="fp16"), g)


def test_swd_stays_float32_under_autocast() -> None:
    a = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    b = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    plain = sliced_wasserstein(a, b, 32, torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = sliced_wasserstein(a, b, 32, torch.Generator().manual_seed(2))
    assert mixed.dtype == torch.float32 and torch.equal(mixed, plain)


def test_draws_and_results_do_not_depend_on_the_device_argument() -> None:
    """The CPU against itself: the path every device takes (tests/gpu/ compares CUDA with these)."""
    assert_same(draws(CPU), draws(CPU))
    first = computed(CPU)
    assert_same(first, computed(CPU))
    assert all(v.device.type == "cpu" for v in first.values())


def test_outputs_follow_the_data_and_uploads_are_cpu(factory: Callable[[], nn.Module], toy: Toy) -> None:
    x, y = toy
    syn = distribution_matching(x, y, random_model_sampler(factory), DMConfig(iterations=1, ipc=2), torch.Generator())
    assert syn.images.device == x.device and syn.labels.device == y.device
    u = syn.to_uint8([0.5], [0.25])
    assert u.images.dtype == torch.uint8 and u.images.device.type == "cpu"
    acc = evaluate_synthetic(syn, x, y, factory, EvalConfig(epochs=1), torch.Generator())
    assert 0.0 <= acc <= 1.0


# ---- the samplers' reuse of one network equals a new network per step, bit for bit ------------------
def _old_perturbed(model: nn.Module, factory: Callable[[], nn.Module], rho: float) -> Callable[..., nn.Module]:
    """FedDM's sampler as it was: a new container network per step."""

    def sample(step: int, g: torch.Generator) -> nn.Module:
        out = fresh_model(factory, g)
        out.load_state_dict(model.state_dict())
        params = [p for p in out.parameters() if p.is_floating_point()]
        directions, scale = ball_offset(params, rho, g)
        with torch.no_grad():
            for p, d in zip(params, directions, strict=True):
                p.add_(d, alpha=scale)
        return out

    return sample


def _old_interpolated(model: nn.Module, factory: Callable[[], nn.Module], gamma: float) -> Callable[..., nn.Module]:
    """FedAF's sampler as it was: a new network per step."""
    source = dict(model.named_parameters())

    def sample(step: int, g: torch.Generator) -> nn.Module:
        out = fresh_model(factory, g)
        random_params = {name: p.detach().clone() for name, p in out.named_parameters()}
        out.load_state_dict(model.state_dict())
        with torch.no_grad():
            for name, p in out.named_parameters():
                p.copy_(gamma * source[name].detach() + (1.0 - gamma) * random_params[name])
        return out

    return sample


def _convnet() -> nn.Module:
    from fedskew.models import create_model

    return create_model("convnet", in_channels=1, num_classes=3, image_size=8, net_width=8, net_norm="batchnorm",
                        net_depth=2)


@pytest.mark.parametrize("kind", ["perturbed", "interpolated"])
def test_reused_network_equals_a_new_network_per_step(kind: str) -> None:
    base = use_channels_last(fresh_model(_convnet, torch.Generator().manual_seed(0)))  # as a client's model
    new, old = (
        (perturbed_model_sampler(base, _convnet, 3.0), _old_perturbed(base, _convnet, 3.0))
        if kind == "perturbed"
        else (interpolated_model_sampler(base, _convnet, 0.9), _old_interpolated(base, _convnet, 0.9))
    )
    g_new, g_old = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    networks = []
    for step in range(4):
        net = new(step, g_new)
        networks.append(net)
        reference = old(step, g_old)
        for (k, a), b in zip(net.state_dict().items(), reference.state_dict().values(), strict=True):
            assert torch.equal(a, b), (step, k)
        use_channels_last(net).train()  # what distribution_matching does with it before the next draw
        net(torch.randn(4, 1, 8, 8))  # a training-mode pass changes its BatchNorm statistics
    assert all(n is networks[0] for n in networks)  # one network, new weights every step
    assert torch.equal(g_new.get_state(), g_old.get_state())  # the same draws were made
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())  # the given model is untouched


def test_dm_with_reused_networks_equals_dm_with_new_ones(toy: Toy) -> None:
    x, y = toy
    base = use_channels_last(fresh_model(_convnet, torch.Generator().manual_seed(0)))
    cfg = DMConfig(iterations=4, ipc=2, real_batch=8, momentum=0.9, clip_norm=2.0, init="mean")
    for new, old in (
        (perturbed_model_sampler(base, _convnet, 5.0), _old_perturbed(base, _convnet, 5.0)),
        (interpolated_model_sampler(base, _convnet, 0.9), _old_interpolated(base, _convnet, 0.9)),
    ):
        a = distribution_matching(x, y, new, cfg, torch.Generator().manual_seed(2)).images
        b = distribution_matching(x, y, old, cfg, torch.Generator().manual_seed(2)).images
        assert torch.equal(a, b)
