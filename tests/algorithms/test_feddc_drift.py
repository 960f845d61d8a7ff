"""FedDC with local drift decoupling and correction (Gao et al., CVPR 2022; ``feddc_drift``): its client and
server rules by hand, its persistent drift, its wire cost, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.toy_federation import client_of, fed_info, make, no_exchange, reply, server_of, sgd_by_hand


def run(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def client_with_drift(fed: Any, g: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """A client of 8 samples whose h_i is 0.2 and g_i is -0.1 everywhere (parameter-shaped, as ``g``)."""
    h = {k: torch.full_like(t, 0.2) for k, t in g.items()}
    g_i = {k: torch.full_like(t, -0.1) for k, t in g.items()}
    return h, g_i, client_of(fed, n=8, state={"h": h, "g_i": g_i})


def test_client_step_by_hand() -> None:
    """Two SGD steps on CE + (alpha/2)||theta + h - w||^2 + <theta, g - g_i> done by hand give the reply's
    theta and Delta g, and the client's new h_i = h_i + (theta - w) and g_i+ = g_i - g - (theta - w)/(K eta)."""
    fed = fed_info(image_size=2)
    lr, alpha = 0.1, 0.5
    algo = make("feddc_drift", fed, lr=lr, batch_size=4, alpha=alpha)
    server = server_of(algo)
    g = {k: torch.full_like(v, 0.3) for k, v in server.state["g"].items()}
    server.state["g"] = g
    (_, msg), *_ = algo.configure(server)
    h, g_i, client = client_with_drift(fed, g)
    out = algo.client_step("train", msg, client)

    w = {k: v.clone() for k, v in server.model.state_dict().items()}
    theta, k_steps = sgd_by_hand(fed, w, client, lr, 4,
                                 lambda name, p: alpha * (p + h[name] - w[name]) + g[name] - g_i[name])
    assert k_steps == 2 and out.metrics["steps"] == 2
    assert set(out.arrays) == {f"theta.{k}" for k in w} | {f"dg.{k}" for k in g}
    for k in g:
        assert torch.allclose(out.arrays[f"theta.{k}"], theta[k], atol=1e-6)
        assert torch.allclose(client.state["h"][k], h[k] + theta[k] - w[k], atol=1e-6)
        g_new = g_i[k] - g[k] - (theta[k] - w[k]) / (k_steps * lr)
        assert torch.allclose(client.state["g_i"][k], g_new, atol=1e-5)
        assert torch.allclose(out.arrays[f"dg.{k}"], g_new - g_i[k], atol=1e-5)


def test_server_update_by_hand() -> None:
    """N = 4, |S| = 2: H <- H + (1/N) sum (theta_i - w); w <- mean theta_i + H; g <- g + (1/N) sum dg."""
    fed = fed_info(num_clients=4)
    algo = make("feddc_drift", fed)
    server = server_of(algo, fill=1.0)
    for v in server.state["H"].values():
        v.fill_(0.5)
    shapes = server.state["g"]
    r1 = reply({**{f"theta.{k}": torch.full_like(v, 2.0) for k, v in shapes.items()},
                **{f"dg.{k}": torch.full_like(v, 1.0) for k, v in shapes.items()}}, 5)
    r2 = reply({**{f"theta.{k}": torch.full_like(v, 4.0) for k, v in shapes.items()},
                **{f"dg.{k}": torch.full_like(v, 3.0) for k, v in shapes.items()}}, 50)
    algo.aggregate(server, [(0, r1), (3, r2)])
    # H = 0.5 + ((2 - 1) + (4 - 1)) / 4 = 1.5; w = unweighted mean 3 + H = 4.5; g = (1 + 3) / 4 = 1
    for k, p in server.model.named_parameters():
        assert torch.allclose(server.state["H"][k], torch.full_like(p, 1.5))
        assert torch.allclose(p, torch.full_like(p, 4.5))
        assert torch.allclose(server.state["g"][k], torch.full_like(p, 1.0))


