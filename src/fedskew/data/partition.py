"""Split a labelled training set among federated clients, IID or skewed.

Non-IID data is what fedskew is about, so every experiment starts here: a *partitioner* takes the
training labels and returns, per client, the indices of the samples that client holds. The skews
the papers use (see ``SPEC.md``) are all registered in :data:`PARTITIONERS`:

======================== ======================================================================
name                     skew
======================== ======================================================================
``iid``                  none: equal-size uniform random split (the control)
``dirichlet``            label and size skew: per class, client shares ~ Dir(alpha) (NIID-Bench)
``classes_per_client``   label skew: each client holds exactly ``classes`` classes (HFLDD's C)
``shards``               label skew: McMahan et al.'s sort-by-label shards
``quantity``             size skew only: client sizes ~ Dir(alpha), labels IID within a client
``mixed``                several partitioners, each over its own group of clients
``noise``                feature skew: a base split plus Gaussian input noise growing with the client id
``domain``               feature skew: one client per domain (e.g. DomainNet)
======================== ======================================================================

Use :func:`partition` rather than calling the registered functions: it validates the parameters
(so a typo in a config file fails loudly) and seeds the random generator, which makes every
partition a pure function of ``(name, labels, num_clients, seed, params)``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.registry import Registry

__all__ = ["PARTITIONERS", "Partition", "PartitionFn", "partition", "summarize"]


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


PartitionFn = Callable[..., Partition]
"""``fn(labels, num_clients, rng, *, domains=None, **params) -> Partition``."""

PARTITIONERS: Registry[PartitionFn] = Registry("partitioner")


# --------------------------------------------------------------------------------------------
# Entry point and parameter validation
# --------------------------------------------------------------------------------------------


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
        The partitioner's own parameters (``alpha``, ``classes`` ...). Unknown names raise
        :class:`ConfigError` instead of being ignored, so a misspelt config key is not silently
        replaced by a default.

    Returns
    -------
    Partition
    """
    labels = _check_labels(labels)
    if domains is not None:
        domains = np.asarray(domains)
        if domains.shape != labels.shape:
            raise DataError(f"domains has shape {domains.shape} but labels has shape {labels.shape}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    return _run(name, labels, num_clients, np.random.default_rng(seed), domains, params)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise DataError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0:
        raise DataError(f"labels must be non-negative, got {int(labels.min())}")
    return labels


def _run(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    domains: np.ndarray | None,
    params: Mapping[str, Any],
    extra_allowed: Sequence[str] = (),
) -> Partition:
    """Validate ``num_clients`` and ``params`` against partitioner ``name`` and run it.

    Shared by :func:`partition` and the composite partitioners (``mixed``, ``noise``), so nested
    parameters are checked the same way. ``extra_allowed`` lists the caller's own parameters, to
    name them too when reporting an unknown one.
    """
    fn = PARTITIONERS.get(name)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if num_clients > len(labels):
        raise ConfigError(
            f"num_clients={num_clients} exceeds the {len(labels)} training samples; "
            "every client needs at least one sample"
        )
    signature = list(inspect.signature(fn).parameters.values())
    keyword = [p for p in signature if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "domains"]
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature)
    if not forwards:  # a forwarding partitioner validates the rest itself via _run
        allowed = [*extra_allowed, *(p.name for p in keyword)]
        for key in params:
            if key not in allowed:
                raise ConfigError(
                    f"unknown parameter partition.{key} for partitioner {name!r}; "
                    f"allowed: {', '.join(allowed) or '(none)'}"
                )
    for p in keyword:
        if p.default is inspect.Parameter.empty and p.name not in params:
            raise ConfigError(f"partitioner {name!r} requires partition.{p.name}")
    return fn(labels, int(num_clients), rng, domains=domains, **params)


def _int_param(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"partition.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"partition.{key} must be >= {minimum}, got {value}")
    return int(value)


def _float_param(key: str, value: Any, *, strictly_positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"partition.{key} must be a number, got {value!r}")
    number = float(value)
    if strictly_positive and not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"partition.{key} must be > 0, got {value}")
    if not strictly_positive and not (number >= 0 and math.isfinite(number)):
        raise ConfigError(f"partition.{key} must be >= 0, got {value}")
    return number


def _by_class(labels: np.ndarray) -> list[np.ndarray]:
    """Indices of each class present in ``labels``, in class order (absent classes skipped)."""
    order = np.argsort(labels, kind="stable").astype(np.int64)
    _, counts = np.unique(labels, return_counts=True)
    return np.split(order, np.cumsum(counts)[:-1])


