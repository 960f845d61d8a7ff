"""Secure aggregation over Flower (SecAgg+, ``fedskew deploy init --secagg``): which methods it carries and why it
refuses the others, the bounds of its settings, and the protocol itself (Flower's ``SecAggPlusWorkflow`` on the
server, ``secaggplus_mod`` on the nodes) against a stand-in SuperLink in this process: the mean it reveals is the
weighted mean of the uploads up to its quantisation, every round, also when a client drops out mid-protocol. A real
SuperLink and real SuperNodes run it in tests/engine/test_flower.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is optional: pip install -e '.[flower]'")

from flwr.app import Message as FlowerMessage
from flwr.app import RecordDict

from fedskew.algorithms.base import ALGORITHMS, ClientContext
from fedskew.algorithms.fedavg import FedAvg
from fedskew.algorithms.scaffold import Scaffold
from fedskew.cli import main
from fedskew.config import dump, typed_config
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message
from fedskew.core.params import build_params
from fedskew.engine.flower import client_app, secagg
from fedskew.engine.flower.messages import HEADER
from fedskew.engine.flower.settings import DeploySettings, check_secure_aggregation
from tests.helpers.configs import MODEL, config_for, runnable_config, tiny_config
from tests.helpers.flower import FakeGrid, deploy_on, register_for_flower
from tests.helpers.secagg import assert_within, quantisation_bound, simulated_round

NO_BOUND = {"aggregation": {"max_norm_ratio": 0}}
"""FedAvg's default outlier bound needs every update on its own: secure aggregation runs without it."""

WEIGHTED = {"fedavg", "fedprox", "moon", "fedntd", "fedrs", "fedlc", "feddecorr", "ditto", "apfl", "fedala", "fedrod",
            "fedetf", "fedavgm", "fedadam", "fedbn", "fedper", "fedrep", "fedbabu", "perfedavg", "pfedme"}
UNWEIGHTED = {"scaffold", "feddyn", "feddc_drift"}
REVEALS = "; SecAgg+ reveals only the sum of the uploads"
REFUSED = {
    "fedaf": "uploads condensed images, which the server must see one by one" + REVEALS,
    "feddm": "uploads condensed images, which the server must see one by one" + REVEALS,
    "feddc": "uploads condensed images, which the server must see one by one to train on them" + REVEALS,
    "feddc_plus": "uploads condensed images, which the server must see one by one to train on them" + REVEALS,
    "hfldd": "relays each client's distilled data to its cluster header through the server, which sees it one by one"
             + REVEALS,
    "fedgen": "trains its generator on each client's classifier head and label counts, which the server must see one "
              "by one" + REVEALS,
    "ccvr": "calibrates on each client's per-class feature means and covariances, which the server must see one by one"
            + REVEALS,
    "cim": "reads each client's class counts every round to select clients and to measure oversampling" + REVEALS,
    "fednova": "weights each client's update by its own count of local steps (normalised averaging), which the server "
               "applies client by client" + REVEALS,
    "fedseq": "hands each client's model on to the next client through the server (sequential training), so the "
              "server holds every model" + REVEALS,
    "local": "trains no global model: its clients upload nothing to aggregate",
    "centralized": "pools the clients' training data on the server: there is no upload to aggregate",
}


def _check(cfg: dict[str, Any], **settings: Any) -> None:
    check_secure_aggregation(typed_config(cfg), DeploySettings(secagg=True, **settings))


def _refusal(cfg: dict[str, Any], **settings: Any) -> str:
    with pytest.raises(ConfigError) as err:
        _check(cfg, **settings)
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- which methods, and why not -------------------------------------------------------------------------
def test_every_method_says_whether_secure_aggregation_carries_it_and_why_not() -> None:
    """Every registered method is classified (a new one must say), each refusal one line naming it and why."""
    assert set(ALGORITHMS.names()) == WEIGHTED | UNWEIGHTED | set(REFUSED)
    for name in sorted(ALGORITHMS.names()):
        cfg = runnable_config(name)
        if "aggregation" in cfg["algorithm"] or name in WEIGHTED:
            cfg["algorithm"] = {**cfg["algorithm"], **NO_BOUND}
        cls = ALGORITHMS.get(name)
        if name in REFUSED:
            assert cls.sum_only() is None
            assert _refusal(cfg) == f"secure aggregation: algorithm {name!r} {REFUSED[name]}"
        else:
            _check(cfg)
            assert cls.sum_only() == ("num_samples" if name in WEIGHTED else "equal"), name


