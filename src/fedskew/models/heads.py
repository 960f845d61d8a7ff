"""Classifier heads that a method puts on a model in place of its last linear layer.

A method whose model differs from the ``[model]`` only in its head (FedETF's fixed simplex ETF) names the
head in the :class:`~fedskew.algorithms.base.ModelSpec` (``ModelSpec.head``), so every process that builds
the run's model from the spec (the server, the workers, a Flower node, the global evaluation, a resumed
run) builds the same one. Heads register a factory ``f(model, num_classes=..., **options) -> FedModel`` in
:data:`HEADS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.core.registry import Registry
from fedskew.core.seeding import torch_generator
from fedskew.models.registry import FedModel

HEADS: Registry[Callable[..., FedModel]] = Registry("head")
"""Head factories by name, called as ``f(model, num_classes=..., **options)``; they replace ``model.classifier``."""


def attach_head(model: FedModel, head: tuple[tuple[str, Any], ...], num_classes: int) -> FedModel:
    """``model`` with the head ``head`` describes (``(("kind", name), (option, value), ...)``)."""
    options = dict(head)
    kind = options.pop("kind")
    return HEADS.get(kind)(model, num_classes=num_classes, **options)


def simplex_etf(num_classes: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """A simplex equiangular tight frame: ``num_classes`` unit vectors in R^dim (the rows of the result,
    ``(K, dim)``) whose pairwise inner products are all ``-1/(K-1)``; needs ``dim >= K - 1``.

    The K rows of ``sqrt(K/(K-1)) (I - 11^T/K)`` are such vectors, in the (K-1)-dimensional subspace of R^K
    orthogonal to ``1``. In an orthonormal basis ``U`` (K x (K-1)) of that subspace their coordinates are the
    rows of ``sqrt(K/(K-1)) U``; a random ``dim x (K-1)`` matrix ``R`` with orthonormal columns then places
    them in R^dim (``sqrt(K/(K-1)) U R^T``). Both bases come from QR factorisations of Gaussian draws of
    ``generator``, in float64, so the frame is the same wherever it is built from the same stream. (The
    authors' ``Proto_Classifier`` takes ``P (I - 11^T/K)`` with a random P of orthonormal columns, which
    needs ``dim >= K``; this is the same frame up to a rotation and also allows ``dim = K - 1``.)
    """
    k = num_classes
    if k < 2 or dim < k - 1:
        raise ConfigError(f"a simplex ETF of {k} classes needs at least 2 classes and dim >= {k - 1}, got dim={dim}")
    z = torch.randn(k, k, generator=generator, dtype=torch.float64)
    z[:, 0] = 1.0  # the first basis vector is 1/sqrt(K): the other K-1 span its orthogonal complement
    q, _ = torch.linalg.qr(z)
    u = q[:, 1:]
    r, _ = torch.linalg.qr(torch.randn(dim, k - 1, generator=generator, dtype=torch.float64))
    return (math.sqrt(k / (k - 1)) * u @ r.T).to(torch.float32)


class ETFClassifier(nn.Module):
    """FedETF's head: ``logits = beta * <v_c, h / ||h||>``, with ``h = projection(z)`` and the fixed ETF ``v_c``.

    ``etf`` (``(K, dim)``) is a buffer, so no optimiser ever changes it; ``projection`` (a linear layer with
    bias) and the temperature ``beta`` (shape ``(1,)``) are parameters.
    """

    etf: torch.Tensor

    def __init__(self, in_features: int, num_classes: int, dim: int, temperature: float,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.in_features = in_features
        self.projection = nn.Linear(in_features, dim)
        self.temperature = nn.Parameter(torch.full((1,), float(temperature)))
        self.register_buffer("etf", simplex_etf(num_classes, dim, generator))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = F.normalize(self.projection(z), dim=1, eps=1e-12)
        return self.temperature * (h @ self.etf.T)

    @contextmanager
    def etf_trainable(self) -> Iterator[None]:
        """Within the block ``etf`` is a parameter (requires_grad off until a caller turns it on), so local
        fine-tuning can move it; afterwards it is a buffer again, with the values it was given."""
        value = self._buffers.pop("etf")
        assert value is not None
        self.etf = nn.Parameter(value.detach().clone(), requires_grad=False)
        try:
            yield
        finally:
            param = self._parameters.pop("etf")
            assert param is not None
            self.register_buffer("etf", param.detach())


@HEADS.register("etf")
def etf_head(model: FedModel, *, num_classes: int, dim: int, temperature: float, seed: int) -> FedModel:
    """Replace ``model.classifier`` by an :class:`ETFClassifier`; the frame comes from the run's seed only."""
    model.classifier = ETFClassifier(  # type: ignore[assignment]
        model.embed_dim, num_classes, dim, temperature, torch_generator(seed, "fedetf", "etf")
    )
    return model
