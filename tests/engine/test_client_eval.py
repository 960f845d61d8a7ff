"""Per-client evaluation: each client's held-out split, the global and the clients' own models, ``local``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedskew.config import dump, typed_config
from fedskew.config.schema import validate
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message
from fedskew.data.partition import hold_out
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from fedskew.metrics import client_distribution
from tests.helpers.configs import federation_from, tiny_config

BN_MODEL = {"name": "convnet", "net_width": 8, "net_depth": 1, "net_norm": "batchnorm"}


def _cfg(**over: Any) -> dict[str, Any]:
    """tiny_config with a 25% client split; ``model`` replaces the model table."""
    model = over.pop("model", None)
    base: dict[str, Any] = {"partition": {"client_test_fraction": 0.25}}
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) and k in base else v
    cfg = tiny_config(**base)
    if model is not None:
        cfg["model"] = model
    return cfg


def _run(cfg: dict[str, Any], path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    recs = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return recs, json.loads((path / "summary.json").read_text())


# ---- the held-out split -------------------------------------------------------------------------------------
def test_hold_out_is_a_stratified_seeded_split_of_each_client() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=2000)
    clients = [*np.array_split(rng.permutation(2000), 7), np.array([3]), np.array([4, 9])]
    train, test = hold_out(clients, labels, 0.2, seed=11)
    again = hold_out(clients, labels, 0.2, seed=11)
    other = hold_out(clients, labels, 0.2, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(test, again[1], strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(test, other[1], strict=True))
    for ix, tr, te in zip(clients, train, test, strict=True):
        assert np.intersect1d(tr, te).size == 0
        assert np.array_equal(np.sort(np.concatenate([tr, te])), np.sort(ix))
        if len(ix) >= 2:
            assert 1 <= len(te) == max(1, round(0.2 * len(ix))) < len(ix)
        else:
            assert len(te) == 0  # a one-sample client keeps its sample to train on
    # Stratified: a big client's held-out class counts are its class counts times the fraction, rounded.
    counts = np.bincount(labels[clients[0]], minlength=5)
    held = np.bincount(labels[test[0]], minlength=5)
    assert np.all(np.abs(held - 0.2 * counts) < 1)


def test_the_federation_trains_on_the_rest_and_keeps_the_global_test_set() -> None:
    plain = federation_from(tiny_config(), 0)
    cfg = _cfg()
    fed = federation_from(cfg, 0)
    assert fed.has_client_test and not plain.has_client_test
    sizes = fed.client_test_sizes()
    for cid in range(fed.info.num_clients):
        _, y = fed.client_data(cid)
        _, yt = fed.client_test(cid)
        assert len(yt) == sizes[cid] and len(y) + len(yt) == len(plain.client_data(cid)[1])
        assert int(fed.counts[cid].sum()) == len(y)
    assert len(fed.y_test) == len(plain.y_test)


def test_client_distribution() -> None:
    values = [0.1 * i for i in range(20)] + [None]
    d = client_distribution(values)
    assert d["worst10"] == pytest.approx(0.05)  # the lowest 2 of 20 clients: 0.0 and 0.1
    assert d["mean"] == pytest.approx(0.95) and d["best"] == pytest.approx(1.9)
    assert d["std"] == pytest.approx(float(np.std([0.1 * i for i in range(20)])))
    assert client_distribution([0.3])["worst10"] == 0.3
    assert client_distribution([None, None]) == {"mean": None, "std": None, "worst10": None, "best": None}


# ---- runs ---------------------------------------------------------------------------------------------------
def test_a_run_records_every_clients_accuracy_and_the_summary(tmp_path: Path) -> None:
    recs, summary = _run(_cfg(rounds=4, eval_every=2), tmp_path / "r")
    evaluated = [r for r in recs if r["accuracy"] is not None]
    assert [r["round"] for r in evaluated] == [2, 4]
    for r in recs:
        if r["accuracy"] is None:
            assert r["client_accuracy"] is None and r["personal_accuracy_mean"] is None
            continue
        vec = r["client_accuracy"]
        assert len(vec) == 6 and all(0 <= a <= 1 for a in vec)
        assert r["client_accuracy_mean"] == pytest.approx(float(np.mean(vec)))
        assert r["client_accuracy_worst10"] == min(vec)  # 6 clients: the worst 10% is one client
        assert r["personal_accuracy"] == vec  # FedAvg has no model of its own
    assert summary["client_mean_final"] == recs[-1]["client_accuracy_mean"]
    assert summary["client_worst10_best"] == max(r["client_accuracy_worst10"] for r in evaluated)
    assert summary["personal_mean_final"] == summary["client_mean_final"]
    # Pooled (PFLlib's measure): correct answers over every client's held-out samples together.
    sizes = federation_from(_cfg(rounds=4, eval_every=2)).client_test_sizes()
    last = evaluated[-1]
    pooled = sum(round(a * n) for a, n in zip(last["client_accuracy"], sizes, strict=True)) / sum(sizes)
    assert last["client_accuracy_pooled"] == pytest.approx(pooled, abs=1e-12)
    assert len(set(sizes)) > 1 and last["client_accuracy_pooled"] != pytest.approx(last["client_accuracy_mean"])
    assert summary["client_pooled_final"] == last["client_accuracy_pooled"]
    assert all(r["client_accuracy_pooled"] is None for r in recs if r["accuracy"] is None)


def test_pooled_accuracy_weighs_each_sample_alike() -> None:
    from fedskew.engine.client_eval import pooled_accuracy

    assert pooled_accuracy([9, 1, None], [10, 10, 5]) == 10 / 20  # a client that did not answer is left out
    assert pooled_accuracy([None, None], [3, 4]) is None
    assert pooled_accuracy([1, 90], [1, 100]) == 91 / 101  # the mean over clients would say 0.95


def test_without_a_client_split_nothing_changes(tmp_path: Path) -> None:
    recs, summary = _run(tiny_config(), tmp_path / "r")
    assert not any("client_accuracy" in r for r in recs) and "client_mean_final" not in summary


def test_evaluating_the_clients_changes_nothing_they_train(tmp_path: Path) -> None:
    """Every-round evaluation with fine-tuning leaves the training exactly as evaluating once does."""
    cfg = _cfg(algorithm={"name": "fedbn"}, model=BN_MODEL, rounds=3, eval={"personalized_epochs": 1})
    often, _ = _run({**cfg, "eval_every": 1}, tmp_path / "often")
    once, _ = _run({**cfg, "eval_every": 3}, tmp_path / "once")
    assert often[-1]["accuracy"] == once[-1]["accuracy"]
    assert often[-1]["personal_accuracy"] == once[-1]["personal_accuracy"]
    assert often[-1]["bytes_client_to_server"] == once[-1]["bytes_client_to_server"]


@pytest.mark.slow
def test_per_client_metrics_are_identical_for_any_worker_count(tmp_path: Path) -> None:
    cfg = _cfg(algorithm={"name": "fedbn"}, model=BN_MODEL, rounds=2, eval={"personalized_epochs": 1})
    one, _ = _run({**cfg, "workers": 1}, tmp_path / "w1")
    two, _ = _run({**cfg, "workers": 2}, tmp_path / "w2")
    assert (tmp_path / "w1" / "metrics.jsonl").read_bytes() == (tmp_path / "w2" / "metrics.jsonl").read_bytes()
    assert one[-1]["personal_accuracy"] is not None and two[-1]["personal_accuracy"] is not None


def test_fedbn_is_measured_with_its_own_normalisation_layers(tmp_path: Path) -> None:
    cfg = _cfg(algorithm={"name": "fedbn"}, model=BN_MODEL, rounds=3)
    cfg["dataset"]["noise"] = 2.0  # hard enough that the normalisation layers show
    recs, _ = _run(cfg, tmp_path / "r")
    last = recs[-1]
    # The server's model keeps the initial BatchNorm statistics; the clients' own layers differ.
    assert last["personal_accuracy"] != last["client_accuracy"]
    assert last["personal_accuracy_mean"] > last["client_accuracy_mean"]


def test_fine_tuning_gives_the_clients_their_own_models(tmp_path: Path) -> None:
    recs, _ = _run(_cfg(rounds=2, eval={"personalized_epochs": 2, "personalized_lr": 0.05}), tmp_path / "r")
    assert recs[-1]["personal_accuracy"] != recs[-1]["client_accuracy"]


@pytest.mark.slow
def test_local_trains_alone_and_is_measured_on_the_clients(tmp_path: Path) -> None:
    recs, summary = _run(_cfg(algorithm={"name": "local"}, rounds=3, workers=2), tmp_path / "r")
    assert all(r["bytes_server_to_client"] == r["bytes_client_to_server"] == 0 for r in recs)
    assert all(r["accuracy"] is None and "client_accuracy" not in r for r in recs)
    assert all(len(r["clients"]) == 3 and r["samples"] > 0 for r in recs)
    assert summary["best_accuracy"] is None and summary["personal_mean_final"] > 0.25  # 4 classes
    # Resumed from round 2, a local run ends where the uninterrupted one did (the clients' models are state).
    cfg = _cfg(algorithm={"name": "local"}, rounds=3, workers=2, checkpoint_every=1)
    path = tmp_path / "resumed"
    _run({**cfg, "rounds": 2}, path)
    resume_run(path, {"rounds": 3}, data_dir=None, progress=False)
    assert (path / "metrics.jsonl").read_bytes() == (tmp_path / "r" / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"algorithm": {"name": "local"}}, "algorithm 'local' has no global model"),
        ({"partition": {"client_test_fraction": 0.95}}, "client_test_fraction"),
        ({"partition": {"client_test_fraction": 0.2}, "eval": {"personalized_epochs": -1}}, "personalized_epochs"),
        ({"partition": {"client_test_fraction": 0.2}, "eval": {"epochs": 1}}, "epochs"),
        ({"partition": {"client_test_fraction": 0.2},
          "algorithm": {"name": "local", "aggregation": {"rule": "median"}}}, "aggregation does not apply"),
    ],
)
def test_bad_settings_are_refused_in_one_line(over: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(tiny_config(**over))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_impossible_evaluation_reply_is_rejected(tmp_path: Path) -> None:
    loop = RoundLoop(typed_config(_cfg()), tmp_path, progress=False)
    n = loop.fed.client_test_sizes()[0]
    good = {"num_test": float(n), "global_correct": 1.0, "personal_correct": 0.0}
    assert loop.client_eval.check(Message(metrics=good), n) is None
    for bad in ({**good, "num_test": float(n + 5)}, {**good, "global_correct": float(n + 1)},
                {**good, "personal_correct": 0.5}, {"num_test": float(n), "global_correct": 1.0}):
        reason = loop.client_eval.check(Message(metrics=bad), n)
        assert reason is not None and "\n" not in reason


def test_clients_that_never_trained_are_counted_every_evaluated_round(tmp_path: Path) -> None:
    """Issue 37, point 2: every client is evaluated, and the record says how many never trained yet."""
    from tests.helpers.configs import tiny_config

    cfg = tiny_config(rounds=3, partition={"client_test_fraction": 0.2},
                      algorithm={"name": "ditto", "clients_per_round": 2})
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.toml").write_text(dump(cfg))
    records = RoundLoop(typed_config(cfg), run, progress=False).run().records
    seen: set[int] = set()
    for rec in records:
        seen.update(rec["clients"])
        assert rec["untrained_clients"] == 6 - len(seen)
        assert sum(a is not None for a in rec["personal_accuracy"]) == 6  # the untrained ones too
    assert records[0]["untrained_clients"] == 4
