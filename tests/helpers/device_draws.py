"""What a seed makes the condensation library draw and compute, on a given device, brought back to the CPU.

Shared by tests/condense/test_condense_device.py (the CPU, all a CPU machine can check) and
tests/gpu/test_condense_gpu.py (CUDA against the CPU). :func:`draws` holds random draws and what is
only selected or copied from them: equal bit for bit on every device. :func:`computed` holds results
of arithmetic on the draws (sampled networks, a few condensation steps): equal up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedskew.condense import (
    DMConfig,
    DSAConfig,
    GMConfig,
    KIPConfig,
    RandomConvFeatures,
    apply_dsa,
    distribution_matching,
    fresh_model,
    gradient_matching,
    init_synthetic,
    interpolated_model_sampler,
    kip,
    perturbed_model_sampler,
    random_model_sampler,
    sample_dsa_params,
    sliced_wasserstein,
)
from fedskew.condense.synthetic import sample_indices
from fedskew.core.threads import num_threads
from tests.helpers.tiny_net import TinyNet

Factory = Callable[[], nn.Module]


def tiny3() -> nn.Module:
    """The tests' tiny network with three outputs (the toy data's classes)."""
    return TinyNet(1, 3)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def toy_data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """36 8x8 one-channel images of three classes, made on the CPU and moved."""
    x = torch.randn((36, 1, 8, 8), generator=_g(123))
    y = torch.arange(36) % 3
    return x.to(device), y.to(device)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _cpu(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in out.items()}


def draws(device: torch.device, factory: Factory = tiny3) -> dict[str, torch.Tensor]:
    """Draws of a fixed seed on ``device`` (as CPU tensors): the same on every device, bit for bit."""
    x, y = toy_data(device)
    out: dict[str, torch.Tensor] = {
        "init_noise": init_synthetic(x, y, [0, 2], 3, "noise", _g(1)).images,
        "init_real": init_synthetic(x, y, [0, 1, 2], 4, "real", _g(2)).images,
        "sample_indices": sample_indices(torch.arange(50, device=device), 10, _g(3)),
    }
    out.update({f"fresh.{k}": v for k, v in _state(fresh_model(factory, _g(4), device)).items()})
    sampler = random_model_sampler(factory)
    out.update({f"random.{k}": v for k, v in _state(sampler(0, _g(5))).items()})
    # Selection-only augmentations (translation with zero padding, cutout, flip) copy pixels exactly.
    dsa = DSAConfig(strategy="crop_cutout_flip", mode="all")
    out["dsa_shared"] = apply_dsa(x[:6], sample_dsa_params(dsa, None, _g(6)))
    out["dsa_per_image"] = apply_dsa(x[:6], sample_dsa_params(dsa, 6, _g(7)))
    rf = RandomConvFeatures(1, 4, 2, _g(8)).to(device)
    out.update({f"rf.{k}": v for k, v in rf.state_dict().items()})
    return _cpu(out)


def computed(device: torch.device, factory: Factory = tiny3) -> dict[str, torch.Tensor]:
    """Results of arithmetic on a fixed seed's draws, on ``device`` (as CPU tensors): equal up to rounding."""
    x, y = toy_data(device)
    with num_threads(1):
        base = fresh_model(factory, _g(10), device)
        out: dict[str, torch.Tensor] = {"init_mean": init_synthetic(x, y, [0, 1], 2, "mean", _g(11)).images}
        sampled = perturbed_model_sampler(base, factory, 2.0)(0, _g(12))
        out.update({f"perturbed.{k}": v for k, v in _state(sampled).items()})
        sampled = interpolated_model_sampler(base, factory, 0.9)(0, _g(13))
        out.update({f"interpolated.{k}": v for k, v in _state(sampled).items()})
        out["swd"] = sliced_wasserstein(x[:5].flatten(1), x[5:12].flatten(1), 16, _g(14))
        dm = DMConfig(iterations=3, ipc=2, real_batch=8, init="mean", clip_norm=2.0)
        out["dm"] = distribution_matching(x, y, perturbed_model_sampler(base, factory, 1.0), dm, _g(15)).images
        gm = GMConfig(iterations=2, ipc=2, real_batch=8, image_lr=0.1)
        out["gm"] = gradient_matching(x, y, factory, gm, _g(16)).images
        kc = KIPConfig(iterations=2, ipc=2, target_batch=12, lr=0.01)
        out["kip"] = kip(x, y, 3, kc, _g(17)).images
    return _cpu(out)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 0.0, atol: float = 0.0) -> None:
    """Equal keys, dtypes and shapes; values equal (``rtol = atol = 0``) or close."""
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if rtol == atol == 0.0:
            assert torch.equal(a[k], b[k]), k
        else:
            assert torch.allclose(a[k].double(), b[k].double(), rtol=rtol, atol=atol), k
