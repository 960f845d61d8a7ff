"""Client clustering for hybrid FL (HFLDD, FedSeq) and the HFLDD paper's analytic traffic formulas.

HFLDD (Shi et al., "Dataset Distillation-based Hybrid Federated Learning on Non-IID Data",
``papers/hfldd-dataset-distillation-hybrid-fl.txt``; formulas restored in ``SPEC.md`` section 2) groups
clients by the soft labels their pre-trained models give a public dataset:

1. :func:`soft_label_divergence` builds A_ij = divergence(P_i, P_j) (Eq. 4);
2. :func:`homogeneous_clusters` runs K-means on the rows of A (Algorithm 1);
3. :func:`heterogeneous_clusters` draws one client from each homogeneous cluster per new cluster, and
   :func:`pick_headers` chooses a random header for each.

:func:`random_clusters` is FedSeq's default grouping. :func:`fedavg_cost_bits`,
:func:`hfldd_cost_bits` and :func:`fedseq_cost_bits` are the papers' closed-form communication costs
(HFLDD Eqs. 3, 6 and 7), for the traffic-to-target tables next to the engine's byte ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from fedskew.core.errors import ConfigError

Divergence = Literal["kl", "symmetric_kl", "js"]
PROB_FLOOR = 1e-12
"""Soft labels are clipped to this before taking logs: a confident softmax underflows to 0 in float32,
and KL with a zero in the second argument is infinite, which K-means cannot use."""


def _normalised(soft_labels: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(soft_labels, dtype=np.float64), PROB_FLOOR, None)
    return p / p.sum(axis=-1, keepdims=True)


def _kl_matrix(p: np.ndarray) -> np.ndarray:
    """KL(P_i || P_j) summed over samples, for all pairs: sum P_i log P_i - sum P_i log P_j."""
    flat = p.reshape(p.shape[0], -1)
    logs = np.log(flat)
    self_term = np.sum(flat * logs, axis=1)
    return np.asarray(self_term[:, None] - flat @ logs.T)


def soft_label_divergence(soft_labels: np.ndarray, kind: Divergence = "kl") -> np.ndarray:
    """The HFLDD similarity matrix A (Eq. 4, restored in SPEC 2) of N clients' soft labels.

    Parameters
    ----------
    soft_labels
        (N, |D_p|, L): P_k[x, l], client k's predicted probability that public sample x is of class l.
    kind
        ``"kl"``: A_ij = sum_x KL(P_i(x) || P_j(x)), the paper's (asymmetric) choice.
        ``"symmetric_kl"``: A_ij = KL(P_i || P_j) + KL(P_j || P_i) (Jeffreys divergence).
        ``"js"``: A_ij = sum_x JS(P_i(x), P_j(x)), Jensen-Shannon with the mixture M = (P_i + P_j) / 2,
        symmetric and bounded by |D_p| log 2.

    Returns
    -------
    numpy.ndarray
        (N, N) float64, zero on the diagonal. Probabilities are floored at :data:`PROB_FLOOR` and
        renormalised first.
    """
    p = _normalised(soft_labels)
    if p.ndim != 3:
        raise ConfigError(f"soft labels must be (clients, samples, classes), got shape {p.shape}")
    if kind == "kl":
        out = _kl_matrix(p)
    elif kind == "symmetric_kl":
        kl = _kl_matrix(p)
        out = kl + kl.T
    elif kind == "js":
        n = p.shape[0]
        out = np.zeros((n, n))
        entropy_term = np.sum(p * np.log(p), axis=(1, 2))
        for i in range(n):
            mix = (p[i][None] + p) / 2
            cross = np.sum((p[i][None] + p) * np.log(mix), axis=(1, 2))
            out[i] = 0.5 * (entropy_term[i] + entropy_term) - 0.5 * cross
    else:
        raise ConfigError(f"divergence must be 'kl', 'symmetric_kl' or 'js', got {kind!r}")
    np.fill_diagonal(out, 0.0)
    return np.maximum(out, 0.0)


def homogeneous_clusters(similarity: np.ndarray, k: int, seed: int, n_init: int = 10) -> list[list[int]]:
    """K-means on the rows of A: clients with similar label knowledge together (HFLDD Algorithm 1).

    Each client is the point A[i, :] (its divergences to every client), so two clients fall together
    when they differ from everyone else alike. ``k`` is capped at the number of clients. Clusters are
    returned as sorted client positions (rows of A), ordered by their smallest member, so the result
    does not depend on K-means' arbitrary label numbering.
    """
    from sklearn.cluster import KMeans

    a = np.asarray(similarity, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ConfigError(f"similarity must be a non-empty square matrix, got shape {a.shape}")
    if k < 1:
        raise ConfigError(f"the number of homogeneous clusters must be at least 1, got {k}")
    k = min(k, a.shape[0])
    labels = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(a)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def heterogeneous_clusters(homogeneous: Sequence[Sequence[int]], rng: np.random.Generator) -> list[list[int]]:
    """Form clusters of mutually different clients by repeated sampling (HFLDD Algorithm 1).

    While some homogeneous cluster is non-empty, one new cluster is made of one client drawn at random
    (and removed) from every non-empty homogeneous cluster. There are as many heterogeneous clusters as
    the largest homogeneous cluster has members; the later ones may be smaller (the paper's isolated
    nodes, Sec. VI).
    """
    pools = [list(g) for g in homogeneous if len(g) > 0]
    out: list[list[int]] = []
    while pools:
        cluster = [pool.pop(int(rng.integers(len(pool)))) for pool in pools]
        out.append(cluster)
        pools = [pool for pool in pools if pool]
    return out


def pick_headers(clusters: Sequence[Sequence[int]], rng: np.random.Generator) -> list[int]:
    """One member of each cluster, drawn uniformly: the cluster header (HFLDD Sec. IV-B2)."""
    return [int(c[int(rng.integers(len(c)))]) for c in clusters]


def random_clusters(num_clients: int, num_clusters: int, rng: np.random.Generator) -> list[list[int]]:
    """Clients shuffled and cut into ``num_clusters`` groups of sizes differing by at most one.

    FedSeq's default grouping (HFLDD Sec. V-A3 uses 10 random clusters of 10 clients); capped at one
    client per cluster. The order inside a group is the ring order of sequential training.
    """
    if num_clusters < 1:
        raise ConfigError(f"num_clusters must be at least 1, got {num_clusters}")
    perm = rng.permutation(num_clients)
    return [[int(c) for c in part] for part in np.array_split(perm, min(num_clusters, num_clients))]


# ---- analytic communication costs (HFLDD Sec. IV-C and V-C) -----------------------------------------


def fedavg_cost_bits(rounds: int, clients: int, model_params: int, bits: int = 32) -> int:
    """FedAvg's cost 2 * T * N * |w| * b (HFLDD Eq. 3): every client downloads and uploads the model."""
    return 2 * rounds * clients * model_params * bits


