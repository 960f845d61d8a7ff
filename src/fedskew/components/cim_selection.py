"""The three class-imbalance-mitigation rules of Lee & Seo's paper, as plain functions.

Source: "Class Imbalance Mitigation in Federated Learning" (``papers/class-imbalance-mitigation-fl.txt``),
with the formulas the OCR garbled restored in ``SPEC.md`` section 3:

- intra-client oversampling (Algorithm 1): :func:`oversampled_counts`, :func:`oversample_indices`,
  :func:`next_delta`, :func:`oversampled_fraction`;
- inter-client selection and data allocation (Algorithm 2): :func:`select_clients`,
  :func:`kl_to_uniform`, :func:`allocate_indices`;
- dynamic batch size and learning rate (Algorithm 3): :func:`dynamic_batch_lr`.

They know nothing of the engine, so the tests can check each rule on hand-made class histograms; the
``cim`` algorithm (``fedskew/algorithms/cim.py``) wires them into rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedskew.core.errors import ConfigError

LrRule = Literal["arctan", "arctan_normalised"]


# ---- Algorithm 1: intra-client oversampling -------------------------------------------------------


def oversample_target(counts: np.ndarray, delta: float, r: int) -> float:
    """t_k = mu_k * exp(-delta * r), with mu_k = (1/L) sum_l n_k^l (Algorithm 1, line 1, restored).

    ``L`` is the number of classes of the task (``len(counts)``), not the number the client holds, so a
    client missing classes has a lower mean and oversamples less. The factor exp(-delta * r) shrinks the
    target as rounds go by, to stop duplicated samples from overfitting late in training (Sec. 4.1).
    """
    return float(np.sum(counts)) / len(counts) * math.exp(-delta * r)


def oversampled_counts(counts: np.ndarray, delta: float, r: int) -> np.ndarray:
    """Class counts after oversampling: each non-empty class below t_k is raised to ceil(t_k).

    Algorithm 1 duplicates random samples "until n_k^l >= t_k" for the non-empty classes (an empty class
    has nothing to duplicate). A client holding a single class is left alone (Sec. 5.2: the method "is
    skipped because [it] generates duplicate data elements in non-empty classes"); with mu_k over all L
    classes its one class is above t_k anyway.

    Parameters
    ----------
    counts
        n_k, samples per class (length L, non-negative integers).
    delta
        The oversampling exponent of this round.
    r
        The round index (from 1).
    """
    counts = np.asarray(counts, dtype=np.int64)
    nonempty = counts > 0
    if int(nonempty.sum()) <= 1:
        return counts.copy()
    target = math.ceil(oversample_target(counts, delta, r))
    return np.where(nonempty & (counts < target), target, counts)


def oversample_indices(labels: np.ndarray, num_classes: int, delta: float, r: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Indices into a client's data after oversampling: all samples once, plus random duplicates.

    The duplicates of class l are drawn uniformly with replacement from the client's class-l samples
    (random oversampling; the paper says only "randomly oversamples data elements"), as many as
    :func:`oversampled_counts` adds. Original samples come first, in order, so nothing is lost.
    """
    labels = np.asarray(labels)
    counts = np.bincount(labels, minlength=num_classes)
    extra = oversampled_counts(counts, delta, r) - counts
    parts = [np.arange(len(labels), dtype=np.int64)]
    for cls in np.flatnonzero(extra):
        members = np.flatnonzero(labels == cls)
        parts.append(rng.choice(members, size=int(extra[cls]), replace=True).astype(np.int64))
    return np.concatenate(parts)


def oversampled_fraction(oversampled_totals: list[float], original_totals: list[float]) -> float:
    """sum_k (sum_l n_k^l - |D_k|) / sum_k |D_k| over the selected clients (Algorithm 1, server line 1).

    ``oversampled_totals`` are the sums of the oversampled counts n_k, ``original_totals`` the |D_k|.
    Zero when no client reported (no evidence of oversampling).
    """
    total = float(sum(original_totals))
    if total <= 0:
        return 0.0
    return (float(sum(oversampled_totals)) - total) / total


def next_delta(delta: float, fraction: float, step: float, threshold: float) -> float:
    """delta + Delta if the previous round's oversampled fraction exceeds theta_over, else delta.

    Algorithm 1 (server lines 1-2): raising the exponent makes exp(-delta * r) decay faster, so the
    oversampling stops early once it inflates the training data by more than ``threshold``.
    """
    return delta + step if fraction > threshold else delta


# ---- Algorithm 2: client selection and data allocation ----------------------------------------------


def kl_to_uniform(v: np.ndarray) -> float:
    """KL(v/|v| || uniform) = sum_l p_l log(L p_l), natural log, 0 log 0 = 0 (Algorithm 2, line 23).

    The paper does not name the logarithm's base; natural log matches its KLD citation. An all-zero
    ``v`` has no distribution and gets +inf (it can never pass the threshold).
    """
    v = np.asarray(v, dtype=np.float64)
    total = v.sum()
    if total <= 0:
        return math.inf
    p = v[v > 0] / total
    return float(np.sum(p * np.log(p * len(v))))


@dataclass
class Selection:
    """Result of Algorithm 2.

    Attributes
    ----------
    clients
        Selected client ids, in the order they were taken.
    allocations
        s_k for each selected client (same order): samples per class it trains on this round.
    v
        The pooled training histogram v = sum_k s_k.
    kld
        KL(v/|v| || uniform) of the final v.
    """

    clients: list[int]
    allocations: list[np.ndarray]
    v: np.ndarray
    kld: float


def select_clients(counts: np.ndarray, max_clients: int, theta_kld: float,
                   rng: np.random.Generator | None = None) -> Selection:
    """Algorithm 2 (SPEC section 3): greedy selection filling the least-represented class.

    Clients are sorted by total count, descending; ties are broken in a random order drawn from ``rng``
    (lower id first without one). The paper does not say how ties go, and they matter: in a partition
    where every client holds the same amount (one class each, equal shares), a fixed order would pick
    the same h clients every round and never train on the others. The first gives v = n_k,
    s_k = n_k and the cap m = max(v). Then the candidates are visited in sorted order, as the paper's
    ``for each n_k in N`` loop does: for the candidate at hand, f = argmin_l v^l (lowest class index
    among ties); if n_i^f > 0 the client is taken with s_i^l = min(m - v^l, n_i^l) for every class l,
    and v += s_i, so no class exceeds m; otherwise it is passed over. Selection stops as soon as h
    clients are taken or KL(v/|v| || uniform) < theta_KLD (checked after every addition, the first
    included). When a pass over the list ends without stopping, a new pass starts from the top over
    the clients not yet taken (the paper's ``repeat ... until``); it ends early when a pass takes no
    one or v is full (every class at m, so nothing more can be added).

    Parameters
    ----------
    counts
        (K, L) class counts n_k reported by the candidate clients (oversampled when Algorithm 1 is on);
        row i belongs to client id i.
    max_clients
        h, the most clients to select (paper: 10).
    theta_kld
        theta_KLD, the KL divergence threshold (paper: 0.1).
    rng
        Orders clients of equal total at random (the ``cim`` algorithm passes the round's server stream);
        None keeps the id order.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ConfigError(f"counts must be a (clients, classes) table, got shape {counts.shape}")
    if max_clients < 1:
        raise ConfigError(f"max_clients must be at least 1, got {max_clients}")
    totals = counts.sum(axis=1)
    ids = np.arange(len(totals)) if rng is None else rng.permutation(len(totals))
    order = [int(i) for i in ids[np.argsort(-totals[ids], kind="stable")] if totals[i] > 0]
    v = np.zeros(counts.shape[1], dtype=np.int64)
    if not order:
        return Selection([], [], v, math.inf)
    first = order[0]
    v += counts[first]
    clients, allocations = [first], [counts[first].copy()]
    m = int(v.max())

    def done() -> bool:
        return len(clients) >= max_clients or kl_to_uniform(v) < theta_kld or int(v.min()) >= m

    while not done():
        took = False
        for i in order:
            if done():
                break
            if i in clients:
                continue
            f = int(np.argmin(v))
            if counts[i, f] > 0:
                s = np.minimum(m - v, counts[i])
                v += s
                clients.append(i)
                allocations.append(s)
                took = True
        if not took:
            break
    return Selection(clients, allocations, v, kl_to_uniform(v))


def allocate_indices(labels: np.ndarray, allocation: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Positions of ``s_k^l`` samples of each class l, drawn without replacement from ``labels``.

    ``labels`` are the labels of the client's (oversampled) training set; the result indexes into it.
    The paper says the client learns "the amount of training data received from the server" without
    saying which samples: we draw them uniformly.
    """
    labels = np.asarray(labels)
    parts = []
    for cls in np.flatnonzero(allocation):
        members = np.flatnonzero(labels == cls)
        want = int(allocation[cls])
        if want > len(members):
            raise ConfigError(f"allocation asks {want} samples of class {cls}, the client has {len(members)}")
        parts.append(rng.choice(members, size=want, replace=False).astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---- Algorithm 3: dynamic batch size and learning rate ---------------------------------------------


def dynamic_batch_lr(num_samples: int, beta: int, eta_max: float, rule: LrRule = "arctan") -> tuple[int, float]:
    """b_k = floor(sum_l s_k^l / beta) and lr_k = eta_max * arctan(b_k) (Algorithm 3).

    ``beta`` is the number of SGD updates per epoch the rule aims at (paper Table 2: 3 for case 1, 25
    for cases 2-4). The batch is at least 1 (the floor is 0 for a client with fewer than ``beta``
    samples; the paper does not say what to do then). As printed, arctan(b) exceeds 1 for b > 1.56, so
    lr_k reaches up to (pi/2) * eta_max; ``rule="arctan_normalised"`` uses eta_max * (2/pi) * arctan(b_k),
    which keeps lr_k below eta_max as the text intends ("does not exceed the maximum learning rate").
    """
    if beta < 1:
        raise ConfigError(f"beta must be at least 1, got {beta}")
    batch = max(1, int(num_samples) // beta)
    lr = eta_max * math.atan(batch)
    if rule == "arctan_normalised":
        lr *= 2.0 / math.pi
    elif rule != "arctan":
        raise ConfigError(f"lr_rule must be 'arctan' or 'arctan_normalised', got {rule!r}")
    return batch, lr
