"""Several partitioners at once, each over its own group of clients and its own part of the data."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedskew.core.errors import ConfigError
from fedskew.core.params import check
from fedskew.data.partition.base import PARTITIONERS, Partition, PartitionParams, run


class MixedParams(PartitionParams, kw_only=True):
    """Options of ``mixed``: ``groups`` (required), one table per group of clients.

    Each group is ``{name = <partitioner>, num_clients = <int>, <its options>}``, plus an optional
    ``share`` (a positive weight for the group's part of the data, default its ``num_clients``).
    The groups' ``num_clients`` must add up to ``num_clients``; a group has no ``seed`` of its own.
    """

    groups: list[dict[str, Any]]

    def __post_init__(self) -> None:
        super().__post_init__()
        check(len(self.groups) > 0, "groups", self.groups, "a non-empty list of tables")
        self.group_params: list[PartitionParams] = []
        self.shares: list[float] = []
        for i, group in enumerate(self.groups):
            if "name" not in group or "num_clients" not in group:
                raise ConfigError(f"groups[{i}] needs 'name' and 'num_clients', got {sorted(group)}")
            if "seed" in group:
                raise ConfigError(f"groups[{i}] has a seed; the partition's seed draws every group")
            table = {k: v for k, v in group.items() if k not in ("name", "share")}
            try:
                params = PARTITIONERS.build_params(group["name"], table)
            except ConfigError as exc:
                raise ConfigError(f"groups[{i}] ({group['name']}): {exc}") from None
            share = group.get("share", params.num_clients)
            valid = isinstance(share, int | float) and not isinstance(share, bool) and share > 0
            check(valid and math.isfinite(share), f"groups[{i}].share", share, "a number > 0")
            self.group_params.append(params)
            self.shares.append(float(share))
        total = sum(p.num_clients for p in self.group_params)
        if total != self.num_clients:
            raise ConfigError(f"groups: their num_clients add up to {total}, but num_clients={self.num_clients}")


@PARTITIONERS.register("mixed", params=MixedParams)
def mixed(labels: np.ndarray, rng: np.random.Generator, p: MixedParams, domains: np.ndarray | None) -> Partition:
    """Different skews for different groups of clients (the class-imbalance paper's case 2).

    The dataset is first split uniformly at random into one part per group, sized by share (by
    default proportional to the number of clients, so clients have about the same average size in
    every group), then each group's partitioner runs on its part. Clients are numbered group after
    group, in the order given.

    Example: ``[{"name": "classes_per_client", "num_clients": 180, "classes": 1},
    {"name": "dirichlet", "num_clients": 20, "alpha": 0.2}]``.
    """
    bounds = np.round(np.cumsum(p.shares) / sum(p.shares) * len(labels)).astype(np.int64)
    subsets = np.split(rng.permutation(len(labels)), bounds[:-1])
    indices: list[np.ndarray] = []
    noise: list[float] = []
    for i, (group, params, subset) in enumerate(zip(p.groups, p.group_params, subsets, strict=True)):
        try:
            part = run(group["name"], params, labels[subset], rng, None if domains is None else domains[subset])
        except ConfigError as exc:
            raise ConfigError(f"partition.groups[{i}] ({group['name']}): {exc}") from exc
        indices.extend(np.sort(subset[idx]) for idx in part.indices)
        noise.extend(part.noise_std or [0.0] * part.num_clients)
    return Partition(indices, noise if any(noise) else None)