def hfldd_cost_bits(
    clients: int,
    public_size: int,
    num_classes: int,
    distilled_sizes: Sequence[int],
    pixels: int,
    rounds: int,
    headers: int,
    model_params: int,
    bits: int = 32,
) -> int:
    """HFLDD's cost N |D_p| L b + sum_k |S_k| * pixels * 8 + 2 T H |w| b (HFLDD Eq. 6, restored).

    Parameters
    ----------
    clients, public_size, num_classes
        N soft-label uploads of a |D_p| x L matrix of ``bits``-bit numbers.
    distilled_sizes
        |S_k|, images each non-header member sends to its header.
    pixels
        Values per image, C * H * W (8 bits each: "1 x 8 bits or 3 x 8 bits for each gray-scale or RGB
        pixel").
    rounds, headers, model_params
        T rounds of model download and upload between the server and the H headers.
    bits
        b, bits per number (32).
    """
    soft = clients * public_size * num_classes * bits
    distilled = sum(distilled_sizes) * pixels * 8
    return soft + distilled + 2 * rounds * headers * model_params * bits


def fedseq_cost_bits(rounds: int, clusters: int, cluster_size: int, model_params: int, bits: int = 32) -> int:
    """FedSeq's cost T * M * (n + 1) * |w| * b for M clusters of n clients.

    HFLDD's Eq. 7 lost its symbols in the extracted text; this is the count it describes ("parameter
    sharing between clients within cluster and across clusters") for the ring we implement: per round
    and cluster, the server sends the model to the first client, n - 1 client-to-client handoffs, and
    the last client uploads it.
    """
    return rounds * clusters * (cluster_size + 1) * model_params * bits
