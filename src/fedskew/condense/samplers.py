"""The networks distribution matching embeds with, one a step: a fresh random network (DM), the global model
perturbed within a ball of radius rho (FedDM) or interpolated with a fresh network (FedAF). Each sampler draws
from the step's generator exactly what building a new network draws, and those around a given model reuse one
network (its weights overwritten each step), so the results are those of a new network per step, bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedskew.condense.synthetic import ModelFactory, draw_seed, fresh_model, model_device
from fedskew.core.errors import ConfigError

ModelSampler = Callable[[int, torch.Generator], nn.Module]
"""``sampler(step, generator)`` returns the network used at matching step ``step``."""


def random_model_sampler(model_factory: ModelFactory) -> ModelSampler:
    """DM's sampler: a freshly initialised network ``model_factory()`` at every step (built on the CPU;
    :func:`distribution_matching` moves it to the data's device)."""

    def sample(step: int, generator: torch.Generator) -> nn.Module:
        return fresh_model(model_factory, generator)

    return sample


def _load_state(net: nn.Module, model: nn.Module, parameters: bool = True) -> None:
    """``net.load_state_dict(model.state_dict())`` without its bookkeeping (a step's cost matters here);
    ``parameters=False`` copies the buffers only."""
    target = net.state_dict(keep_vars=True)
    skip = set() if parameters else {name for name, _ in net.named_parameters()}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name not in skip:
                target[name].copy_(t)


def perturbed_model_sampler(model: nn.Module, model_factory: ModelFactory, rho: float) -> ModelSampler:
    """FedDM's sampler: w' drawn uniformly from the L2 ball of radius ``rho`` around w = ``model``.

    The rule: all floating-point parameters form one vector of dimension D; a direction d ~ N(0, I_D)
    is normalised, a radius ``r = rho * U^(1/D)`` with U ~ U(0, 1) is drawn (which makes w' uniform in
    the ball; for large D, r is close to rho), and ``w' = w + r d / ||d||``. Buffers (e.g. BatchNorm
    running statistics) are copied from ``model``. The draws are made on the CPU and moved to
    ``model``'s device.

    ``model_factory`` builds the container network once, on ``model``'s device; every step overwrites
    its weights and returns it. Later steps draw from the generator the seed a new container would
    have taken, so the stream (and the result) is that of a new network per step.
    """
    if rho < 0:
        raise ConfigError(f"rho must be >= 0, got {rho}")
    container: list[nn.Module] = []

    def sample(step: int, generator: torch.Generator) -> nn.Module:
        if container:
            draw_seed(generator)  # the draw fresh_model makes
        else:
            container.append(fresh_model(model_factory, generator, model_device(model)))
        out = container[0]
        _load_state(out, model)
        params = [p for p in out.parameters() if p.is_floating_point()]
        if not params:
            return out
        directions, scale = ball_offset(params, rho, generator)
        with torch.no_grad():
            for p, d in zip(params, directions, strict=True):
                # Added in the layout a new network's weights had (contiguous), as when one was built
                # per step: with mixed layouts the add runs a non-vectorised loop, whose rounding (fused
                # multiply-add or not) depends on how PyTorch was compiled.
                p.copy_(p.contiguous().add_(d.to(p.device, non_blocking=True), alpha=scale))
        return out

    return sample


def ball_offset(
    params: Sequence[torch.Tensor], rho: float, generator: torch.Generator
) -> tuple[list[torch.Tensor], float]:
    """One draw of FedDM's offset: CPU directions ``d`` (one per tensor in ``params``) and the scale
    ``r / ||d||`` with ``r = rho * U^(1/D)``, so that ``w + scale * d`` is uniform in the ball of radius
    ``rho`` around the weights ``w`` (D of them in all)."""
    directions = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]
    norm = float(torch.cat([d.flatten() for d in directions]).double().norm())
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return directions, rho * u ** (1.0 / sum(p.numel() for p in params)) / norm


def interpolated_model_sampler(model: nn.Module, model_factory: ModelFactory, gamma: float) -> ModelSampler:
    """FedAF's re-sampling (Eq. 17): ``w' = gamma w + (1 - gamma) w_random`` at every step.

    ``w_random`` is a fresh ``model_factory()`` network, built on the CPU from the generator and moved
    to ``model``'s device. Only parameters are interpolated; buffers (BatchNorm running statistics,
    counters) are copied from ``model``. ``gamma = 1`` returns exactly the weights of ``model``
    (``1 * w + 0 * w_random == w`` in floating point for finite weights); ``gamma = 0`` is DM's random
    network. FedAF uses 0.9. The first step's network is kept as the container that every step
    overwrites and returns.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma must be in [0, 1], got {gamma}")
    source = dict(model.named_parameters())
    container: list[nn.Module] = []

    def sample(step: int, generator: torch.Generator) -> nn.Module:
        w_random = fresh_model(model_factory, generator, model_device(model))
        if not container:
            container.append(w_random)
        out = container[0]
        _load_state(out, model, parameters=False)
        with torch.no_grad():
            for (name, p), r in zip(out.named_parameters(), w_random.parameters(), strict=True):
                p.copy_(gamma * source[name].detach() + (1.0 - gamma) * r)
        return out

    return sample
