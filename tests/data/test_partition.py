"""Tests of the partitioners: each one's defining property, determinism and error messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.registry import Registry
from fedskew.data.partition import PARTITIONERS, Partition, PartitionParams, partition, summarize
from fedskew.data.partition_plot import bubble_plot, heatmap_plot, partition_plot

LABELS = np.repeat(np.arange(10), 100)  # 1,000 samples, 10 balanced classes

CASE_2 = [
    {"name": "classes_per_client", "num_clients": 180, "classes": 1},
    {"name": "dirichlet", "num_clients": 20, "alpha": 0.2},
]


def assert_disjoint(part: Partition, n: int, *, covering: bool) -> None:
    """Clients' index arrays are sorted int64, in range and disjoint (and cover all if asked)."""
    for idx in part.indices:
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)
    everything = np.concatenate(part.indices)
    assert len(np.unique(everything)) == len(everything)
    assert everything.size == 0 or (everything.min() >= 0 and everything.max() < n)
    if covering:
        assert len(everything) == n


def classes_held(part: Partition, labels: np.ndarray) -> list[int]:
    return [int((row > 0).sum()) for row in part.class_counts(labels, int(labels.max()) + 1)]


@st.composite
def labels_and_clients(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    per_class = draw(st.lists(st.integers(1, 40), min_size=2, max_size=8))
    labels = np.repeat(np.arange(len(per_class)), per_class)
    num_clients = draw(st.integers(1, min(len(labels), 25)))
    return labels, num_clients, draw(st.integers(0, 2**32 - 1))


COVERING: dict[str, dict[str, Any]] = {
    "iid": {},
    "dirichlet": {"alpha": 0.5, "min_size": 0},
    "quantity": {"alpha": 0.5},
    "shards": {"shards_per_client": 1},
}


@pytest.mark.parametrize("name", sorted(COVERING))
@settings(max_examples=30, deadline=None)
@given(case=labels_and_clients())
def test_covering_partitioners_are_disjoint_and_use_every_sample(name: str, case: tuple[np.ndarray, int, int]) -> None:
    labels, num_clients, seed = case
    part = partition(name, labels, num_clients, seed, **COVERING[name])
    assert part.num_clients == num_clients
    assert part.noise_std is None
    assert_disjoint(part, len(labels), covering=True)


@settings(max_examples=30, deadline=None)
@given(case=labels_and_clients())
def test_iid_sizes_differ_by_at_most_one(case: tuple[np.ndarray, int, int]) -> None:
    labels, num_clients, seed = case
    sizes = [len(i) for i in partition("iid", labels, num_clients, seed).indices]
    assert max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------------------------- dirichlet


def mean_label_entropy(part: Partition, labels: np.ndarray) -> float:
    counts = part.class_counts(labels, 10).astype(float)
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.mean(-np.nansum(p * np.log(p), axis=1)))


def test_dirichlet_smaller_alpha_is_more_skewed() -> None:
    skewed = partition("dirichlet", LABELS, 10, 0, alpha=0.05, min_size=1)
    near_iid = partition("dirichlet", LABELS, 10, 0, alpha=100.0)
    assert mean_label_entropy(skewed, LABELS) < 0.5 * mean_label_entropy(near_iid, LABELS)
    assert np.mean(classes_held(skewed, LABELS)) < np.mean(classes_held(near_iid, LABELS))


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_balancing_stops_filling_full_clients(seed: int) -> None:
    # A client stops receiving classes once it holds N/M samples, so it ends below N/M plus one class.
    part = partition("dirichlet", LABELS, 10, seed, alpha=0.05, min_size=0)
    assert max(len(i) for i in part.indices) < 100 + 100


def test_dirichlet_respects_min_size() -> None:
    part = partition("dirichlet", LABELS, 10, 3, alpha=0.3, min_size=40)
    assert min(len(i) for i in part.indices) >= 40
    assert_disjoint(part, len(LABELS), covering=True)


def test_dirichlet_caps_min_size_at_half_the_mean_client_size() -> None:
    # 100 clients of 10 samples on average: min_size=10 is out of reach, the cap (5) is not.
    part = partition("dirichlet", LABELS, 100, 0, alpha=0.5)
    assert min(len(i) for i in part.indices) >= 5
    # The cap never lets a client go empty: 1,000 clients of one sample each is asked for.
    with pytest.raises(ConfigError, match=r"min_size=1 \(capped from 10\)"):
        partition("dirichlet", LABELS, 1000, 0, alpha=0.5, max_retries=2)


