"""Tests of the metrics against their defining properties and hand-computed values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fedskew.metrics import (
    Ledger,
    Stability,
    accuracy,
    accuracy_at,
    class_variance,
    confusion_counts,
    per_class_accuracy,
    round_stability,
    rounds_to_target,
    summarize_run,
    value_at_target,
)

PREDS = np.array([0, 1, 1, 2, 0, 2])
LABELS = np.array([0, 1, 2, 2, 0, 0])


def test_confusion_counts_rows_are_true_labels() -> None:
    c = confusion_counts(PREDS, LABELS, 4)
    assert c.dtype == np.int64 and c.shape == (4, 4)
    expected = np.zeros((4, 4), dtype=np.int64)
    expected[0, 0], expected[0, 2] = 2, 1
    expected[1, 1] = 1
    expected[2, 1], expected[2, 2] = 1, 1
    np.testing.assert_array_equal(c, expected)
    assert c.sum() == len(LABELS)


@pytest.mark.parametrize(
    ("preds", "labels"),
    [(np.array([0, 1]), np.array([0])), (np.array([0, 3]), np.array([0, 1])), (np.array([-1]), np.array([0]))],
)
def test_confusion_counts_rejects_bad_input(preds: np.ndarray, labels: np.ndarray) -> None:
    with pytest.raises(ValueError):
        confusion_counts(preds, labels, 3)


def test_accuracy_by_hand() -> None:
    assert accuracy(PREDS, LABELS) == pytest.approx(4 / 6)
    assert accuracy(LABELS, LABELS) == 1.0
    with pytest.raises(ValueError):
        accuracy(np.array([]), np.array([]))


def test_per_class_accuracy_none_for_absent_classes() -> None:
    pc = per_class_accuracy(PREDS, LABELS, 4)
    assert pc[0] == pytest.approx(2 / 3)
    assert pc[1] == 1.0
    assert pc[2] == 0.5
    assert pc[3] is None


def test_class_variance_by_hand_and_ignores_none() -> None:
    # mean of (2/3, 1, 1/2) is 13/18; population variance by hand:
    vals = [2 / 3, 1.0, 0.5]
    mean = sum(vals) / 3
    expected = sum((v - mean) ** 2 for v in vals) / 3
    assert class_variance([2 / 3, 1.0, 0.5, None]) == pytest.approx(expected)
    assert class_variance([0.0, 1.0]) == pytest.approx(0.25)  # the largest possible for fractions
    with pytest.raises(ValueError):
        class_variance([None, None])


@given(st.floats(0, 1), st.integers(1, 20))
def test_class_variance_of_equal_accuracies_is_zero(a: float, n: int) -> None:
    assert class_variance([a] * n) == pytest.approx(0.0, abs=1e-12)


def test_round_stability_hand_series() -> None:
    # differences: +0.2, -0.1, +0.3, -0.4
    s = round_stability([0.1, 0.3, 0.2, 0.5, 0.1])
    assert s.max_drop == pytest.approx(-0.4)
    assert s.mean_drop == pytest.approx(-0.25)
    assert s.mean_rise == pytest.approx(0.25)


def test_round_stability_monotone_and_short_series() -> None:
    s = round_stability([0.1, 0.2, 0.2, 0.6])
    assert (s.max_drop, s.mean_drop) == (0.0, 0.0)
    assert s.mean_rise == pytest.approx(0.25)  # the flat step counts as neither drop nor rise
    assert round_stability([0.5]) == Stability(0.0, 0.0, 0.0)
    assert round_stability([]) == Stability(0.0, 0.0, 0.0)


@given(st.lists(st.floats(0, 1), max_size=50))
@example([0.5911534350013039, 0.10222715811004823] * 12)  # 12 equal drops whose float mean rounds below them
def test_round_stability_ordering(acc: list[float]) -> None:
    s = round_stability(acc)
    assert s.max_drop <= s.mean_drop <= 0.0 <= s.mean_rise


def test_rounds_to_target() -> None:
    acc = [0.1, 0.4, 0.35, 0.5]
    assert rounds_to_target(acc, 0.4) == 2
    assert rounds_to_target(acc, 0.4, rounds=[10, 20, 30, 40]) == 20
    assert rounds_to_target(acc, 0.9) is None
    with pytest.raises(ValueError):
        rounds_to_target(acc, 0.4, rounds=[1, 2])


def test_value_at_target_and_accuracy_at() -> None:
    acc = [0.1, 0.4, 0.35, 0.5]
    assert value_at_target(acc, [100, 200, 300, 400], 0.45) == 400.0
    assert value_at_target(acc, [100, 200, 300, 400], 0.6) is None
    assert accuracy_at(acc, [1, 2, 3, 4], [2, 4, 9]) == {2: 0.4, 4: 0.5, 9: None}


def _record(r: int, acc: float, cv: float | None, down: int, up: int, **extra: int) -> dict[str, object]:
    return {
        "round": r,
        "accuracy": acc,
        "class_variance": cv,
        "bytes_server_to_client": down,
        "bytes_client_to_server": up,
        **extra,
    }


def test_summarize_run_by_hand() -> None:
    records = [
        _record(1, 0.2, 0.04, 100, 50),
        _record(3, 0.5, None, 100, 50),  # given out of order: must be sorted by round
        _record(2, 0.6, 0.02, 100, 50, bytes_client_to_client=7),
    ]
    s = summarize_run(records, target=0.55, at_rounds=[2, 5])
    assert s["final_accuracy"] == 0.5
    assert (s["best_accuracy"], s["best_round"]) == (0.6, 2)
    assert s["max_drop"] == pytest.approx(-0.1)
    assert s["mean_drop"] == pytest.approx(-0.1)
    assert s["mean_rise"] == pytest.approx(0.4)
    assert s["mean_class_variance"] == pytest.approx(0.03)
    assert s["bytes_server_to_client"] == 300
    assert s["bytes_client_to_server"] == 150
    assert s["bytes_client_to_client"] == 7
    assert s["rounds_to_target"] == 2
    assert s["bytes_to_target"] == 150 + 157
    assert s["accuracy_at"] == {"2": 0.6, "5": None}
    assert s["rounds"] == 3
    json.dumps(s)  # the engine writes it to summary.json


def test_summarize_run_without_target() -> None:
    s = summarize_run([_record(1, 0.3, None, 1, 1)])
    assert s["rounds_to_target"] is None and s["bytes_to_target"] is None
    assert s["mean_class_variance"] is None
    with pytest.raises(ValueError):
        summarize_run([])


def test_ledger_sums_per_round_and_direction() -> None:
    led = Ledger()
    led.add("server_to_client", 10, round=1)
    led.add("server_to_client", 5, round=1)
    led.add("client_to_server", 7, round=1)
    led.add("client_to_client", 3, round=2)
    led.add("client_to_server", np.int64(4), round=2)
    assert led.round_totals(1) == {
        "bytes_server_to_client": 15,
        "bytes_client_to_server": 7,
        "bytes_client_to_client": 0,
    }
    assert led.round_totals(9) == dict.fromkeys(led.round_totals(1), 0)
    assert led.totals() == {
        "bytes_server_to_client": 15,
        "bytes_client_to_server": 11,
        "bytes_client_to_client": 3,
    }


def test_ledger_rejects_unknown_direction_and_negative_bytes() -> None:
    led = Ledger()
    with pytest.raises(ValueError, match="unknown direction"):
        led.add("server_to_server", 1, round=1)
    with pytest.raises(ValueError):
        led.add("server_to_client", -1, round=1)


def test_ledger_state_round_trips_through_json() -> None:
    led = Ledger()
    led.add("server_to_client", 10, round=1)
    led.add("client_to_client", 3, round=2)
    state = json.loads(json.dumps(led.state_dict()))
    other = Ledger()
    other.load_state_dict(state)
    assert other.totals() == led.totals()
    assert other.round_totals(2) == led.round_totals(2)
    other.add("client_to_client", 1, round=2)
    assert other.round_totals(2)["bytes_client_to_client"] == 4
    with pytest.raises(ValueError):
        other.load_state_dict({"rounds": {"1": {"sideways": 1}}})
    with pytest.raises(ValueError):
        other.load_state_dict({"rounds": {"1": {"server_to_client": 1.5}}})