def _finish(parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate each client's chunks into one sorted ``int64`` array."""
    return [np.sort(np.concatenate(chunks)).astype(np.int64, copy=False) for chunks in parts]


# --------------------------------------------------------------------------------------------
# Partitioners
# --------------------------------------------------------------------------------------------


@PARTITIONERS.register("iid")
def iid(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, domains: np.ndarray | None = None
) -> Partition:
    """Uniform random split into sizes that differ by at most one: the no-skew control."""
    chunks = np.array_split(rng.permutation(len(labels)), num_clients)
    return Partition(_finish([[c] for c in chunks]))


@PARTITIONERS.register("dirichlet")
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    alpha: float,
    min_size: int = 10,
    max_retries: int = 1000,
) -> Partition:
    """Label skew: each class is spread over the clients by proportions drawn from Dir(alpha).

    This is the NIID-Bench procedure the FedDC, FedAF and class-imbalance papers use: for each
    class ``c``, ``p_c ~ Dir(alpha * 1_M)``; clients already holding at least ``N / M`` samples get
    proportion 0 (NIID-Bench's balancing trick, which keeps one client from collecting most of
    the data); the class's shuffled indices are cut at the cumulative proportions. Small
    ``alpha`` gives clients few classes; large ``alpha`` approaches IID. Client sizes vary too.

    Parameters
    ----------
    alpha
        Concentration, > 0 (papers: 0.02 to 1).
    min_size
        The whole draw is repeated while some client holds fewer samples, because tiny clients
        make local training and per-client metrics meaningless. Capped at half the mean client
        size, ``max(1, N // (2 M))``, because the default of 10 is unreachable once ``N / M``
        nears 10; the cap never goes below 1, so no client is left empty unless the user asks
        for ``min_size=0``. The cap only matters for small datasets or many clients (CIFAR-10
        over 200 clients keeps 10). Close to the cap, many redraws may be needed.
    max_retries
        Draws to try before giving up with a :class:`ConfigError`.

    Notes
    -----
    With tiny ``alpha`` a class's proportions can be exactly zero for every client that still has
    room; that class is then split evenly among those clients instead of being dropped.
    """
    alpha = _float_param("alpha", alpha, strictly_positive=True)
    min_size = _int_param("min_size", min_size, 0)
    max_retries = _int_param("max_retries", max_retries, 1)
    n = len(labels)
    needed = min(min_size, max(1, n // (2 * num_clients)))
    classes = _by_class(labels)
    for _ in range(max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx in classes:
            has_room = sizes < n / num_clients
            p = rng.dirichlet(np.full(num_clients, alpha)) * has_room
            p = p / p.sum() if p.sum() > 0 else has_room / has_room.sum()
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= needed:
            return Partition(_finish(parts))
    capped = f" (capped from {min_size})" if needed < min_size else ""
    raise ConfigError(
        f"dirichlet partition: no draw with alpha={alpha}, num_clients={num_clients} gave every client "
        f"at least min_size={needed}{capped} samples in {max_retries} tries; use a smaller "
        "partition.min_size, fewer clients or a larger alpha"
    )


@PARTITIONERS.register("classes_per_client")
def classes_per_client(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    classes: int,
) -> Partition:
    """Label skew: every client holds exactly ``classes`` distinct classes (HFLDD's ``C``).

    Classes are assigned client by client, each taking the ``classes`` least-used classes so far
    (ties broken at random), so every class is held by the same number of clients give or take
    one while the class combinations still vary with the seed. Each class's shuffled samples are
    then split evenly among its holders. ``classes=1`` is the extreme case (one class per
    client); ``classes`` equal to the number of classes gives every client every class.

    Only classes present in ``labels`` count. If ``num_clients * classes`` is below the number of
    classes, some classes have no holder and their samples are left unused.
    """
    present = np.unique(labels)
    num_classes = len(present)
    classes = _int_param("classes", classes, 1)
    if classes > num_classes:
        raise ConfigError(f"partition.classes={classes} exceeds the {num_classes} classes in the labels")
    usage = np.zeros(num_classes, dtype=np.int64)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(num_clients):
        # Integer usage plus a tie-breaker in [0, 1): least used first, random among equals.
        for k in np.argsort(usage + rng.random(num_classes))[:classes]:
            holders[k].append(client)
            usage[k] += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx in enumerate(_by_class(labels)):
        if not holders[k]:
            continue
        if len(idx) < len(holders[k]):
            raise ConfigError(
                f"class {present[k]} has {len(idx)} samples but {len(holders[k])} clients must hold it; "
                "use fewer clients or more partition.classes"
            )
        for client, chunk in zip(holders[k], np.array_split(rng.permutation(idx), len(holders[k])), strict=True):
            parts[client].append(chunk)
    return Partition(_finish(parts))


@PARTITIONERS.register("shards")
def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    shards_per_client: int = 2,
) -> Partition:
    """Label skew of McMahan et al. (2017): sort by label, cut into shards, deal them out.

    The samples, sorted by label (shuffled within a class), are cut into
    ``num_clients * shards_per_client`` equal shards and each client gets ``shards_per_client``
    random shards. When class sizes are multiples of the shard size a client holds at most
    ``shards_per_client`` classes; otherwise a shard can straddle two classes, as in the
    original MNIST setup.
    """
    shards_per_client = _int_param("shards_per_client", shards_per_client, 1)
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ConfigError(
            f"{num_clients} clients x partition.shards_per_client={shards_per_client} = {num_shards} "
            f"shards exceed the {len(labels)} samples"
        )
    ordered = np.concatenate([rng.permutation(idx) for idx in _by_class(labels)])
    pieces = np.array_split(ordered, num_shards)
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return Partition(_finish([[pieces[s] for s in row] for row in dealt]))


@PARTITIONERS.register("quantity")
def quantity(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    alpha: float = 0.5,
) -> Partition:
    """Quantity skew: client sizes vary as Dir(alpha) shares, labels stay IID within a client.

    Every client first gets one sample, and the remaining ``N - M`` are shared out by a
    multinomial draw with Dir(alpha) probabilities, so no client is empty (NIID-Bench instead
    redraws until every client has 10 samples, which fails for small ``N / M``).
    """
    alpha = _float_param("alpha", alpha, strictly_positive=True)
    shares = rng.dirichlet(np.full(num_clients, alpha))
    sizes = 1 + rng.multinomial(len(labels) - num_clients, shares)
    chunks = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    return Partition(_finish([[c] for c in chunks]))


@PARTITIONERS.register("mixed")
def mixed(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    groups: list[dict[str, Any]],
) -> Partition:
    """Different skews for different groups of clients (the class-imbalance paper's case 2).

    Each group is a dict ``{"name": <partitioner>, "num_clients": int, <its params>}``, plus an
    optional ``"share"`` (a positive weight for the group's part of the data, default its
    ``num_clients``). The dataset is first split uniformly at random into one part per group,
    sized by share (by default proportional to the number of clients, so clients have about the
    same average size in every group), then each group's partitioner runs on its part. Clients
    are numbered group after group, in the order given. Group sizes must add up to
    ``num_clients``.

    Example: ``[{"name": "classes_per_client", "num_clients": 180, "classes": 1},
    {"name": "dirichlet", "num_clients": 20, "alpha": 0.2}]``.
    """
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise ConfigError("partition.groups must be a non-empty list of tables")
    sizes: list[int] = []
    weights: list[float] = []
    for i, group in enumerate(groups):
        if "name" not in group or "num_clients" not in group:
            raise ConfigError(f"partition.groups[{i}] needs 'name' and 'num_clients', got {sorted(group)}")
        sizes.append(_int_param(f"groups[{i}].num_clients", group["num_clients"], 1))
        weights.append(_float_param(f"groups[{i}].share", group.get("share", sizes[-1]), strictly_positive=True))
    if sum(sizes) != num_clients:
        raise ConfigError(f"the groups' num_clients add up to {sum(sizes)}, but num_clients={num_clients}")
    bounds = np.round(np.cumsum(weights) / sum(weights) * len(labels)).astype(np.int64)
    subsets = np.split(rng.permutation(len(labels)), bounds[:-1])
    indices: list[np.ndarray] = []
    noise: list[float] = []
    for i, (group, subset) in enumerate(zip(groups, subsets, strict=True)):
        params = {k: v for k, v in group.items() if k not in ("name", "num_clients", "share")}
        try:
            part = _run(
                group["name"],
                labels[subset],
                group["num_clients"],
                rng,
                None if domains is None else domains[subset],
                params,
            )
        except ConfigError as exc:
            raise ConfigError(f"partition.groups[{i}] ({group['name']}): {exc}") from exc
        indices.extend(np.sort(subset[idx]) for idx in part.indices)
        noise.extend(part.noise_std or [0.0] * part.num_clients)
    return Partition(indices, noise if any(noise) else None)


@PARTITIONERS.register("noise")
def noise(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None = None,
    sigma: float = 0.1,
    base: str = "iid",
    **base_params: Any,
) -> Partition:
    """Noise-based feature skew (NIID-Bench): client ``i`` gets noise std ``sigma * i / M``.

    The data is split by the ``base`` partitioner (any other registered one, with its own
    parameters passed alongside ``sigma`` and ``base``), so feature skew can be combined with
    label skew. Client 0 gets no noise and the noise level grows linearly with the client
    index, as in the NIID-Bench paper's ``Gau(sigma * i / N)``.
    """
    sigma = _float_param("sigma", sigma, strictly_positive=False)
    part = _run(base, labels, num_clients, rng, domains, base_params, extra_allowed=("sigma", "base"))
    if part.noise_std is not None:
        raise ConfigError(f"partition.base={base!r} already adds noise; noise cannot be stacked")
    return Partition(part.indices, [sigma * i / num_clients for i in range(num_clients)])


@PARTITIONERS.register("domain")
def domain(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, domains: np.ndarray | None = None
) -> Partition:
    """Feature skew by domain: client ``k`` holds all samples of the ``k``-th domain id (sorted).

    Used for DomainNet-style experiments (FedAF: 6 clients, one domain each). Nothing is random,
    so ``rng`` is unused.
    """
    if domains is None:
        raise ConfigError("partitioner 'domain' needs a dataset with domain ids")
    ids = np.unique(domains)
    if len(ids) != num_clients:
        raise ConfigError(f"partitioner 'domain' needs num_clients={len(ids)} (one per domain), got {num_clients}")
    return Partition([np.flatnonzero(domains == d).astype(np.int64) for d in ids])


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


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