@pytest.mark.filterwarnings("error")
def test_dirichlet_tiny_alpha_still_covers_everything() -> None:
    # Dir(1e-4) often puts all mass on clients that are already full; nothing may go astray then.
    part = partition("dirichlet", LABELS, 20, 0, alpha=1e-4, min_size=0)
    assert_disjoint(part, len(LABELS), covering=True)
    assert max(len(i) for i in part.indices) < 50 + 100


def test_dirichlet_retry_exhaustion_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        partition("dirichlet", LABELS, 100, 0, alpha=0.001, min_size=5, max_retries=3)
    message = str(err.value)
    for part in ("alpha=0.001", "num_clients=100", "min_size=5", "3 tries", "smaller partition.min_size"):
        assert part in message


@pytest.mark.parametrize(("alpha", "allowed"), [(0, "> 0"), (-1.0, "> 0"), (float("inf"), "a finite number")])
def test_dirichlet_rejects_non_positive_alpha(alpha: float, allowed: str) -> None:
    with pytest.raises(ConfigError, match=rf"partition\.alpha must be {allowed}, got"):
        partition("dirichlet", LABELS, 10, 0, alpha=alpha)


# ------------------------------------------------------------------------- classes_per_client


@pytest.mark.parametrize(("num_clients", "classes"), [(100, 1), (100, 2), (10, 1), (7, 3), (30, 10), (3, 2)])
def test_classes_per_client_gives_exactly_c_classes_used_evenly(num_clients: int, classes: int) -> None:
    part = partition("classes_per_client", LABELS, num_clients, 0, classes=classes)
    assert classes_held(part, LABELS) == [classes] * num_clients
    assert_disjoint(part, len(LABELS), covering=num_clients * classes >= 10)
    holders = (part.class_counts(LABELS, 10) > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1


def test_classes_per_client_one_class_splits_each_class_evenly() -> None:
    part = partition("classes_per_client", LABELS, 100, 0, classes=1)
    assert {len(i) for i in part.indices} == {10}


def test_classes_per_client_rejects_too_many_classes() -> None:
    with pytest.raises(ConfigError, match=r"classes=11 exceeds the 10 classes"):
        partition("classes_per_client", LABELS, 10, 0, classes=11)


def test_classes_per_client_rejects_classes_smaller_than_their_holders() -> None:
    labels = np.array([0, 0, 0, 0, 0, 0, 1])
    with pytest.raises(ConfigError, match=r"class 1 has 1 samples but 3 clients"):
        partition("classes_per_client", labels, 6, 0, classes=1)


def test_classes_per_client_rejects_an_unknown_assignment() -> None:
    with pytest.raises(ConfigError, match=r"partition\.assignment must be one of 'balanced', 'niid_bench', got 'x'"):
        partition("classes_per_client", LABELS, 10, 0, classes=2, assignment="x")


# NIID-Bench's #C=k (noniid-#label<k>, partition_data in the authors' utils.py): client i's first class is
# i mod K, its other k - 1 uniformly random among the rest; each class split evenly among its holders.
FMNIST_LIKE = np.repeat(np.arange(10), 600)


@pytest.mark.parametrize("classes", [1, 2, 3, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_niid_bench_assignment_gives_each_client_exactly_k_classes_first_its_own(classes: int, seed: int) -> None:
    part = partition("classes_per_client", FMNIST_LIKE, 10, seed, classes=classes, assignment="niid_bench")
    counts = part.class_counts(FMNIST_LIKE, 10)
    assert classes_held(part, FMNIST_LIKE) == [classes] * 10
    assert all(counts[i, i] > 0 for i in range(10))  # client i holds class i mod 10
    assert_disjoint(part, len(FMNIST_LIKE), covering=True)  # 10 clients: every class has a holder
    for k in range(10):  # each class split evenly (numpy.array_split) among its holders
        held = counts[:, k][counts[:, k] > 0]
        assert held.sum() == 600 and held.max() - held.min() <= 1


def test_niid_bench_one_class_each_is_client_i_holding_all_of_class_i() -> None:
    part = partition("classes_per_client", FMNIST_LIKE, 10, 0, classes=1, assignment="niid_bench")
    assert np.array_equal(part.class_counts(FMNIST_LIKE, 10), 600 * np.eye(10, dtype=np.int64))
    # More clients than classes: client i holds class i mod 10, so classes 0-4 have two holders.
    part = partition("classes_per_client", FMNIST_LIKE, 15, 0, classes=1, assignment="niid_bench")
    counts = part.class_counts(FMNIST_LIKE, 10)
    assert [int(np.argmax(row)) for row in counts] == [i % 10 for i in range(15)]
    assert [len(i) for i in part.indices] == [300] * 5 + [600] * 5 + [300] * 5


def test_niid_bench_other_classes_are_uniform_whoever_else_holds_them() -> None:
    # Client 0's second class: uniform over classes 1-9 across seeds (not the least-used rule).
    seen = np.zeros(10, dtype=np.int64)
    holders_spread = set()
    for seed in range(900):
        part = partition("classes_per_client", FMNIST_LIKE, 10, seed, classes=2, assignment="niid_bench")
        counts = part.class_counts(FMNIST_LIKE, 10) > 0
        second = [k for k in np.flatnonzero(counts[0]) if k != 0]
        seen[second[0]] += 1
        holders_spread.add(int(counts.sum(axis=0).max() - counts.sum(axis=0).min()))
    assert seen[0] == 0 and seen[1:].sum() == 900
    assert seen[1:].min() > 60 and seen[1:].max() < 140  # 100 expected each; 4 sigma is +-38
    assert max(holders_spread) >= 2  # unlike "balanced", a class can have several holders more than another


def test_niid_bench_assignment_leaves_unheld_classes_unused() -> None:
    part = partition("classes_per_client", FMNIST_LIKE, 3, 0, classes=1, assignment="niid_bench")
    assert np.array_equal(part.class_counts(FMNIST_LIKE, 10)[:, :3], 600 * np.eye(3, dtype=np.int64))
    assert sum(len(i) for i in part.indices) == 1800


def test_balanced_is_the_default_assignment() -> None:
    default = partition("classes_per_client", LABELS, 7, 3, classes=3)
    balanced = partition("classes_per_client", LABELS, 7, 3, classes=3, assignment="balanced")
    assert all(np.array_equal(a, b) for a, b in zip(default.indices, balanced.indices, strict=True))


# ------------------------------------------------------------------------------------- shards


@pytest.mark.parametrize("shards_per_client", [1, 2, 5])
def test_shards_limit_labels_per_client(shards_per_client: int) -> None:
    part = partition("shards", LABELS, 50, 0, shards_per_client=shards_per_client)
    assert max(classes_held(part, LABELS)) <= shards_per_client
    assert {len(i) for i in part.indices} == {1000 // 50}
    assert_disjoint(part, len(LABELS), covering=True)


def test_shards_need_enough_samples() -> None:
    with pytest.raises(ConfigError, match=r"1200 shards exceed the 1000 samples"):
        partition("shards", LABELS, 600, 0, shards_per_client=2)


# ----------------------------------------------------------------------------------- quantity


def test_quantity_skews_sizes_but_not_labels() -> None:
    labels = np.repeat(np.arange(10), 1000)
    part = partition("quantity", labels, 10, 0, alpha=0.5)
    sizes = np.array([len(i) for i in part.indices])
    assert sizes.min() >= 1 and sizes.max() > 3 * sizes.min()
    counts = part.class_counts(labels, 10)
    for row in counts[sizes >= 200]:
        total_variation = 0.5 * np.abs(row / row.sum() - 0.1).sum()
        assert total_variation < 0.2


@settings(max_examples=30, deadline=None)
@given(case=labels_and_clients(), alpha=st.floats(0.01, 10.0))
def test_quantity_never_leaves_a_client_empty(case: tuple[np.ndarray, int, int], alpha: float) -> None:
    labels, num_clients, seed = case
    part = partition("quantity", labels, num_clients, seed, alpha=alpha)
    assert min(len(i) for i in part.indices) >= 1


# -------------------------------------------------------------------------------------- mixed


def test_mixed_case_2() -> None:
    labels = np.repeat(np.arange(10), 500)
    part = partition("mixed", labels, 200, 0, groups=CASE_2)
    assert part.num_clients == 200
    assert classes_held(part, labels)[:180] == [1] * 180
    counts = part.class_counts(labels, 10)
    assert counts[:180].sum() == 4500  # data divided in proportion to the clients: 90 % / 10 %
    assert counts[180:].sum() == 500
    assert counts.sum() == len(labels)
    assert_disjoint(part, len(labels), covering=True)


def test_mixed_share_overrides_the_data_split() -> None:
    groups = [
        {"name": "iid", "num_clients": 5, "share": 3},
        {"name": "iid", "num_clients": 5, "share": 1},
    ]
    sizes = [len(i) for i in partition("mixed", LABELS, 10, 0, groups=groups).indices]
    assert sum(sizes[:5]) == 750 and sum(sizes[5:]) == 250


def test_mixed_group_sizes_must_add_up() -> None:
    with pytest.raises(ConfigError, match=r"add up to 200, but num_clients=100"):
        partition("mixed", np.repeat(np.arange(10), 500), 100, 0, groups=CASE_2)


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ([], r"non-empty list"),
        ([{"name": "iid"}], r"needs 'name' and 'num_clients'"),
        ([{"name": "dirichlet", "num_clients": 10, "alpha": -1}], r"groups\[0\] \(dirichlet\).*alpha"),
        ([{"name": "iid", "num_clients": 10, "alpha": 1}], r"groups\[0\] \(iid\): unknown key 'alpha' for"),
    ],
)
def test_mixed_reports_bad_groups(groups: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        partition("mixed", LABELS, 10, 0, groups=groups)


# -------------------------------------------------------------------------------------- noise


def test_noise_grows_with_client_index() -> None:
    part = partition("noise", LABELS, 8, 0, sigma=0.4)
    assert part.noise_std == pytest.approx([0.4 * i / 8 for i in range(8)])
    assert part.noise_std is not None and np.all(np.diff(part.noise_std) > 0)
    assert_disjoint(part, len(LABELS), covering=True)


def test_noise_forwards_base_parameters() -> None:
    noisy = partition("noise", LABELS, 10, 5, sigma=0.1, base="classes_per_client", classes=2)
    assert classes_held(noisy, LABELS) == [2] * 10
    with pytest.raises(ConfigError, match=r"partition\.clases.*allowed: sigma, base, classes"):
        partition("noise", LABELS, 10, 0, base="classes_per_client", clases=2)


def test_noise_cannot_be_stacked() -> None:
    with pytest.raises(ConfigError, match=r"already adds noise"):
        partition("noise", LABELS, 10, 0, base="noise")


def test_mixed_keeps_group_noise_and_gives_others_none() -> None:
    groups = [{"name": "iid", "num_clients": 2}, {"name": "noise", "num_clients": 2, "sigma": 1.0}]
    assert partition("mixed", LABELS, 4, 0, groups=groups).noise_std == [0.0, 0.0, 0.0, 0.5]


# ------------------------------------------------------------------------------------- domain


def test_domain_gives_client_k_domain_k() -> None:
    domains = np.random.default_rng(0).permutation(np.repeat(np.arange(6), 50))
    labels = np.tile(np.arange(10), 30)
    part = partition("domain", labels, 6, 0, domains=domains)
    for k, idx in enumerate(part.indices):
        np.testing.assert_array_equal(idx, np.flatnonzero(domains == k))


def test_domain_needs_domains_and_one_client_each() -> None:
    domains = np.repeat(np.arange(6), 50)
    with pytest.raises(ConfigError, match=r"domain ids"):
        partition("domain", domains, 6, 0)
    with pytest.raises(ConfigError, match=r"num_clients=6 \(one per domain\), got 5"):
        partition("domain", domains, 5, 0, domains=domains)


# ------------------------------------------------------------------------- shared behaviour

SEEDED: dict[str, dict[str, Any]] = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "classes_per_client": {"classes": 2},
    "shards": {},
    "quantity": {},
    "mixed": {"groups": [{"name": "shards", "num_clients": 4}, {"name": "quantity", "num_clients": 6}]},
    "noise": {"base": "dirichlet", "alpha": 1.0},
}


def test_every_registered_partitioner_is_tested() -> None:
    assert set(PARTITIONERS.names()) == {*SEEDED, "domain"}


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_same_seed_same_partition_other_seed_different(name: str) -> None:
    first, again, other = (partition(name, LABELS, 10, s, **SEEDED[name]) for s in (7, 7, 8))
    assert all(np.array_equal(a, b) for a, b in zip(first.indices, again.indices, strict=True))
    assert first.noise_std == again.noise_std
    assert not all(np.array_equal(a, b) for a, b in zip(first.indices, other.indices, strict=True))


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_more_clients_than_samples_names_both_numbers(name: str) -> None:
    with pytest.raises(ConfigError, match=r"num_clients=1001 exceeds the 1000 training samples"):
        partition(name, LABELS, 1001, 0, **SEEDED[name])


def test_unknown_parameter_names_it_and_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"partition\.aplha.*allowed: alpha, min_size, max_retries"):
        partition("dirichlet", LABELS, 10, 0, aplha=0.5)
    allowed = "num_clients, seed, client_test_fraction"
    with pytest.raises(ConfigError, match=rf"key 'partition\.alpha' for partitioner 'iid'; allowed: {allowed}$"):
        partition("iid", LABELS, 10, 0, alpha=0.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "nope"}, ConfigError, r"unknown partitioner 'nope'; allowed: classes_per_client"),
        ({"name": "dirichlet"}, ConfigError, r"partition\.alpha is required by partitioner 'dirichlet'"),
        ({"name": "iid", "num_clients": 0}, ConfigError, r"num_clients must be an integer >= 1"),
        ({"name": "iid", "seed": -1}, ConfigError, r"seed must be a non-negative integer"),
        ({"name": "classes_per_client", "classes": 1.5}, ConfigError, r"classes must be an integer"),
        ({"name": "shards", "shards_per_client": 0}, ConfigError, r"shards_per_client must be an integer >= 1"),
        ({"name": "quantity", "alpha": "big"}, ConfigError, r"alpha must be a number"),
        ({"name": "noise", "sigma": -0.1}, ConfigError, r"sigma must be >= 0"),
        ({"name": "iid", "labels": LABELS.astype(float)}, DataError, r"must be integers"),
        ({"name": "iid", "labels": LABELS - 1}, DataError, r"non-negative"),
        ({"name": "iid", "labels": LABELS.reshape(10, 100)}, DataError, r"1-D"),
        ({"name": "iid", "domains": np.zeros(3)}, DataError, r"domains has shape"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    call: dict[str, Any] = {"labels": LABELS, "num_clients": 10, "seed": 0, **kwargs}
    with pytest.raises(error, match=match):
        partition(**call)


# ------------------------------------------------------------------------ typed config tables


def test_every_partitioner_declares_its_options() -> None:
    for name in PARTITIONERS.names():
        params = PARTITIONERS.params_of(name)
        assert params is not None and issubclass(params, PartitionParams), name
        assert PARTITIONERS.keys(name)[-3:] == ["num_clients", "seed", "client_test_fraction"]


def test_a_whole_partition_table_validates_in_one_call() -> None:
    table = {"name": "dirichlet", "num_clients": 10, "seed": 3, "alpha": 1}
    params = PARTITIONERS.build_params("dirichlet", table, "partition.")
    assert (params.num_clients, params.seed, params.alpha, params.min_size) == (10, 3, 1.0, 10)
    assert PARTITIONERS.build_params("iid", {"num_clients": 4}).seed is None  # derived from the run seed
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("iid", {}, r"partition\.num_clients is required by partitioner 'iid'"),
        ("iid", {"num_clients": 0}, r"partition\.num_clients must be an integer >= 1, got 0"),
        ("iid", {"num_clients": 4, "seed": -2}, r"partition\.seed must be an integer >= 0, got -2"),
        ("dirichlet", {"num_clients": 4, "alpha": 0.5, "min_size": -1}, r"partition\.min_size must be an integer >= 0"),
        ("noise", {"num_clients": 4, "base": "nope"}, r"partition\.base must be a partitioner \(classes_per_client"),
        ("noise", {"num_clients": 4, "base": "dirichlet"}, r"partition\.alpha is required by partitioner 'dirichlet'"),
        ("noise", {"num_clients": 4, "base": "shards", "alpha": 1}, r"partition\.alpha is not a key of partitioner"),
        ("mixed", {"num_clients": 4, "groups": CASE_2}, r"partition\.groups: their num_clients add up to 200"),
        ("mixed", {"num_clients": 4, "groups": [{"name": "iid", "num_clients": 4, "seed": 1}]}, r"\[0\] has a seed"),
        ("mixed", {"num_clients": 4, "groups": [{"name": "iid", "num_clients": 4, "share": 0}]}, r"share must be"),
        ("mixed", {"num_clients": 4, "groups": [{"name": "nope", "num_clients": 4}]}, r"unknown partitioner 'nope'"),
        ("mixed", {"num_clients": 4, "groups": [3]}, r"partition\.groups\[0\] must be a table"),
    ]
    for name, options, message in bad:
        with pytest.raises(ConfigError, match=message):
            PARTITIONERS.build_params(name, options, "partition.")


