"""Sliced Wasserstein distance, differentiable (FedAF Eq. 10 uses it to align logit distributions).

For point clouds ``a`` (n, d) and ``b`` (m, d), the sliced p-Wasserstein distance (Bonneel et al.
2015; Kolouri et al. 2019) is

    SW_p(a, b) = ( E_theta [ W_p^p(theta^T a, theta^T b) ] )^(1/p),   theta uniform on the unit sphere,

estimated with ``num_projections`` random directions. In one dimension W_p is exact and cheap:
``W_p^p = integral_0^1 |F_a^{-1}(t) - F_b^{-1}(t)|^p dt`` over the two quantile functions. With
n != m the quantile functions are step functions with jumps at ``i/n`` and ``j/m``; we sort both
projected sets and sum over the merged jump points, which evaluates the integral exactly (no
resampling to a common size). For n == m this is the familiar mean of ``|sorted(a) - sorted(b)|^p``.
"""

from __future__ import annotations

import functools

import torch

from fedskew.condense.synthetic import SyntheticSet, default_generator
from fedskew.core.device import randn
from fedskew.core.errors import ConfigError, DataError
from fedskew.models.layout import as_model_format, is_channels_last


@functools.lru_cache(maxsize=256)
def _quantile_pairs_on(n: int, m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_quantile_pairs` on ``device``, kept: a condensation asks for the same sizes at every step.
    Made outside any inference mode, so that autograd may save them whatever mode asked first."""
    with torch.inference_mode(False):
        ia, ib, w = _quantile_pairs(n, m)
        return ia.to(device), ib.to(device), w.to(device)


def _quantile_pairs(n: int, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index into sorted a, index into sorted b, and weight of each piece of the merged quantile grid.

    Works in integer units of ``1 / (n m)``: the jumps of ``F_a^{-1}`` are the multiples of m, those
    of ``F_b^{-1}`` the multiples of n. On the piece starting at ``s`` (exclusive), ``F_a^{-1}`` is the
    ``(s // m)``-th smallest value of a and ``F_b^{-1}`` the ``(s // n)``-th of b.
    """
    ends = torch.unique(torch.cat([torch.arange(1, n + 1) * m, torch.arange(1, m + 1) * n]))
    starts = torch.cat([torch.zeros(1, dtype=ends.dtype), ends[:-1]])
    weights = (ends - starts).to(torch.float64) / (n * m)
    return starts // m, starts // n, weights


def sliced_wasserstein(
    a: torch.Tensor,
    b: torch.Tensor,
    num_projections: int = 128,
    generator: torch.Generator | None = None,
    p: int = 2,
) -> torch.Tensor:
    """Monte-Carlo sliced p-Wasserstein distance between the empirical measures of ``a`` and ``b``.

    Parameters
    ----------
    a, b
        Point sets (n, d) and (m, d), uniformly weighted; n and m may differ.
    num_projections
        Number of random directions.
    generator
        Draws the directions (``None``: a generator seeded with 0, so the same directions every call;
        pass a generator to redraw them each step).
    p
        Order of the distance (``p >= 1``).

    Returns
    -------
    torch.Tensor
        Scalar ``SW_p`` on ``a``'s device, in at least float32 (also under autocast),
        differentiable with respect to ``a`` and ``b``; 0 for identical sets. At exactly 0 the
        gradient of the root is taken as 0 (the minimum), not NaN. The directions are drawn on the
        CPU and moved, so a seed projects alike on every device.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise DataError(f"expected (n, d) and (m, d) point sets, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] == 0 or b.shape[0] == 0:
        raise DataError("sliced Wasserstein distance of an empty set")
    if num_projections < 1 or p < 1:
        raise ConfigError(f"need num_projections >= 1 and p >= 1, got {num_projections} and {p}")
    g = default_generator(generator)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    device = a.device
    # At least float32, also inside an autocast region (sorting bf16 projections would tie most values).
    with torch.autocast(device.type, enabled=False):
        theta = randn((a.shape[1], num_projections), g, device, dtype=dtype)
        theta = theta / theta.norm(dim=0, keepdim=True)
        pa = torch.sort(a.to(dtype) @ theta, dim=0).values
        pb = torch.sort(b.to(device=device, dtype=dtype) @ theta, dim=0).values
        ia, ib, w = _quantile_pairs_on(a.shape[0], b.shape[0], device)
        cost = ((pa[ia] - pb[ib]).abs() ** p * w.to(dtype)[:, None]).sum(dim=0)
        mean = cost.mean()
        positive = mean > 0
        safe = torch.where(positive, mean, torch.ones_like(mean))
        return torch.where(positive, safe ** (1.0 / p), torch.zeros_like(mean))


class ClassSWD:
    """FedAF's CDC term (Eq. 10) as a condensation's extra loss: ``weight * sum_c SWD(u_c, targets[c])``
    over the classes of the synthetic set that ``targets`` covers.

    ``u_c`` are the logits of the set's class-c images under the step's network in evaluation mode (one
    point an image; ``local = "mean"``: their mean, one point), ``targets[c]`` a ``(m, L)`` point set;
    ``generator`` draws ``projections`` new directions per class at every call, the classes in increasing
    order.
    """

    def __init__(
        self, targets: dict[int, torch.Tensor], weight: float, projections: int, local: str,
        generator: torch.Generator, p: int = 2,
    ) -> None:
        self.targets, self.weight, self.projections = targets, weight, projections
        self.local, self.generator, self.p = local, generator, p
        self._rows: dict[int, torch.Tensor] = {}  # the rows of each class, found once (labels do not change)
        self._seen: list[torch.Tensor] = []

    def rows(self, labels: torch.Tensor) -> dict[int, torch.Tensor]:
        """The rows of each class that the term covers, in increasing class order."""
        if not self._seen or self._seen[0] is not labels:  # reading the labels waits for the device: once
            self._seen[:] = [labels]
            self._rows.clear()
            for c in sorted(set(labels.tolist()) & self.targets.keys()):
                self._rows[c] = torch.nonzero(labels == c).flatten()
        return self._rows

    def __call__(self, model: torch.nn.Module, syn: SyntheticSet) -> torch.Tensor:
        rows = self.rows(syn.labels)
        was_training = model.training
        model.eval()
        logits = model(as_model_format(syn.images, is_channels_last(model)))
        model.train(was_training)
        total = torch.zeros((), device=logits.device)
        for c, r in rows.items():
            u = logits[r]
            if self.local == "mean":
                u = u.mean(dim=0, keepdim=True)
            total = total + sliced_wasserstein(u, self.targets[c], self.projections, self.generator, self.p)
        return self.weight * total
