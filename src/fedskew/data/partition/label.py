"""Label and size skews (and the IID control): who holds how many samples of which class."""

from __future__ import annotations

from typing import Literal

import numpy as np

from fedskew.core.errors import ConfigError
from fedskew.core.params import minimums
from fedskew.data.partition.base import (
    PARTITIONERS,
    Partition,
    PartitionParams,
    by_class,
    finish,
)


@PARTITIONERS.register("iid", params=PartitionParams)
def iid(labels: np.ndarray, rng: np.random.Generator, p: PartitionParams, domains: np.ndarray | None) -> Partition:
    """Uniform random split into sizes that differ by at most one: the no-skew control."""
    chunks = np.array_split(rng.permutation(len(labels)), p.num_clients)
    return Partition(finish([[c] for c in chunks]))


class DirichletParams(PartitionParams, kw_only=True):
    """Options of ``dirichlet``.

    Attributes
    ----------
    alpha
        Concentration, > 0 (papers: 0.02 to 1); required.
    min_size
        The whole draw is repeated while some client holds fewer samples, because tiny clients
        make local training and per-client metrics meaningless. Capped at half the mean client
        size, ``max(1, N // (2 M))``, because the default of 10 is unreachable once ``N / M``
        nears 10; the cap never goes below 1, so no client is left empty unless the user asks
        for ``min_size=0``. The cap only matters for small datasets or many clients (CIFAR-10
        over 200 clients keeps 10). Close to the cap, many redraws may be needed.
    max_retries
        Draws to try before giving up with a :class:`ConfigError`.
    """

    alpha: float
    min_size: int = 10
    max_retries: int = 1000

    at_least = minimums(min_size=0, max_retries=1)
    positive = ("alpha",)


