"""The class-imbalance-mitigation rules (SPEC section 3) on hand-made class histograms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedskew.components.cim_selection import (
    allocate_indices,
    dynamic_batch_lr,
    kl_to_uniform,
    next_delta,
    oversample_indices,
    oversample_target,
    oversampled_counts,
    oversampled_fraction,
    select_clients,
)
from fedskew.core.errors import ConfigError

# Six clients over L = 4 classes. Sorted by total (ties: lower id first): 1 (12), 4 (12), 3 (9), 2 (7),
# 0 (5), 6 (1); client 5 holds nothing and is never a candidate.
COUNTS = np.array([
    [0, 0, 5, 0],   # 0
    [10, 2, 0, 0],  # 1
    [0, 0, 0, 7],   # 2
    [0, 9, 0, 0],   # 3
    [3, 3, 3, 3],   # 4
    [0, 0, 0, 0],   # 5
    [0, 0, 0, 1],   # 6
])


def kl_by_hand(v: list[float]) -> float:
    total = sum(v)
    return sum(x / total * math.log(len(v) * x / total) for x in v if x > 0)


def test_selection_fills_the_least_class_under_the_cap_and_stops_on_kl() -> None:
    # Client 1 first: v = [10, 2, 0, 0], m = 10, KL 0.94.
    # Client 4: f = argmin v = 2 (first of the tied zeros), n_4^2 = 3 > 0; s_4 = min(m - v, n_4)
    #   = min([0, 8, 10, 10], [3, 3, 3, 3]) = [0, 3, 3, 3] (class 0 is capped at m); v = [10, 5, 3, 3], KL 0.135.
    # Client 3: f = 2, n_3^2 = 0: passed over. Client 2: f = 2, n_2^2 = 0: passed over.
    # Client 0: f = 2, s_0 = [0, 0, 5, 0]; v = [10, 5, 8, 3], KL 0.0899 < 0.1: stop.
    sel = select_clients(COUNTS, max_clients=10, theta_kld=0.1)
    assert sel.clients == [1, 4, 0]
    assert [a.tolist() for a in sel.allocations] == [[10, 2, 0, 0], [0, 3, 3, 3], [0, 0, 5, 0]]
    assert sel.v.tolist() == [10, 5, 8, 3]
    assert kl_by_hand([10, 2, 0, 0]) > 0.1 and kl_by_hand([10, 5, 3, 3]) > 0.1
    assert sel.kld == pytest.approx(kl_by_hand([10, 5, 8, 3])) and sel.kld < 0.1


def test_ties_in_total_are_broken_at_random_but_larger_clients_still_come_first() -> None:
    # 40 one-class clients of equal size over 4 classes (client i holds class i % 4), plus one larger
    # client: it always comes first. A fixed order of ties would pick the same four clients each round.
    counts = np.zeros((41, 4), dtype=np.int64)
    counts[np.arange(40), np.arange(40) % 4] = 10
    counts[40] = [0, 20, 0, 0]
    picked: set[int] = set()
    for r in range(20):
        sel = select_clients(counts, max_clients=10, theta_kld=0.1, rng=np.random.default_rng(r))
        assert sel.clients[0] == 40
        assert sel.v.tolist() == [10, 20, 10, 10]  # one client per missing class, then KL 0.054 < 0.1
        picked.update(sel.clients)
    assert len(picked) > 20  # most clients are selected in some round
    same = select_clients(counts, 10, 0.1, rng=np.random.default_rng(3))
    assert same.clients == select_clients(counts, 10, 0.1, rng=np.random.default_rng(3)).clients
    assert select_clients(counts, 10, 0.1).clients == [40, 0, 2, 3]  # no rng: id order


def test_selection_stops_at_h_clients() -> None:
    sel = select_clients(COUNTS, max_clients=2, theta_kld=0.1)
    assert sel.clients == [1, 4]
    assert sel.v.tolist() == [10, 5, 3, 3]


def test_selection_visits_clients_in_sorted_order_and_starts_new_passes() -> None:
    # No KL stop (theta 0). After client 0 (v = [10, 5, 8, 3]) the pass goes on to client 6: f = 3,
    # s_6 = [0, 0, 0, 1], v = [10, 5, 8, 4]. The next pass starts at the top: client 3 (f = 3, no class 3)
    # is passed over, client 2 gets min([0, 5, 2, 6], [0, 0, 0, 7]) = [0, 0, 0, 6]; v = [10, 5, 8, 10].
    # A third pass: client 3, f = 1, gets [0, 5, 0, 0]; v = [10, 10, 8, 10]. Nobody is left.
    sel = select_clients(COUNTS, max_clients=10, theta_kld=0.0)
    assert sel.clients == [1, 4, 0, 6, 2, 3]
    assert [a.tolist() for a in sel.allocations] == [
        [10, 2, 0, 0], [0, 3, 3, 3], [0, 0, 5, 0], [0, 0, 0, 1], [0, 0, 0, 6], [0, 5, 0, 0],
    ]
    assert sel.v.tolist() == [10, 10, 8, 10]
    assert (sel.v <= 10).all()  # never above m


def test_selection_of_one_class_clients_takes_one_per_class_until_h() -> None:
    # Case 1/4 of the paper: one class per client; the selection needs a client of every class.
    counts = np.zeros((8, 4), dtype=np.int64)
    for cid, (cls, n) in enumerate([(0, 50), (0, 40), (1, 30), (1, 45), (2, 20), (2, 35), (3, 25), (3, 10)]):
        counts[cid, cls] = n
    # Sorted: 0 (50), 3 (45), 1 (40), 5 (35), 2 (30), 6 (25), 4 (20), 7 (10); m = 50.
    # f = 1 -> client 3 (45); f = 2 -> client 5 (35); f = 3 -> client 6 (25): v = [50, 45, 35, 25], KL 0.032.
    sel = select_clients(counts, max_clients=10, theta_kld=0.1)
    assert sel.clients == [0, 3, 5, 6]
    assert sel.v.tolist() == [50, 45, 35, 25]
    # With a tighter threshold it keeps filling: client 4 (class 2) is passed over (f = 3), client 7 adds
    # 10 to class 3 (v = [50, 45, 35, 35]). Next pass: clients 1 and 2 lack f = 2, client 4 adds
    # min(50 - 35, 20) = 15. Next pass: nobody left has class 3, so selection stops.
    sel = select_clients(counts, max_clients=10, theta_kld=0.001)
    assert sel.clients == [0, 3, 5, 6, 7, 4]
    assert sel.v.tolist() == [50, 45, 50, 35]
    assert sel.allocations[-1].tolist() == [0, 0, 15, 0]


def test_selection_edge_cases() -> None:
    assert select_clients(np.zeros((3, 2), dtype=np.int64), 10, 0.1).clients == []
    balanced = select_clients(np.array([[5, 5], [9, 0]]), 10, 0.1)
    assert balanced.clients == [0] and balanced.kld == 0.0  # the first client alone is uniform
    with pytest.raises(ConfigError):
        select_clients(np.zeros(3), 10, 0.1)
    assert kl_to_uniform(np.array([1, 0])) == pytest.approx(math.log(2))


def test_oversampling_targets() -> None:
    # n = [30, 2, 0, 0]: mu = 32 / 4 = 8, t = 8 exp(-0.01) = 7.92 -> class 1 raised to 8; class 2, 3 empty.
    assert oversample_target(np.array([30, 2, 0, 0]), 0.01, 1) == pytest.approx(8 * math.exp(-0.01))
    assert oversampled_counts(np.array([30, 2, 0, 0]), 0.01, 1).tolist() == [30, 8, 0, 0]
    # n = [10, 2, 0, 4]: mu = 4, t = 3.96 -> 4: class 1 raised, class 3 already there.
    assert oversampled_counts(np.array([10, 2, 0, 4]), 0.01, 1).tolist() == [10, 4, 0, 4]
    # The target decays with the round: delta 0.5, r = 2: t = 4 e^-1 = 1.47 -> nothing to add.
    assert oversampled_counts(np.array([10, 2, 0, 4]), 0.5, 2).tolist() == [10, 2, 0, 4]
    # Single-class clients are skipped.
    assert oversampled_counts(np.array([0, 7, 0, 0]), 0.0, 0).tolist() == [0, 7, 0, 0]


def test_oversample_indices_keep_every_sample_and_duplicate_within_class() -> None:
    labels = np.array([0] * 30 + [1] * 2)
    idx = oversample_indices(labels, 4, 0.01, 1, np.random.default_rng(0))
    assert idx[:32].tolist() == list(range(32))
    assert np.bincount(labels[idx], minlength=4).tolist() == [30, 8, 0, 0]
    again = oversample_indices(labels, 4, 0.01, 1, np.random.default_rng(0))
    assert (idx == again).all()


def test_delta_update_and_oversampled_fraction() -> None:
    # Two selected clients: oversampled totals 38 and 10 against |D_k| 32 and 10: 6 / 42 = 0.143 > 0.1.
    frac = oversampled_fraction([38, 10], [32, 10])
    assert frac == pytest.approx(6 / 42)
    assert next_delta(0.01, frac, 0.1, 0.1) == pytest.approx(0.11)
    assert next_delta(0.01, 0.1, 0.1, 0.1) == 0.01  # not above the threshold
    assert oversampled_fraction([], []) == 0.0


def test_allocate_indices_draws_the_allocation() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])
    idx = allocate_indices(labels, np.array([2, 1, 0]), np.random.default_rng(1))
    assert sorted(labels[idx].tolist()) == [0, 0, 1] and len(set(idx.tolist())) == 3
    with pytest.raises(ConfigError):
        allocate_indices(labels, np.array([0, 0, 2]), np.random.default_rng(1))


def test_dynamic_batch_and_lr_both_rules() -> None:
    # Case 1: 250 samples, beta = 3: b = floor(250 / 3) = 83, lr = 0.1 arctan(83) = 0.1558 (> eta_max as printed).
    b, lr = dynamic_batch_lr(250, 3, 0.1)
    assert b == 83 and lr == pytest.approx(0.1 * math.atan(83)) and lr > 0.1
    b, lr = dynamic_batch_lr(250, 3, 0.1, "arctan_normalised")
    assert b == 83 and lr == pytest.approx(0.1 * 2 / math.pi * math.atan(83)) and lr < 0.1
    # beta = 25, 300 samples: b = 12.
    assert dynamic_batch_lr(300, 25, 0.1)[0] == 12
    # Fewer samples than beta: the floor is 0, the batch 1.
    assert dynamic_batch_lr(10, 25, 0.1) == (1, pytest.approx(0.1 * math.atan(1)))
    with pytest.raises(ConfigError):
        dynamic_batch_lr(10, 0, 0.1)
