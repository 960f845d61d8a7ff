"""The Gaussian mechanism's parts, written once for every place fedskew privatises something: a client's
update (client-level DP, central or local), a sample's gradient (DP-SGD) and an example's embedding
(private condensation).

Each function takes its randomness as a :class:`torch.Generator`, which the caller gets from
:func:`noise_stream`: seeded from the run's seed and the (round, client) it serves
(:func:`fedskew.core.seeding.torch_generator`), so a private run is as reproducible, and resumes as
byte-identically, as any other; or, with ``privacy.noise_seed = "secret"``, from the operating system's randomness.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

from fedskew.core.seeding import torch_generator


def noise_stream(noise_seed: str, seed: int, *path: int | str) -> torch.Generator:
    """The generator a mechanism draws its noise from: ``run``: the run's stream for ``path`` (reproducible);
    ``secret``: a CPU generator seeded with 63 bits from :mod:`secrets` (the OS's randomness), which nobody can
    regenerate. (The draws themselves are torch's Philox/Mersenne Gaussian sampling, not hardened against
    floating-point attacks, Mironov 2012.)"""
    if noise_seed == "secret":
        return torch.Generator().manual_seed(secrets.randbits(63))
    return torch_generator(seed, *path)

_TINY = 1e-12


def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``tensors`` taken together (as one flat vector), in float64."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    return torch.sqrt(torch.stack([t.detach().double().pow(2).sum() for t in tensors]).sum())


def clip_factor(norm: torch.Tensor | float, max_norm: float) -> float:
    """``min(1, max_norm / norm)``: the factor that brings a vector of L2 norm ``norm`` within ``max_norm``."""
    norm = float(norm)
    return 1.0 if norm <= max_norm else max_norm / max(norm, _TINY)


def clip_by_global_norm(tensors: Sequence[torch.Tensor], max_norm: float) -> tuple[list[torch.Tensor], float]:
    """``tensors`` scaled together so that their joint L2 norm is at most ``max_norm``; and the norm before.

    The sensitivity bound of the Gaussian mechanism: after clipping, adding or removing one contribution
    changes a sum by at most ``max_norm`` in L2."""
    norm = float(global_norm(tensors))
    factor = clip_factor(norm, max_norm)
    return [t * factor if factor != 1.0 else t.clone() for t in tensors], norm


def clip_rows(rows: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Each row of ``rows`` (one example per row, any trailing shape) clipped to L2 norm ``max_norm``: the
    per-example clipping of DP-SGD and of private distribution matching."""
    flat = rows.reshape(rows.shape[0], -1)
    norms = flat.norm(dim=1, keepdim=True)
    factors = torch.clamp(max_norm / torch.clamp(norms, min=_TINY), max=1.0)
    return (flat * factors).reshape(rows.shape)


def gaussian_noise_like(tensors: Sequence[torch.Tensor], std: float, generator: torch.Generator) -> list[torch.Tensor]:
    """Independent N(0, std^2) noise of each tensor's shape and dtype, drawn on the CPU from ``generator``
    (so the draw is the same on every device) and moved to the tensor's device."""
    out = []
    for t in tensors:
        z = torch.randn(t.shape, generator=generator, dtype=torch.float64)
        out.append((z * std).to(dtype=t.dtype, device=t.device))
    return out


def add_gaussian_noise(tensors: Sequence[torch.Tensor], std: float, generator: torch.Generator) -> list[torch.Tensor]:
    """``tensors`` plus N(0, std^2) noise on every coordinate (std = noise_multiplier * sensitivity)."""
    if std == 0:
        return [t.clone() for t in tensors]
    return [t + z for t, z in zip(tensors, gaussian_noise_like(tensors, std, generator), strict=True)]


def next_clip(clip: float, below: float, target_quantile: float, lr: float) -> float:
    """Adaptive clipping's geometric update (Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private
    Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1): ``clip * exp(-lr * (below - target))``,
    where ``below`` is the (noised) fraction of this round's clients whose update norm was at most ``clip``.
    The clip shrinks when more than the target quantile of updates fit, and grows when fewer do."""
    return clip * math.exp(-lr * (below - target_quantile))


def noisy_fraction_below(
    norms: Sequence[float], clip: float, count_std: float, generator: torch.Generator, total: int | None = None,
) -> float:
    """The fraction of ``norms`` that are <= ``clip``, released privately: the count plus N(0, count_std^2),
    divided by ``total`` (None: the number of norms; DP-FedAvg's fixed denominator, the clients a round samples,
    where some may not answer) (Andrew et al., 2021: each client contributes one bit, sensitivity 1)."""
    denominator = len(norms) if total is None else total
    if denominator <= 0:
        return 0.0
    count = sum(1.0 for n in norms if n <= clip)
    if count_std > 0:
        count += float(torch.randn((), generator=generator, dtype=torch.float64)) * count_std
    return count / denominator


def adaptive_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """The noise multiplier left for the updates when part of the budget goes to the clipped-count query:
    ``(z^-2 - (2 sigma_b)^-2)^(-1/2)`` (Andrew et al., 2021, Theorem 1), so that the two queries together
    have the privacy of one Gaussian mechanism with multiplier ``z``. Refused when ``count_std`` is too
    small to leave any budget (``2 sigma_b <= z``)."""
    if count_std <= 0:
        raise ValueError(f"adaptive clipping needs a count noise > 0, got {count_std}")
    rest = noise_multiplier ** -2 - (2 * count_std) ** -2
    if rest <= 0:
        raise ValueError(
            f"count noise {count_std:g} is too small for noise multiplier {noise_multiplier:g}: "
            f"2 * count noise must exceed it"
        )
    return rest ** -0.5