@PARTITIONERS.register("dirichlet", params=DirichletParams)
def dirichlet(
    labels: np.ndarray, rng: np.random.Generator, p: DirichletParams, domains: np.ndarray | None
) -> Partition:
    """Label skew: each class is spread over the clients by proportions drawn from Dir(alpha).

    This is the NIID-Bench procedure the FedDC, FedAF and class-imbalance papers use: for each
    class ``c``, ``p_c ~ Dir(alpha * 1_M)``; clients already holding at least ``N / M`` samples get
    proportion 0 (NIID-Bench's balancing trick, which keeps one client from collecting most of
    the data); the class's shuffled indices are cut at the cumulative proportions. Small
    ``alpha`` gives clients few classes; large ``alpha`` approaches IID. Client sizes vary too.
    See :class:`DirichletParams` for ``min_size`` and ``max_retries``.

    Notes
    -----
    With tiny ``alpha`` a class's proportions can be exactly zero for every client that still has
    room; that class is then split evenly among those clients instead of being dropped.
    """
    n, num_clients = len(labels), p.num_clients
    needed = min(p.min_size, max(1, n // (2 * num_clients)))
    classes = by_class(labels)
    for _ in range(p.max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx in classes:
            has_room = sizes < n / num_clients
            share = rng.dirichlet(np.full(num_clients, p.alpha)) * has_room
            share = share / share.sum() if share.sum() > 0 else has_room / has_room.sum()
            cuts = (np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= needed:
            return Partition(finish(parts))
    capped = f" (capped from {p.min_size})" if needed < p.min_size else ""
    raise ConfigError(
        f"dirichlet partition: no draw with alpha={p.alpha}, num_clients={num_clients} gave every client "
        f"at least min_size={needed}{capped} samples in {p.max_retries} tries; use a smaller "
        "partition.min_size, fewer clients or a larger alpha"
    )


class ClassesParams(PartitionParams, kw_only=True):
    """Options of ``classes_per_client``.

    Attributes
    ----------
    classes
        The number of distinct classes every client holds, >= 1; required.
    assignment
        How the classes are dealt. ``"balanced"`` (default): each client takes the ``classes``
        least-used classes so far (ties at random), so every class has the same number of holders
        give or take one. ``"niid_bench"``: NIID-Bench's ``noniid-#label<k>`` (Li, Diao, Chen & He,
        ICDE 2022, the paper's ``#C=k``; ``partition_data`` in the authors' ``utils.py``): client
        ``i``'s first class is ``i mod K`` (``K`` the number of classes), its other ``classes - 1``
        are drawn uniformly at random among the classes it does not hold yet, whatever other clients
        hold, so the number of holders of a class (and the clients' sizes) varies with the draw.
    """

    classes: int
    assignment: Literal["balanced", "niid_bench"] = "balanced"

    at_least = minimums(classes=1)


@PARTITIONERS.register("classes_per_client", params=ClassesParams)
def classes_per_client(
    labels: np.ndarray, rng: np.random.Generator, p: ClassesParams, domains: np.ndarray | None
) -> Partition:
    """Label skew: every client holds exactly ``classes`` distinct classes (HFLDD's ``C``,
    NIID-Bench's ``#C=k``).

    Classes are assigned client by client, by ``assignment`` (see :class:`ClassesParams`):
    ``"balanced"`` takes the ``classes`` least-used classes so far (ties broken at random), so
    every class is held by the same number of clients give or take one while the class
    combinations still vary with the seed; ``"niid_bench"`` follows NIID-Bench (first class
    ``client mod K``, the others uniformly at random), so a class can have one holder or many.
    Either way each class's shuffled samples are then split evenly (``numpy.array_split``, sizes
    differing by at most one) among its holders, in client order. ``classes=1`` is the extreme case
    (one class per client); ``classes`` equal to the number of classes gives every client every
    class.

    Only classes present in ``labels`` count (``K`` is their number; class ``j`` is the ``j``-th
    smallest label). If ``num_clients * classes`` is below the number of classes, some classes may
    have no holder and their samples are left unused (NIID-Bench fails there instead).
    """
    present = np.unique(labels)
    num_classes = len(present)
    if p.classes > num_classes:
        raise ConfigError(f"partition.classes={p.classes} exceeds the {num_classes} classes in the labels")
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    if p.assignment == "niid_bench":
        for client, held in enumerate(niid_bench_classes(p.num_clients, num_classes, p.classes, rng)):
            for k in held:
                holders[k].append(client)
    else:
        usage = np.zeros(num_classes, dtype=np.int64)
        for client in range(p.num_clients):
            # Integer usage plus a tie-breaker in [0, 1): least used first, random among equals.
            for k in np.argsort(usage + rng.random(num_classes))[: p.classes]:
                holders[k].append(client)
                usage[k] += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(p.num_clients)]
    for k, idx in enumerate(by_class(labels)):
        if not holders[k]:
            continue
        if len(idx) < len(holders[k]):
            raise ConfigError(
                f"class {present[k]} has {len(idx)} samples but {len(holders[k])} clients must hold it; "
                "use fewer clients or more partition.classes"
            )
        for client, chunk in zip(holders[k], np.array_split(rng.permutation(idx), len(holders[k])), strict=True):
            parts[client].append(chunk)
    return Partition(finish(parts))


def niid_bench_classes(num_clients: int, num_classes: int, classes: int, rng: np.random.Generator) -> list[list[int]]:
    """The classes (indices ``0 .. num_classes - 1``) each client holds under NIID-Bench's ``#C=k`` rule.

    As ``partition_data`` in NIID-Bench's ``utils.py`` (branch ``noniid-#label<k>``): client ``i``
    first takes class ``i mod num_classes``, then ``classes - 1`` more, each drawn uniformly among
    the classes it does not hold yet (NIID-Bench redraws ``random.randint(0, K - 1)`` until it hits
    a new class, which is the same distribution). The draws come from ``rng``, not from Python's
    ``random``, so the same seed does not give NIID-Bench's own partition, only one from the same
    distribution.
    """
    chosen: list[list[int]] = []
    for client in range(num_clients):
        held = [client % num_classes]
        for _ in range(classes - 1):
            rest = [k for k in range(num_classes) if k not in held]
            held.append(rest[int(rng.integers(len(rest)))])
        chosen.append(held)
    return chosen


class ShardsParams(PartitionParams, kw_only=True):
    """Options of ``shards``: ``shards_per_client`` (>= 1), the shards dealt to every client."""

    shards_per_client: int = 2

    at_least = minimums(shards_per_client=1)


@PARTITIONERS.register("shards", params=ShardsParams)
def shards(labels: np.ndarray, rng: np.random.Generator, p: ShardsParams, domains: np.ndarray | None) -> Partition:
    """Label skew of McMahan et al. (2017): sort by label, cut into shards, deal them out.

    The samples, sorted by label (shuffled within a class), are cut into
    ``num_clients * shards_per_client`` equal shards and each client gets ``shards_per_client``
    random shards. When class sizes are multiples of the shard size a client holds at most
    ``shards_per_client`` classes; otherwise a shard can straddle two classes, as in the
    original MNIST setup.
    """
    num_shards = p.num_clients * p.shards_per_client
    if num_shards > len(labels):
        raise ConfigError(
            f"{p.num_clients} clients x partition.shards_per_client={p.shards_per_client} = {num_shards} "
            f"shards exceed the {len(labels)} samples"
        )
    ordered = np.concatenate([rng.permutation(idx) for idx in by_class(labels)])
    pieces = np.array_split(ordered, num_shards)
    dealt = rng.permutation(num_shards).reshape(p.num_clients, p.shards_per_client)
    return Partition(finish([[pieces[s] for s in row] for row in dealt]))


class QuantityParams(PartitionParams, kw_only=True):
    """Options of ``quantity``: ``alpha`` (> 0), the concentration of the clients' Dirichlet size shares."""

    alpha: float = 0.5

    positive = ("alpha",)


@PARTITIONERS.register("quantity", params=QuantityParams)
def quantity(labels: np.ndarray, rng: np.random.Generator, p: QuantityParams, domains: np.ndarray | None) -> Partition:
    """Quantity skew: client sizes vary as Dir(alpha) shares, labels stay IID within a client.

    Every client first gets one sample, and the remaining ``N - M`` are shared out by a
    multinomial draw with Dir(alpha) probabilities, so no client is empty (NIID-Bench instead
    redraws until every client has 10 samples, which fails for small ``N / M``).
    """
    shares = rng.dirichlet(np.full(p.num_clients, p.alpha))
    sizes = 1 + rng.multinomial(len(labels) - p.num_clients, shares)
    chunks = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    return Partition(finish([[c] for c in chunks]))