def test_without_penalty_and_correction_the_clients_train_as_fedavg_and_the_server_adds_the_drift() -> None:
    """alpha = 0, correction off: not FedAvg. The local step is FedAvg's (same model bit for bit), but the
    server still adds the mean drift H of all clients to the unweighted mean of the models."""
    fed = fed_info(image_size=2, num_clients=4)
    drift = make("feddc_drift", fed, alpha=0.0, correction=False, batch_size=4)
    avg = make("fedavg", fed, batch_size=4)
    s_drift, s_avg = server_of(drift), server_of(avg)
    assert "g" not in s_drift.state
    (_, m_drift), *_ = drift.configure(s_drift)
    (_, m_avg), *_ = avg.configure(s_avg)
    assert set(m_drift.arrays) == {f"w.{k}" for k in m_avg.arrays}  # no g down
    clients = [client_of(fed, cid=c) for c in (0, 1)]
    r_drift = [(c.cid, drift.client_step("train", m_drift, c)) for c in clients]
    r_avg = [(c.cid, avg.client_step("train", m_avg, client_of(fed, cid=c.cid))) for c in clients]
    for (_, a), (_, b) in zip(r_drift, r_avg, strict=True):
        assert set(a.arrays) == {f"theta.{k}" for k in b.arrays}  # no dg up
        assert all(torch.equal(a.arrays[f"theta.{k}"], b.arrays[k]) for k in b.arrays)
    w = {k: v.clone() for k, v in s_drift.model.state_dict().items()}
    drift.aggregate(s_drift, r_drift)
    for k, p in s_drift.model.named_parameters():
        thetas = [m.arrays[f"theta.{k}"] for _, m in r_drift]
        mean = (thetas[0] + thetas[1]) / 2
        assert torch.allclose(s_drift.state["H"][k], (mean - w[k]) * 2 / 4, atol=1e-7)
        assert torch.allclose(p, mean + (mean - w[k]) / 2, atol=1e-6)


def test_drift_persists_across_rounds_in_client_state() -> None:
    """h_i accumulates theta - w over the rounds a client trains in; g_i is kept beside it."""
    fed = fed_info(image_size=2)
    algo = make("feddc_drift", fed, batch_size=4)
    server = server_of(algo)
    state: dict[str, Any] = {}
    total: dict[str, torch.Tensor] = {}
    for rnd in (1, 2):
        server.round = rnd
        (_, msg), *_ = algo.configure(server)
        out = algo.client_step("train", msg, client_of(fed, rnd=rnd, state=state))
        for k in state["h"]:
            step = out.arrays[f"theta.{k}"] - msg.arrays[f"w.{k}"]
            total[k] = total.get(k, torch.zeros_like(step)) + step
            assert torch.allclose(state["h"][k], total[k], atol=1e-6)
        assert set(state) == {"h", "g_i"}
        algo.aggregate(server, [(0, out)])
    assert any(float(v.abs().sum()) > 0 for v in state["h"].values())


def test_wire_counts_the_correction_both_ways(tmp_path: Path) -> None:
    """The tiny MLP has no buffers: with the correction, down (w, g) and up (theta, dg) are twice FedAvg;
    without it, FedAvg's."""
    avg = run(tiny_config(rounds=2), tmp_path / "avg")
    dc = run(tiny_config(rounds=2, algorithm={"name": "feddc_drift"}), tmp_path / "dc")
    plain = run(tiny_config(rounds=2, algorithm={"name": "feddc_drift", "correction": False}), tmp_path / "plain")
    for a, d, p in zip(avg, dc, plain, strict=True):
        assert d["bytes_client_to_server"] == 2 * a["bytes_client_to_server"] > 0
        assert d["bytes_server_to_client"] == 2 * a["bytes_server_to_client"]
        assert p["bytes_client_to_server"] == a["bytes_client_to_server"]
        assert p["bytes_server_to_client"] == a["bytes_server_to_client"]