def test_noise_table_carries_its_base_options_inline() -> None:
    table = {"name": "noise", "num_clients": 10, "sigma": 0.2, "base": "dirichlet", "alpha": 0.3}
    params = PARTITIONERS.build_params("noise", table, "partition.")
    assert params.base_options == {"alpha": 0.3} and params.base_params.alpha == 0.3
    assert params.base_params.num_clients == 10
    nested = {"name": "mixed", "num_clients": 10, "groups": [{"name": "noise", "num_clients": 10, **table}]}
    assert PARTITIONERS.build_params("mixed", nested).group_params[0].base_params.min_size == 10


def test_registry_requires_params_of_the_base_class_and_reads_class_params() -> None:
    registry: Registry[Any] = Registry("thing", PartitionParams)
    with pytest.raises(TypeError, match="subclass of PartitionParams"):
        registry.register("bare")
    with pytest.raises(TypeError, match="must be a dataclass"):
        registry.register("odd", params=int)

    class WithParams:
        Params = PartitionParams

    free: Registry[Any] = Registry("algorithm")
    free.register("with")(WithParams)
    free.register("without")(object)
    assert free.params_of("with") is PartitionParams and free.params_of("without") is None
    with pytest.raises(ConfigError, match=r"unknown algorithm 'nope'"):
        free.params_of("nope")