def test_a_method_states_it_itself_a_subclass_inherits_no_acceptance(monkeypatch: pytest.MonkeyPatch) -> None:
    class Median(FedAvg):  # a plug-in that might combine the replies its own way: refused until it declares
        pass

    name = register_for_flower(monkeypatch, "my_median", Median)
    cfg = tiny_config(algorithm={"name": name, **NO_BOUND})
    assert _refusal(cfg) == (
        "secure aggregation: algorithm 'my_median' does not declare that its server needs only the mean of the "
        "clients' train replies (the class attribute sum_only_uploads)"
    )
    Median.sum_only_uploads = "num_samples"
    _check(cfg)


@pytest.mark.parametrize(("aggregation", "message"), [
    ({}, "bounds each update by aggregation.max_norm_ratio = 10 x the round's median norm, which needs every update "
         "on its own; SecAgg+ reveals only their sum: set algorithm.aggregation.max_norm_ratio=0"),
    ({"rule": "median"}, "combines the updates by aggregation.rule = 'median', which needs every update on its own; "
                         "SecAgg+ reveals only their sum: set algorithm.aggregation.rule=mean"),
    ({"rule": "trimmed_mean", "max_norm_ratio": 0}, "combines the updates by aggregation.rule = 'trimmed_mean', which "
     "needs every update on its own; SecAgg+ reveals only their sum: set algorithm.aggregation.rule=mean"),
    ({"clip_norm": 2.0, "max_norm_ratio": 0}, "clips each update to aggregation.clip_norm = 2, which needs every "
     "update on its own; SecAgg+ reveals only their sum: set algorithm.aggregation.clip_norm=0"),
])
def test_aggregation_that_needs_every_update_is_refused(aggregation: dict[str, Any], message: str) -> None:
    for name in ("fedavg", "pfedme"):  # FedAvg's family and the model-averaging server
        cfg = config_for(name)
        cfg["algorithm"]["aggregation"] = aggregation
        assert _refusal(cfg) == f"secure aggregation: algorithm {name!r} {message}"


