"""The partition result, the partitioner registry and its typed options, and the entry point :func:`partition`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.params import Options, check, maximums, minimums
from fedskew.core.registry import Registry

__all__ = ["PARTITIONERS", "Partition", "PartitionFn", "PartitionParams", "hold_out", "partition", "summarize"]


@dataclass
class Partition:
    """Which training samples each client holds.

    Attributes
    ----------
    indices
        One sorted ``int64`` array per client: indices into the training set. The arrays of one
        partition are disjoint, so no sample is seen by two clients.
    noise_std
        Per-client standard deviation of the Gaussian noise added to the *normalised* inputs
        (noise-based feature skew), or ``None`` when no client gets noise. Kept here rather than
        applied to the data so the partition stays a cheap list of indices and the data loader
        can draw fresh noise.
    """

    indices: list[np.ndarray]
    noise_std: list[float] | None = None

    def __post_init__(self) -> None:
        # A mismatch would silently give noise to the wrong clients downstream.
        if self.noise_std is not None and len(self.noise_std) != len(self.indices):
            raise ValueError(f"noise_std has {len(self.noise_std)} entries for {len(self.indices)} clients")

    @property
    def num_clients(self) -> int:
        """Number of clients, including any that hold no sample."""
        return len(self.indices)

    def class_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Count each client's samples per class.

        Parameters
        ----------
        labels
            Labels of the whole training set (the array the indices point into).
        num_classes
            Number of columns; passed explicitly so classes a partition leaves out still get a
            (zero) column and tables of different partitions line up.

        Returns
        -------
        numpy.ndarray
            ``(num_clients, num_classes)`` ``int64`` array.
        """
        labels = np.asarray(labels)
        if labels.size and int(labels.max()) >= num_classes:
            raise DataError(f"label {int(labels.max())} does not fit num_classes={num_classes}")
        counts = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for client, idx in enumerate(self.indices):
            counts[client] = np.bincount(labels[idx], minlength=num_classes)
        return counts


MAX_TEST_FRACTION = 0.9
"""The largest per-client test fraction (a client keeps at least a tenth of its samples to train on)."""


class PartitionParams(Options, kw_only=True):
    """Keys every ``[partition]`` table holds besides ``name``; each partitioner's Params adds its own.

    Attributes
    ----------
    num_clients : int
        Number of clients, >= 1 (and at most the number of training samples, checked on the data).
    seed : int or None
        Seed of the partition's random draws; ``None`` in a config derives it from the run seed
        (:func:`partition` itself needs one).
    client_test_fraction : float
        Fraction of each client's samples held out as that client's own test split (stratified by
        class within the client, seeded; see :func:`hold_out`). 0 (default): no per-client split, every
        sample trains. The partitioners ignore it; the engine splits their result.
    """

    num_clients: int
    seed: int | None = None
    client_test_fraction: float = 0.0

    at_least = minimums(num_clients=1, seed=0, client_test_fraction=0)
    at_most = maximums(client_test_fraction=MAX_TEST_FRACTION)


PartitionFn = Callable[[np.ndarray, np.random.Generator, Any, np.ndarray | None], Partition]
"""``fn(labels, rng, params, domains) -> Partition``, with the partitioner's Params instance ``params``."""

PARTITIONERS: Registry[PartitionFn] = Registry("partitioner", PartitionParams)


def partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    *,
    domains: np.ndarray | None = None,
    **params: Any,
) -> Partition:
    """Partition a training set with the registered partitioner ``name``.

    Parameters
    ----------
    name
        A key of :data:`PARTITIONERS`.
    labels
        1-D non-negative integer class labels of the training set.
    num_clients
        Number of clients; at least 1 and at most ``len(labels)``, since a client without data
        cannot train.
    seed
        Seed of the ``numpy.random.Generator`` the partitioner draws from; the same seed gives
        the same partition.
    domains
        Optional 1-D domain id per sample, needed by ``domain`` only.
    **params
        The partitioner's own parameters (``alpha``, ``classes`` ..., the fields of
        ``PARTITIONERS.params_of(name)``). Unknown names raise :class:`ConfigError` instead of being
        ignored, so a misspelt config key is not silently replaced by a default.

    Returns
    -------
    Partition
    """
    labels = _check_labels(labels)
    if domains is not None:
        domains = np.asarray(domains)
        if domains.shape != labels.shape:
            raise DataError(f"domains has shape {domains.shape} but labels has shape {labels.shape}")
    seed, num_clients = _plain(seed), _plain(num_clients)
    check(_is_int(seed) and seed >= 0, "seed", seed, "a non-negative integer")
    _check_fits(num_clients, labels)
    table = {**params, "num_clients": num_clients, "seed": seed}
    return run(name, PARTITIONERS.build_params(name, table, "partition."), labels, np.random.default_rng(seed), domains)