# -------------------------------------------------------------------- Partition and reporting


def test_partition_class_counts() -> None:
    part = Partition([np.array([0, 1, 100]), np.array([999])])
    counts = part.class_counts(LABELS, 12)
    assert counts.shape == (2, 12) and counts.dtype == np.int64
    assert counts[0, 0] == 2 and counts[0, 1] == 1 and counts[1, 9] == 1
    with pytest.raises(DataError, match=r"label 9 does not fit num_classes=5"):
        part.class_counts(LABELS, 5)


def test_partition_noise_must_match_clients() -> None:
    with pytest.raises(ValueError, match=r"2 entries for 1 clients"):
        Partition([np.arange(3)], noise_std=[0.0, 0.1])


def test_summarize_has_per_client_rows_and_totals() -> None:
    part = partition("classes_per_client", LABELS, 5, 0, classes=2)
    lines = summarize(part, LABELS, 10).splitlines()
    assert lines[0].split() == ["client", *map(str, range(10)), "total"]
    assert len(lines) == 1 + 5 + 1
    assert [int(v) for v in lines[1].split()[1:]] == [*part.class_counts(LABELS, 10)[0], 200]
    assert lines[-1].split() == ["total", *(["100"] * 10), "1000"]


@pytest.mark.parametrize("num_clients", [10, 200])
def test_bubble_plot_writes_png(tmp_path: Path, num_clients: int) -> None:
    counts = partition("dirichlet", LABELS, num_clients, 0, alpha=0.1, min_size=0).class_counts(LABELS, 10)
    out = bubble_plot(counts, tmp_path / "plots" / "bubbles.png", "Dir(0.1)", [f"c{i}" for i in range(10)])
    assert out == tmp_path / "plots" / "bubbles.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 1000