@pytest.mark.parametrize(("table", "message"), [
    ({"secagg_num_shares": 4}, "secagg_num_shares must be an odd integer >= 3, or 0 for every client of the round, "
                               "got 4"),
    ({"secagg_num_shares": 1}, "secagg_num_shares must be an odd integer >= 3, or 0 for every client of the round, "
                               "got 1"),
    ({"secagg_reconstruction_threshold": 0.5}, "secagg_reconstruction_threshold must be in (0.5, 1], got 0.5"),
    ({"secagg_reconstruction_threshold": 1.5}, "secagg_reconstruction_threshold must be in (0.5, 1], got 1.5"),
    ({"secagg_clipping_range": 0}, "secagg_clipping_range must be > 0, got 0.0"),
    ({"secagg_quantization_range": 1}, "secagg_quantization_range must be an integer in [2, 2_147_483_647], got 1"),
    ({"secagg_quantization_range": 2**31}, "secagg_quantization_range must be an integer in [2, 2_147_483_647], "
                                           "got 2147483648"),
    ({"secagg": "yes"}, "secagg must be true or false, got 'yes'"),
])
def test_bad_settings_are_refused_in_one_line(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_params(DeploySettings, table, prefix="run config ")
    assert str(err.value) == f"run config {message}"


@pytest.mark.parametrize(("over", "settings", "message"), [
    ({"algorithm": {"clients_per_round": 1}}, {}, "algorithm.clients_per_round = 1, but the sum of one client's "
     "upload is the upload itself: SecAgg+ needs at least 2 clients a round"),
    ({}, {"secagg_num_shares": 5}, "secagg_num_shares = 5 exceeds the 3 clients of a round: at most 3, or 0 for every "
     "client of the round"),
    ({}, {"secagg_quantization_range": 2**31 - 1}, "secagg_quantization_range = 2147483647 for 3 clients a round lets "
     "the quantised sum reach 2**32, SecAgg+'s modulus, where it wraps: at most 1431655765"),
    ({"faults": {"malicious": 0.2}}, {}, "faults.malicious = 0.2 acts on a client's reply after SecAgg+ has added its "
     "upload to the sum, which cannot be taken out: set faults.malicious=0"),
    ({"privacy": {"mode": "central"}}, {}, "privacy.mode = 'central' clips each client's update on the server, which "
     "needs every update on its own; SecAgg+ reveals only their sum: use privacy.mode=local (each client clips and "
     "adds its noise before its upload is masked)"),
])
def test_settings_the_run_cannot_carry_are_refused_in_one_line(
    over: dict[str, Any], settings: dict[str, Any], message: str
) -> None:
    cfg = tiny_config(**{"algorithm": NO_BOUND, **over})
    cfg["algorithm"] = {**cfg["algorithm"], **NO_BOUND}
    assert _refusal(cfg, **settings) == f"secure aggregation: {message}"


def test_deploy_init_refuses_before_writing_anything(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("exp.toml").write_text(dump(tiny_config(algorithm={"name": "fedaf", "clients_per_round": 3})))
    for argv, line in [
        (["--secagg"], f"secure aggregation: algorithm 'fedaf' {REFUSED['fedaf']}"),
        (["--secagg-num-shares", "3"], "--secagg-num-shares is a parameter of secure aggregation: add --secagg"),
        (["--secagg", "--secagg-num-shares", "2", "algorithm.name=fedavg", "algorithm.aggregation.max_norm_ratio=0"],
         "run setting secagg_num_shares must be an odd integer >= 3, or 0 for every client of the round, got 2"),
    ]:
        assert main(["deploy", "init", "app", "exp.toml", *argv]) == 2
        err = [e for e in capsys.readouterr().err.splitlines() if e.strip()]
        assert err == [f"fedskew: error: {line}"]
    assert not Path("app").exists()
    assert main(["deploy", "init", "app", "exp.toml", "--secagg", "--secagg-clipping-range", "4",
                 "algorithm.name=fedavg", "algorithm.aggregation.max_norm_ratio=0"]) == 0
    assert "secure aggregation: on" in capsys.readouterr().out
    text = Path("app/pyproject.toml").read_text()
    assert "secagg = true\n" in text and "secagg_clipping_range = 4.0\n" in text and "secagg_num_shares = 0\n" in text


# ---- the protocol, against a stand-in SuperLink ---------------------------------------------------------
def _secure_config(nodes: int, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(**over)
    cfg["partition"] = {**cfg["partition"], "num_clients": nodes}
    cfg["algorithm"] = {**cfg["algorithm"], "clients_per_round": nodes}
    if getattr(ALGORITHMS.get(cfg["algorithm"]["name"]).Params, "averages_models", False):
        cfg["algorithm"] = {**cfg["algorithm"], **NO_BOUND}
    return cfg


def _one_node_each(nodes: int) -> FakeGrid:
    return FakeGrid([{"partition-id": k} for k in range(nodes)])


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", [FedAvg, Scaffold])
def test_a_secure_round_equals_the_simulators_up_to_the_quantisation(
    probe: str, tmp_path: Path, method: type
) -> None:
    """FedAvg (weighted by num_samples) and SCAFFOLD (unweighted; BatchNorm's integer counters in the clear): the
    global model after round 1 lies within the bound SecAgg+'s quantisation allows of the simulator's, and is not
    the simulator's (the uploads were quantised and masked: the server never had them)."""
    cfg = _secure_config(3, algorithm={"name": method.name}, rounds=1)
    if method is Scaffold:
        cfg["model"] = dict(MODEL)  # a ConvNet with BatchNorm: integer buffers
    run_dir = deploy_on(_one_node_each(3), tmp_path, cfg, secagg=True)
    plain, updates = simulated_round(cfg, tmp_path / "sim", method)
    secure = torch.load(run_dir / "model.pt", weights_only=True)
    settings = DeploySettings()
    bound = quantisation_bound(updates, settings.secagg_clipping_range, settings.secagg_quantization_range,
                               weighted=method is FedAvg)
    assert assert_within(secure, plain, bound) > 0 and bound < 1e-4
    [record] = _records(run_dir)
    assert record["clients"] == [0, 1, 2] and not record["failed"] and not record["rejected"]


@pytest.mark.parametrize("mode", ["local", "sample"])
def test_client_side_dp_composes_with_secure_aggregation(probe: str, tmp_path: Path, mode: str) -> None:
    """privacy.mode = local (or sample): each client clips and noises its update (or trains with DP-SGD) before
    SecAgg+ masks it; the run accounts each client, and its global model is the simulator's private one up to the
    quantisation (the same noise: each client's stream)."""
    from fedskew.engine.round_loop import RoundLoop

    cfg = _secure_config(3, rounds=1, privacy={"mode": mode, "noise_multiplier": 0.5, "clip": 0.1})
    run_dir = deploy_on(_one_node_each(3), tmp_path, cfg, secagg=True)
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "config.toml").write_text(dump(cfg))
    sim = RoundLoop(typed_config(cfg), tmp_path / "sim", progress=False)
    sim.run()
    [record] = _records(run_dir)
    assert record["epsilon"] == _records(tmp_path / "sim")[0]["epsilon"] > 0
    secure = torch.load(run_dir / "model.pt", weights_only=True)
    plain = sim.server.model.state_dict()
    assert max(float((secure[k].double() - plain[k].double()).abs().max()) for k in plain) < 1e-4


def test_every_round_reveals_the_weighted_mean_of_the_uploads_also_after_a_dropout(
    probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds of four clients; in round 2, client 3 goes silent once it holds its request (after the key
    exchange): the others' masks cancel, its own are rebuilt from the shares, and the mean SecAgg+ reveals is the
    weighted mean of the three uploads that arrived, within the quantisation bound, as in round 1 of all four."""
    uploads: list[tuple[int, float, list[np.ndarray]]] = []  # node, weight, arrays: what each client uploaded
    revealed: list[tuple[float, list[np.ndarray]]] = []  # max_weight, the mean: what the server learnt
    weights: list[float] = []

    def upload(request: Message, reply: Message, weighting: str, context: Any) -> RecordDict:
        records = real_upload(request, reply, weighting, context)
        arrays = [a.numpy() for a in records[secagg.UPLOAD].values()]
        uploads.append((context.node_id, float(records[secagg.WEIGHT]["num_examples"]), arrays))
        return records

    def workflow(self: secagg.SecureTrain, requests: Any, max_weight: float) -> Any:
        weights.append(max_weight)
        return real_workflow(self, requests, max_weight)

    def replies(mean: list[np.ndarray], clear: Any, base: Message) -> dict[int, Message]:
        revealed.append((weights[-1], [m.copy() for m in mean]))
        return real_replies(mean, clear, base)

    real_upload, real_workflow, real_replies = secagg.secure_upload, secagg.SecureTrain.workflow, secagg._replies
    monkeypatch.setattr(client_app, "secure_upload", upload)
    monkeypatch.setattr(secagg.SecureTrain, "workflow", workflow)
    monkeypatch.setattr(secagg, "_replies", replies)
    grid = _one_node_each(4)
    push = grid.push_messages

    def silence_in_round_2(messages: list[FlowerMessage]) -> list[str]:
        for m in messages:
            head = m.content.config_records.get(HEADER)
            if m.metadata.dst_node_id == grid.node_of(3) and head is not None and head["round"] == 2:
                grid.dead.add(grid.node_of(3))
        return push(messages)

    grid.push_messages = silence_in_round_2  # type: ignore[method-assign]
    run_dir = deploy_on(grid, tmp_path, _secure_config(4, rounds=2), secagg=True, reply_timeout=0.5)
    records = _records(run_dir)
    assert [r["clients"] for r in records] == [[0, 1, 2, 3], [0, 1, 2]]
    assert records[1]["failed"] == [[3, "no reply within 0.5 s"]]
    assert [len(group) for group in (uploads[:4], uploads[4:])] == [4, 3] and len(revealed) == 2
    settings = DeploySettings()
    for (top, mean), sent in zip(revealed, (uploads[:4], uploads[4:]), strict=True):
        assert top >= max(w for _, w, _ in sent)
        total = sum(w for _, w, _ in sent)
        exact = [sum(w * a[i] for _, w, a in sent) / total for i in range(len(mean))]
        as_updates = [(w, {str(i): torch.from_numpy(x) for i, x in enumerate(a)}) for _, w, a in sent]
        bound = quantisation_bound(as_updates, settings.secagg_clipping_range, settings.secagg_quantization_range,
                                   max_weight=top)
        worst = max(float(np.abs(m - e).max()) for m, e in zip(mean, exact, strict=True))
        assert 0 < worst <= bound, (worst, bound)


def test_a_node_serving_several_partitions_is_refused(probe: str, tmp_path: Path) -> None:
    grid = FakeGrid([{"partition-id": "0,1"}, {"partition-id": 2}])
    with pytest.raises(FedskewError, match=r"^secure aggregation masks one upload per SuperNode, but SuperNode 100 "
                                           r"serves partitions \[0, 1\]: start one SuperNode per partition$"):
        deploy_on(grid, tmp_path, _secure_config(3, rounds=1), secagg=True)


class Boastful(FedAvg):
    """FedAvg whose client 2 claims more samples than it holds (in the clear, beside its masked upload)."""

    sum_only_uploads = "num_samples"

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        reply = super().client_step(task, msg, client)
        if task == "train" and client.cid == 2:
            reply.metrics["num_samples"] = 10_000.0
        return reply


def test_a_rejected_reply_stops_the_run_its_upload_is_already_in_the_sum(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = register_for_flower(monkeypatch, "boastful", Boastful)
    cfg = _secure_config(3, rounds=2, algorithm={"name": name})
    with pytest.raises(FedskewError, match=r"the 'train' reply of client 2 was rejected \(claims 10000 samples, but "
                                           r"client 2 holds at most \d+\), but secure aggregation had already added "
                                           r"its upload to the sum, which cannot be taken out"):
        deploy_on(_one_node_each(3), tmp_path, cfg, secagg=True)