def run(
    name: str, params: PartitionParams, labels: np.ndarray, rng: np.random.Generator, domains: np.ndarray | None
) -> Partition:
    """Run partitioner ``name`` with its validated ``params`` on ``labels``, drawing from ``rng``.

    Shared by :func:`partition` and the composite partitioners (``mixed``, ``noise``).
    """
    _check_fits(params.num_clients, labels)
    return PARTITIONERS.get(name)(labels, rng, params, domains)


def hold_out(
    indices: Sequence[np.ndarray], labels: np.ndarray, fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's samples into its training and its own test indices.

    A client of ``n`` samples holds out ``round(fraction * n)`` of them (at least one when it has two or
    more samples and ``fraction > 0``, so that every client that can be tested is), spread over its
    classes in proportion to their counts (largest remainders; ties to the smaller class id). Which
    samples of a class are held out is drawn from ``seed``, client by client. Returns
    ``(train, test)``: one sorted ``int64`` array per client each; together they are the client's samples.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for ix in indices:
        ix = np.asarray(ix, dtype=np.int64)
        n = len(ix)
        k = round(fraction * n)
        if fraction > 0 and n >= 2:
            k = min(max(k, 1), n - 1)
        classes, counts = np.unique(labels[ix], return_counts=True)
        share = counts * (k / max(n, 1))
        take = np.floor(share).astype(np.int64)
        rest = np.argsort(-(share - take), kind="stable")[: k - int(take.sum())]
        take[rest] += 1
        held: list[np.ndarray] = []
        for c, t in zip(classes, take, strict=True):
            if t:
                members = ix[labels[ix] == c]
                held.append(rng.permutation(members)[:t])
        chosen = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
        test.append(chosen.astype(np.int64, copy=False))
        train.append(np.setdiff1d(ix, chosen, assume_unique=True).astype(np.int64, copy=False))
    return train, test


def _plain(value: Any) -> Any:
    """A numpy integer as a Python int (the options are checked as plain Python values)."""
    return int(value) if isinstance(value, np.integer) else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fits(num_clients: Any, labels: np.ndarray) -> None:
    if _is_int(num_clients) and num_clients > len(labels):
        raise ConfigError(
            f"num_clients={num_clients} exceeds the {len(labels)} training samples; "
            "every client needs at least one sample"
        )


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise DataError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0:
        raise DataError(f"labels must be non-negative, got {int(labels.min())}")
    return labels


def by_class(labels: np.ndarray) -> list[np.ndarray]:
    """Indices of each class present in ``labels``, in class order (absent classes skipped)."""
    order = np.argsort(labels, kind="stable").astype(np.int64)
    _, counts = np.unique(labels, return_counts=True)
    return np.split(order, np.cumsum(counts)[:-1])


def finish(parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate each client's chunks into one sorted ``int64`` array."""
    return [np.sort(np.concatenate(chunks)).astype(np.int64, copy=False) for chunks in parts]


def summarize(partition: Partition, labels: np.ndarray, num_classes: int) -> str:
    """Plain-text table of per-client class counts, for ``fedskew partition CONFIG``.

    One row per client and one column per class, plus a ``total`` column and a ``total`` row,
    so a user can check the skew of a config before spending compute on it.
    """
    counts = partition.class_counts(labels, num_classes)
    header = ["client", *(str(c) for c in range(num_classes)), "total"]
    rows = [[str(i), *map(str, row), str(row.sum())] for i, row in enumerate(counts)]
    rows.append(["total", *map(str, counts.sum(axis=0)), str(counts.sum())])
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows])