@pytest.mark.parametrize("bad", [{"alpha": -0.1}, {"momentum": 0.9}, {"aggregation": {"rule": "median"}},
                                 {"evaluate": "selected"}])
def test_bad_parameters_are_refused_in_one_line(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        make("feddc_drift", fed_info(), **bad)
    assert "\n" not in str(err.value)


def test_the_two_feddcs_cite_each_other_as_not_this_one() -> None:
    ours = ALGORITHMS.get("feddc_drift").paper
    assert "Gao, Fu, Li, Chen, Xu & Xu, CVPR 2022" in ours
    assert "Local Drift Decoupling and Correction" in ours
    assert "not the dataset-condensation FedDC of Kim & Choi" in ours
    assert "not the drift-correcting FedDC of Gao et al." in ALGORITHMS.get("feddc").paper


def test_evaluate_mean_keeps_the_mean_of_the_thetas_and_sends_it_plus_the_drift() -> None:
    """The same replies under evaluate = "cloud" and "mean": the cloud model (mean theta + H) is what both
    send next; "mean" keeps (and so evaluates) the plain mean of the thetas."""
    fed = fed_info(num_clients=4)
    algos = {e: make("feddc_drift", fed, evaluate=e) for e in ("cloud", "mean")}
    servers = {e: server_of(a, fill=1.0) for e, a in algos.items()}
    for e, server in servers.items():
        for v in server.state["H"].values():
            v.fill_(0.5)
        if e == "mean":  # the same sent model w = 1 as the cloud server's: the mean server's model is w - H
            for v in server.model.parameters():
                v.data.fill_(0.5)
    for e, server in servers.items():
        (_, msg), *_ = algos[e].configure(server)
        assert all(torch.allclose(v, torch.ones_like(v)) for k, v in msg.arrays.items() if k.startswith("w."))
    shapes = servers["cloud"].state["g"]
    r1 = reply({**{f"theta.{k}": torch.full_like(v, 2.0) for k, v in shapes.items()},
                **{f"dg.{k}": torch.full_like(v, 1.0) for k, v in shapes.items()}}, 5)
    r2 = reply({**{f"theta.{k}": torch.full_like(v, 4.0) for k, v in shapes.items()},
                **{f"dg.{k}": torch.full_like(v, 3.0) for k, v in shapes.items()}}, 50)
    for e, server in servers.items():
        algos[e].aggregate(server, [(0, r1), (3, r2)])
    # both: H = 0.5 + ((2 - 1) + (4 - 1)) / 4 = 1.5, next w = 3 + 1.5 = 4.5; "mean" keeps 3
    for k, p in servers["mean"].model.named_parameters():
        assert torch.allclose(p, torch.full_like(p, 3.0))
        assert torch.equal(servers["mean"].state["H"][k], servers["cloud"].state["H"][k])
    sent = {e: algos[e].configure(s)[0][1].arrays for e, s in servers.items()}
    for k, v in sent["cloud"].items():
        assert torch.allclose(sent["mean"][k], v)
        if k.startswith("w."):
            assert torch.allclose(v, torch.full_like(v, 4.5))


def test_evaluate_mean_trains_as_cloud_bit_for_bit() -> None:
    """Two rounds with real local training: under both readings the clients get the same model and send the
    same replies, bit for bit; the servers' models differ by H (non-zero after round 1)."""
    fed = fed_info(image_size=2, num_clients=4)
    algos = {e: make("feddc_drift", fed, evaluate=e, batch_size=4) for e in ("cloud", "mean")}
    servers = {e: server_of(a) for e, a in algos.items()}
    states: dict[str, list[dict[str, Any]]] = {e: [{}, {}] for e in algos}
    for rnd in (1, 2):
        replies = {}
        for e, algo in algos.items():
            servers[e].round = rnd
            (_, msg), *_ = algo.configure(servers[e])
            replies[e] = [(c, algo.client_step("train", msg, client_of(fed, cid=c, rnd=rnd, state=states[e][c])))
                          for c in (0, 1)]
            algo.aggregate(servers[e], replies[e])
        for (_, a), (_, b) in zip(replies["cloud"], replies["mean"], strict=True):
            assert set(a.arrays) == set(b.arrays)
            assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    H = servers["mean"].state["H"]
    assert any(float(v.abs().sum()) > 0 for v in H.values())
    for k, p in servers["mean"].model.named_parameters():
        assert torch.allclose(p + H[k], servers["cloud"].model.state_dict()[k], atol=1e-6)


def shard_server(algo: Any, sizes: tuple[int, ...]) -> Any:
    """A toy server whose engine gives the clients' shard sizes ``sizes``."""
    from fedskew.algorithms.base import ServerContext

    server = ServerContext(fed=algo.fed, model=algo.init_model(), exchange=no_exchange, round=1, shard_sizes=sizes)
    algo.setup(server)
    return server


def test_shard_scaling_sends_v_i_and_the_mean_from_the_engines_shard_sizes() -> None:
    """scaling = "shard": with shard sizes n_i = 4, 8, 12, 16 (mean 10), client i gets v_i = n_i / 10 and the mean
    with w and g; a server that knows no shard sizes is refused in one line before round 1."""
    fed = fed_info(image_size=2)
    algo = make("feddc_drift", fed, scaling="shard")
    server = shard_server(algo, (4, 8, 12, 16))
    sent = dict(algo.configure(server))
    for c in range(4):
        assert sent[c].config == {"v": (4 * (c + 1)) / 10, "mean_n": 10.0}
    with pytest.raises(FedskewError) as err:
        server_of(algo)
    assert "\n" not in str(err.value) and "shard size" in str(err.value)


def test_shard_scaling_client_step_by_hand() -> None:
    """n_i = 8 against a mean of 16 (v_i = 0.5), batch 4: two SGD steps on CE + (alpha/(2 v_i))||theta + h - w||^2
    + <theta, g/v_i - g_i>; g_i+ = g_i - g/v_i - (theta - w)/(K eta) with the mean shard's K = 16/4 = 4 (not the
    client's own 2); the reply's dg is v_i (g_i+ - g_i)."""
    fed = fed_info(image_size=2)
    lr, alpha, v = 0.1, 0.5, 0.5
    algo = make("feddc_drift", fed, lr=lr, batch_size=4, alpha=alpha, scaling="shard")
    server = shard_server(algo, (8, 24, 16, 16))
    g = {k: torch.full_like(t, 0.3) for k, t in server.state["g"].items()}
    server.state["g"] = g
    msg = dict(algo.configure(server))[0]
    assert msg.config == {"v": v, "mean_n": 16.0}
    h, g_i, client = client_with_drift(fed, g)
    out = algo.client_step("train", msg, client)

    w = {k: t.clone() for k, t in server.model.state_dict().items()}
    theta, own_steps = sgd_by_hand(fed, w, client, lr, 4,
                                   lambda name, p: alpha / v * (p + h[name] - w[name]) + g[name] / v - g_i[name])
    assert own_steps == 2 and out.metrics["steps"] == 2
    for k in g:
        assert torch.allclose(out.arrays[f"theta.{k}"], theta[k], atol=1e-6)
        g_new = g_i[k] - g[k] / v - (theta[k] - w[k]) / (4 * lr)
        assert torch.allclose(client.state["g_i"][k], g_new, atol=1e-5)
        assert torch.allclose(out.arrays[f"dg.{k}"], v * (g_new - g_i[k]), atol=1e-5)


def test_shard_scaling_on_equal_shards_is_equal_scaling_bit_for_bit() -> None:
    """Equal shards make v_i = 1 and the mean shard's K every client's own: the two readings send the same
    replies, bit for bit, over two rounds."""
    fed = fed_info(image_size=2, num_clients=4)
    algos = {s: make("feddc_drift", fed, scaling=s, batch_size=4) for s in ("equal", "shard")}
    servers = {"equal": server_of(algos["equal"]),
               "shard": shard_server(algos["shard"], (8, 8, 8, 8))}
    states: dict[str, list[dict[str, Any]]] = {s: [{}, {}] for s in algos}
    for rnd in (1, 2):
        replies = {}
        for s, algo in algos.items():
            servers[s].round = rnd
            msgs = dict(algo.configure(servers[s]))
            replies[s] = [(c, algo.client_step("train", msgs[c], client_of(fed, cid=c, rnd=rnd, state=states[s][c])))
                          for c in (0, 1)]
            algo.aggregate(servers[s], replies[s])
        for (_, a), (_, b) in zip(replies["equal"], replies["shard"], strict=True):
            assert set(a.arrays) == set(b.arrays)
            assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    for k, t in servers["equal"].state["g"].items():
        assert torch.equal(t, servers["shard"].state["g"][k])


def test_shard_scaling_runs_on_the_partitions_shard_sizes_and_refuses_a_bad_value(tmp_path: Path) -> None:
    """Two rounds through the engine: the server's shard sizes are the partition's, and the run trains."""
    loop = RoundLoop(typed_config(tiny_config(rounds=2, algorithm={"name": "feddc_drift", "scaling": "shard"})),
                     tmp_path / "shard", progress=False)
    loop.run()
    offsets = loop.fed.offsets
    assert loop.server.shard_sizes == tuple(int(offsets[c + 1] - offsets[c]) for c in range(len(offsets) - 1))
    assert len(set(loop.server.shard_sizes)) > 1  # unequal shards: v_i is not 1 everywhere
    rows = [json.loads(line) for line in (tmp_path / "shard" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    with pytest.raises(ConfigError) as err:
        make("feddc_drift", fed_info(), scaling="weighted")
    assert "\n" not in str(err.value) and "weighted" in str(err.value)


def test_max_grad_norm_clips_each_step_and_a_loose_bound_changes_nothing() -> None:
    """max_grad_norm bounds each step's whole gradient: with a tiny bound theta moves at most K eta bound from w;
    a bound no gradient reaches leaves training bit for bit as without clipping (the default)."""
    fed = fed_info(image_size=2)
    lr = 0.1
    replies = {}
    for name, bound in (("none", None), ("tight", 1e-4), ("loose", 1e9)):
        algo = make("feddc_drift", fed, lr=lr, batch_size=4, max_grad_norm=bound)
        server = server_of(algo)
        (_, msg), *_ = algo.configure(server)
        replies[name] = (msg, algo.client_step("train", msg, client_of(fed, n=8)))
    for k, t in replies["none"][1].arrays.items():
        assert torch.equal(replies["loose"][1].arrays[k], t)
    msg, out = replies["tight"]
    moved = sum(float(((out.arrays[f"theta.{k[2:]}"] - v) ** 2).sum()) for k, v in msg.arrays.items()
                if k.startswith("w.")) ** 0.5
    untouched = sum(float(((replies["none"][1].arrays[f"theta.{k[2:]}"] - v) ** 2).sum())
                    for k, v in msg.arrays.items() if k.startswith("w.")) ** 0.5
    assert 0 < moved <= 2 * lr * 1e-4 * (1 + 1e-5) < untouched  # two steps of at most lr * bound each


@pytest.mark.parametrize("bad", [0, -1.0])
def test_max_grad_norm_must_be_positive(bad: float) -> None:
    with pytest.raises(ConfigError) as err:
        make("feddc_drift", fed_info(), max_grad_norm=bad)
    assert "\n" not in str(err.value) and "max_grad_norm" in str(err.value)
