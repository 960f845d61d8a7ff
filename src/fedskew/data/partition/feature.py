"""Feature skews: Gaussian input noise growing with the client id, and one client per domain."""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar

import numpy as np

from fedskew.core.errors import ConfigError
from fedskew.core.params import check, minimums
from fedskew.data.partition.base import PARTITIONERS, Partition, PartitionParams, run

_SHARED = ("num_clients", "seed")


class NoiseParams(PartitionParams, kw_only=True):
    """Options of ``noise``.

    Attributes
    ----------
    sigma
        Noise std of the last client, >= 0; client ``i`` of ``M`` gets ``sigma * i / M``.
    base
        The partitioner that splits the data (any registered one).
    base_options
        The base partitioner's options. In a config table they sit beside ``sigma`` and ``base``
        (every key that is not one of noise's own lands here).
    """

    EXTRA_KEYS: ClassVar[str] = "base_options"

    sigma: float = 0.1
    base: str = "iid"
    base_options: dict[str, Any] = field(default_factory=dict)

    at_least = minimums(sigma=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.base in PARTITIONERS, "base", self.base, f"a partitioner ({', '.join(PARTITIONERS.names())})")
        own = [k for k in PARTITIONERS.keys(self.base) if k not in _SHARED]
        for key in self.base_options:
            if key not in own:
                allowed = ", ".join(["sigma", "base", *own, *_SHARED])
                raise ConfigError(
                    f"{key} is not a key of partitioner 'noise' with base {self.base!r}; allowed: {allowed}"
                )
        table = {**self.base_options, "num_clients": self.num_clients, "seed": self.seed}
        self.base_params: PartitionParams = PARTITIONERS.build_params(self.base, table)


@PARTITIONERS.register("noise", params=NoiseParams)
def noise(labels: np.ndarray, rng: np.random.Generator, p: NoiseParams, domains: np.ndarray | None) -> Partition:
    """Noise-based feature skew (NIID-Bench): client ``i`` gets noise std ``sigma * i / M``.

    The data is split by the ``base`` partitioner (any other registered one, with its own
    parameters passed alongside ``sigma`` and ``base``), so feature skew can be combined with
    label skew. Client 0 gets no noise and the noise level grows linearly with the client
    index, as in the NIID-Bench paper's ``Gau(sigma * i / N)``.
    """
    part = run(p.base, p.base_params, labels, rng, domains)
    if part.noise_std is not None:
        raise ConfigError(f"partition.base={p.base!r} already adds noise; noise cannot be stacked")
    return Partition(part.indices, [p.sigma * i / p.num_clients for i in range(p.num_clients)])


@PARTITIONERS.register("domain", params=PartitionParams)
def domain(labels: np.ndarray, rng: np.random.Generator, p: PartitionParams, domains: np.ndarray | None) -> Partition:
    """Feature skew by domain: client ``k`` holds all samples of the ``k``-th domain id (sorted).

    Used for DomainNet-style experiments (FedAF: 6 clients, one domain each). Nothing is random,
    so ``rng`` is unused.
    """
    if domains is None:
        raise ConfigError("partitioner 'domain' needs a dataset with domain ids")
    ids = np.unique(domains)
    if len(ids) != p.num_clients:
        raise ConfigError(f"partitioner 'domain' needs num_clients={len(ids)} (one per domain), got {p.num_clients}")
    return Partition([np.flatnonzero(domains == d).astype(np.int64) for d in ids])