@pytest.mark.parametrize(
    ("counts", "names", "match"),
    [
        (np.zeros((3, 2)), None, r"positive sum"),
        (np.ones(3), None, r"2-D"),
        (-np.ones((3, 2)), None, r"non-negative"),
        (np.ones((3, 2)), ["a"], r"1 class names for 2 classes"),
    ],
)
def test_bubble_plot_rejects_bad_input(tmp_path: Path, counts: np.ndarray, names: list[str] | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bubble_plot(counts, tmp_path / "x.png", class_names=names)


@pytest.mark.slow
def test_partition_plot_draws_a_heat_map_from_100_clients(tmp_path: Path) -> None:
    counts = partition("dirichlet", LABELS, 150, 0, alpha=0.1, min_size=0).class_counts(LABELS, 10)
    auto = partition_plot(counts, tmp_path / "auto.png", "Dir(0.1)")
    heat = heatmap_plot(counts, tmp_path / "heat.png", "Dir(0.1)")
    bubbles = partition_plot(counts, tmp_path / "bubbles.png", "Dir(0.1)", style="bubble")
    assert auto.read_bytes() == heat.read_bytes() != bubbles.read_bytes()
    small = counts[:10]
    assert partition_plot(small, tmp_path / "s.png").read_bytes() == bubble_plot(small, tmp_path / "b.png").read_bytes()
    with pytest.raises(ValueError, match="style 'pie'; allowed: auto, bubble, heatmap"):
        partition_plot(counts, tmp_path / "x.png", style="pie")
    with pytest.raises(ValueError, match="1 class names for 10 classes"):
        heatmap_plot(counts, tmp_path / "x.png", class_names=["a"])
