"""HFLDD's clustering pieces and the papers' analytic communication costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedskew.components.clustering import (
    fedavg_cost_bits,
    fedseq_cost_bits,
    heterogeneous_clusters,
    hfldd_cost_bits,
    homogeneous_clusters,
    pick_headers,
    random_clusters,
    soft_label_divergence,
)
from fedskew.core.errors import ConfigError

P1 = [0.5, 0.5]
P2 = [0.9, 0.1]


def test_divergences_by_hand() -> None:
    soft = np.array([[P1, P1], [P2, P2]])  # two clients, two public samples, two classes
    kl12 = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    kl21 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    a = soft_label_divergence(soft, "kl")
    assert a[0, 1] == pytest.approx(2 * kl12) and a[1, 0] == pytest.approx(2 * kl21)  # summed over samples
    assert a[0, 0] == 0 and a[1, 1] == 0
    sym = soft_label_divergence(soft, "symmetric_kl")
    assert sym[0, 1] == pytest.approx(2 * (kl12 + kl21)) and sym[1, 0] == sym[0, 1]
    mix = [0.7, 0.3]
    kl_p1_mix = sum(p * math.log(p / m) for p, m in zip(P1, mix, strict=True))
    kl_p2_mix = sum(q * math.log(q / m) for q, m in zip(P2, mix, strict=True))
    js = 0.5 * kl_p1_mix + 0.5 * kl_p2_mix
    jsm = soft_label_divergence(soft, "js")
    assert jsm[0, 1] == pytest.approx(2 * js) and jsm[1, 0] == pytest.approx(2 * js)
    with pytest.raises(ConfigError):
        soft_label_divergence(soft, "cosine")  # type: ignore[arg-type]


def test_divergence_survives_zero_probabilities() -> None:
    soft = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    a = soft_label_divergence(soft)
    assert np.isfinite(a).all() and a[0, 1] > 20  # floored at 1e-12: log(1e12) = 27.6


def test_homogeneous_clusters_recover_blocks() -> None:
    # Clients 0, 2, 4 alike; 1, 3 alike; 5 alone: small divergence inside a group, large across.
    group = [0, 1, 0, 1, 0, 2]
    a = np.array([[0.0 if gi == gj else 10.0 + i + j for j, gj in enumerate(group)] for i, gi in enumerate(group)])
    clusters = homogeneous_clusters(a, 3, seed=0)
    assert clusters == [[0, 2, 4], [1, 3], [5]]
    assert len(homogeneous_clusters(a, 10, seed=0)) == 6  # K capped at the number of clients


def test_heterogeneous_clusters_take_one_from_each_homogeneous() -> None:
    homogeneous = [[0, 1, 2], [3, 4], [5], []]
    rng = np.random.default_rng(0)
    clusters = heterogeneous_clusters(homogeneous, rng)
    assert [len(c) for c in clusters] == [3, 2, 1]
    assert sorted(c for cluster in clusters for c in cluster) == list(range(6))
    which = {c: k for k, g in enumerate(homogeneous) for c in g}
    for cluster in clusters:
        assert len({which[c] for c in cluster}) == len(cluster)  # no two from one homogeneous cluster
    headers = pick_headers(clusters, rng)
    assert all(h in c for h, c in zip(headers, clusters, strict=True))


def test_random_clusters() -> None:
    clusters = random_clusters(23, 10, np.random.default_rng(0))
    assert sorted(len(c) for c in clusters) == [2] * 7 + [3] * 3
    assert sorted(c for g in clusters for c in g) == list(range(23))
    assert len(random_clusters(4, 10, np.random.default_rng(0))) == 4
    with pytest.raises(ConfigError):
        random_clusters(4, 0, np.random.default_rng(0))


def test_analytic_costs() -> None:
    # FedAvg (Eq. 3): 2 T N |w| b.
    assert fedavg_cost_bits(rounds=3, clients=100, model_params=1000) == 2 * 3 * 100 * 1000 * 32
    # HFLDD (Eq. 6): soft labels of 100 clients (1000 x 10 floats), 90 members x 10 grey 28x28 images,
    # then 3 rounds between the server and 10 headers.
    bits = hfldd_cost_bits(
        clients=100, public_size=1000, num_classes=10, distilled_sizes=[10] * 90, pixels=784,
        rounds=3, headers=10, model_params=1000,
    )
    assert bits == 100 * 1000 * 10 * 32 + 900 * 784 * 8 + 2 * 3 * 10 * 1000 * 32
    # FedSeq: per round and cluster, one download, n - 1 handoffs, one upload.
    assert fedseq_cost_bits(rounds=2, clusters=10, cluster_size=10, model_params=1000) == 2 * 10 * 11 * 1000 * 32
