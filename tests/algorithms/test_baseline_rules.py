"""Each baseline's rule on a toy small enough to check by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS, FederationInfo, ServerContext
from fedskew.algorithms.fedbn import norm_keys
from fedskew.algorithms.fedgen import FedGen, diversity_loss
from fedskew.algorithms.fednova import normalizing_coefficient
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.engine.round_loop import RoundLoop
from fedskew.models.layout import shuffled_batches
from tests.helpers.configs import tiny_config
from tests.helpers.toy_federation import (
    client_of,
    fed_info,
    filled,
    make,
    reply,
    scaffold_client,
    server_of,
    sgd_by_hand,
)

# ---- toy federations (tests/helpers/toy_federation.py) ------------------------------------------------


def params_equal(server: ServerContext, value: float) -> bool:
    return all(torch.allclose(p, torch.full_like(p, value), atol=1e-6) for p in server.model.parameters())


def run(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


# ---- FedProx --------------------------------------------------------------------------------------


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(tmp_path: Path) -> None:
    run(tiny_config(rounds=2), tmp_path / "avg")
    run(tiny_config(rounds=2, algorithm={"name": "fedprox", "mu": 0.0}), tmp_path / "prox0")
    run(tiny_config(rounds=2, algorithm={"name": "fedprox", "mu": 1.0}), tmp_path / "prox1")
    avg, prox0, prox1 = (torch.load(tmp_path / d / "model.pt") for d in ("avg", "prox0", "prox1"))
    assert all(torch.equal(avg[k], prox0[k]) for k in avg)
    assert not all(torch.equal(avg[k], prox1[k]) for k in avg)


def test_fedprox_pulls_local_model_towards_the_global_one() -> None:
    """With a huge mu the local model barely moves from the global one; without it, it does."""
    fed = fed_info(image_size=2)
    moved = {}
    for mu in (0.0, 100.0):
        algo = make("fedprox", fed, mu=mu, lr=0.005, batch_size=4, local_epochs=10)
        server = server_of(algo)
        (_, msg), *_ = algo.configure(server)
        out = algo.client_step("train", msg, client_of(fed))
        moved[mu] = sum(float((out.arrays[k] - msg.arrays[k]).abs().sum()) for k in msg.arrays)
    assert moved[100.0] < 0.5 * moved[0.0]


# ---- SCAFFOLD -------------------------------------------------------------------------------------


def test_scaffold_client_variate_update_by_hand() -> None:
    """Two corrected SGD steps done by hand give the reply's Delta y and Delta c = c_i+ - c_i (option II)."""
    fed = fed_info(image_size=2)
    lr = 0.1
    algo = make("scaffold", fed, lr=lr, batch_size=4)
    server, c, c_i, client, out = scaffold_client(algo)

    # by hand: y <- y - lr (grad + c - c_i) over the client's two shuffled batches of 4
    x = {k: v.clone() for k, v in server.model.state_dict().items()}
    y, k_steps = sgd_by_hand(fed, x, client, lr, 4, lambda name, p: c[name] - c_i[name])
    assert k_steps == 2 and out.metrics["steps"] == 2
    assert set(out.arrays) == {f"dy.{k}" for k in x} | {f"dc.{k}" for k in c}
    for k in x:
        assert torch.allclose(out.arrays[f"dy.{k}"], y[k] - x[k], atol=1e-6)
        c_new = c_i[k] - c[k] + (x[k] - y[k]) / (k_steps * lr)
        assert torch.allclose(out.arrays[f"dc.{k}"], c_new - c_i[k], atol=1e-5)
        assert torch.allclose(client.state["c_i"][k], c_new, atol=1e-5)


def test_scaffold_server_update_by_hand() -> None:
    """x <- x + eta_g mean(dy); c <- c + (|S|/N) mean(dc), with N = 4 clients and |S| = 2 replies."""
    fed = fed_info(num_clients=4)
    algo = make("scaffold", fed, server_lr=0.5)
    server = server_of(algo, fill=1.0)
    keys = list(server.state["c"])
    r1 = reply({**{f"dy.{k}": torch.full_like(v, 2.0) for k, v in server.state["c"].items()},
                **{f"dc.{k}": torch.full_like(v, 1.0) for k, v in server.state["c"].items()}}, 5)
    r2 = reply({**{f"dy.{k}": torch.full_like(v, 4.0) for k, v in server.state["c"].items()},
                **{f"dc.{k}": torch.full_like(v, 3.0) for k, v in server.state["c"].items()}}, 50)
    algo.aggregate(server, [(0, r1), (3, r2)])
    assert params_equal(server, 1.0 + 0.5 * 3.0)  # unweighted mean of 2 and 4, times eta_g
    for k in keys:
        assert torch.allclose(server.state["c"][k], torch.full_like(server.state["c"][k], 2 / 4 * 2.0))


def test_scaffold_sends_twice_fedavg_each_way(tmp_path: Path) -> None:
    avg = run(tiny_config(rounds=2), tmp_path / "avg")
    sca = run(tiny_config(rounds=2, algorithm={"name": "scaffold"}), tmp_path / "sca")
    for a, s in zip(avg, sca, strict=True):
        assert s["bytes_client_to_server"] == 2 * a["bytes_client_to_server"] > 0
        assert s["bytes_server_to_client"] == 2 * a["bytes_server_to_client"]


def test_scaffold_rejects_momentum() -> None:
    with pytest.raises(ConfigError, match="momentum"):
        make("scaffold", fed_info(), momentum=0.9)
    make("scaffold", fed_info(), momentum=0.9, correction="weights")  # NIID-Bench's reading allows it


def test_scaffold_niid_bench_weight_correction_by_hand() -> None:
    """correction = "weights": NIID-Bench's loop (experiments.py 330-365) done by hand.

    Each step is torch's SGD with momentum and weight decay, then w <- w - lr (c - c_i); afterwards
    c_i+ = c_i - c + (x - y)/(K lr) (option II) with K the steps taken.
    """
    fed = fed_info(image_size=2)
    lr, rho, wd = 0.1, 0.9, 0.01
    algo = make("scaffold", fed, lr=lr, batch_size=3, momentum=rho, weight_decay=wd, local_epochs=2,
                correction="weights")
    server, c, c_i, client, out = scaffold_client(algo)

    x = {k: v.clone() for k, v in server.model.state_dict().items()}
    model = fed.model.build()
    model.load_state_dict(x)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=rho, weight_decay=wd)
    gen = client.generator("train")
    steps = 0
    for _ in range(2):
        for b in shuffled_batches(8, 3, gen):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(client.x[b]), client.y[b]).backward()
            opt.step()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p -= lr * (c[name] - c_i[name])
            steps += 1
    y = model.state_dict()
    assert steps == 6 and out.metrics["steps"] == 6
    for k in x:
        assert torch.allclose(out.arrays[f"dy.{k}"], y[k] - x[k], atol=1e-6)
        c_new = c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr)
        assert torch.allclose(out.arrays[f"dc.{k}"], c_new - c_i[k], atol=1e-5)


def test_scaffold_weight_correction_without_momentum_is_the_gradient_correction() -> None:
    fed = fed_info(image_size=2)
    outs = []
    for correction in ("gradient", "weights"):
        algo = make("scaffold", fed, lr=0.1, batch_size=4, weight_decay=0.01, correction=correction)
        server = server_of(algo)
        server.state["c"] = {k: torch.full_like(v, 0.3) for k, v in server.state["c"].items()}
        (_, msg), *_ = algo.configure(server)
        c_i = {k: torch.full_like(v, -0.2) for k, v in server.state["c"].items()}
        outs.append(algo.client_step("train", msg, client_of(fed, n=8, state={"c_i": c_i})))
    gradient, weights = outs
    assert set(gradient.arrays) == set(weights.arrays)
    for k in gradient.arrays:
        assert torch.allclose(gradient.arrays[k], weights.arrays[k], atol=1e-6)


def test_scaffold_sample_weighted_server_update_by_hand() -> None:
    """weighting = "samples": x <- x + eta_g sum (n_i/n) dy_i (NIID-Bench); c's update stays unweighted."""
    fed = fed_info(num_clients=4)
    algo = make("scaffold", fed, weighting="samples")
    server = server_of(algo, fill=1.0)
    r1 = reply({**{f"dy.{k}": torch.full_like(v, 2.0) for k, v in server.state["c"].items()},
                **{f"dc.{k}": torch.full_like(v, 1.0) for k, v in server.state["c"].items()}}, 10)
    r2 = reply({**{f"dy.{k}": torch.full_like(v, 4.0) for k, v in server.state["c"].items()},
                **{f"dc.{k}": torch.full_like(v, 3.0) for k, v in server.state["c"].items()}}, 30)
    algo.aggregate(server, [(0, r1), (3, r2)])
    assert params_equal(server, 1.0 + (10 * 2.0 + 30 * 4.0) / 40)
    for v in server.state["c"].values():
        assert torch.allclose(v, torch.full_like(v, 2 / 4 * 2.0))


def test_scaffold_rejects_unknown_readings() -> None:
    with pytest.raises(ConfigError, match=r"correction must be one of 'gradient', 'weights', got 'both'"):
        make("scaffold", fed_info(), correction="both")
    with pytest.raises(ConfigError, match=r"weighting must be one of 'uniform', 'samples', got 'data'"):
        make("scaffold", fed_info(), weighting="data")


# ---- FedNova --------------------------------------------------------------------------------------


def test_fednova_coefficient_matches_momentum_accumulation() -> None:
    assert normalizing_coefficient(7, 0.0) == 7.0
    assert normalizing_coefficient(3, 0.5) == pytest.approx(1 + 1.5 + 1.75)  # counters 1, 1+rho, 1+rho+rho^2
    counter, total = 0.0, 0.0
    for _ in range(10):
        counter = 0.9 * counter + 1
        total += counter
    assert normalizing_coefficient(10, 0.9) == pytest.approx(total)


def test_fednova_clients_report_their_step_counts() -> None:
    fed = fed_info(image_size=2)
    algo = make("fednova", fed, batch_size=4, local_epochs=2, momentum=0.5)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    for n, steps in ((4, 2), (10, 6)):  # ceil(n / 4) batches x 2 epochs
        out = algo.client_step("train", msg, client_of(fed, n=n))
        assert out.metrics["steps"] == steps
        assert out.metrics["a"] == pytest.approx(normalizing_coefficient(steps, 0.5))


def test_fednova_aggregation_by_hand() -> None:
    """x = 0; client 1: n = 1, a = 1, y = -1; client 2: n = 3, a = 4, y = -2.

    p = (1/4, 3/4); d = (1/1, 2/4); tau_eff = 1/4 + 3 = 3.25; x <- 0 - 3.25 (1/4 + 3/8) = -2.03125,
    where FedAvg would give -1.75.
    """
    fed = fed_info()
    algo = make("fednova", fed)
    server = server_of(algo, fill=0.0)
    algo.aggregate(server, [(0, reply(filled(server, -1.0), 1, a=1.0)), (1, reply(filled(server, -2.0), 3, a=4.0))])
    assert params_equal(server, -2.03125)
    assert server.metrics["tau_eff"] == pytest.approx(3.25)


# ---- FedBN ----------------------------------------------------------------------------------------


def test_fedbn_never_sends_nor_overwrites_normalisation_layers() -> None:
    fed = fed_info("convnet", image_size=4, net_width=4, net_depth=1, net_norm="batchnorm")
    algo = make("fedbn", fed, lr=0.001, batch_size=4)
    server = server_of(algo)
    norm = norm_keys(server.model)
    assert norm == {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
                    "features.1.num_batches_tracked"}
    server_norm = {k: v.clone() for k, v in server.model.state_dict().items() if k in norm}
    (_, msg), *_ = algo.configure(server)
    assert not norm & set(msg.arrays) and msg.arrays

    # the client's own layers persist: a batch counter of 100 becomes 102 after two steps, weight stays ~3
    own = {k: v.clone() for k, v in server_norm.items()}
    own["features.1.num_batches_tracked"] = torch.tensor(100)
    own["features.1.weight"] = torch.full((4,), 3.0)
    client = client_of(fed, n=8, state={"norm": own})
    out = algo.client_step("train", msg, client)
    assert not norm & set(out.arrays)
    kept = client.state["norm"]
    assert set(kept) == norm
    assert int(kept["features.1.num_batches_tracked"]) == 102
    assert torch.allclose(kept["features.1.weight"], torch.full((4,), 3.0), atol=0.01)

    # a new client starts from the initial layers; the server's own layers never change
    fresh = client_of(fed, n=8, cid=1)
    algo.client_step("train", msg, fresh)
    assert int(fresh.state["norm"]["features.1.num_batches_tracked"]) == 2
    algo.aggregate(server, [(0, out)])
    for k, v in server.model.state_dict().items():
        if k in norm:
            assert torch.equal(v, server_norm[k])
        else:
            assert torch.equal(v, out.arrays[k])


# ---- FedAvgM and FedAdam --------------------------------------------------------------------------


def test_fedavgm_server_step_by_hand() -> None:
    """w = 1; round 1 mean 1.5: v = 0.5, w = 1.5; round 2 mean 1.25: v = 0.9*0.5 - 0.25 = 0.2, w = 1.7."""
    fed = fed_info()
    algo = make("fedavgm", fed)
    server = server_of(algo, fill=1.0)
    algo.aggregate(server, [(0, reply(filled(server, 1.0), 1)), (1, reply(filled(server, 2.0), 1))])
    assert params_equal(server, 1.5)
    algo.aggregate(server, [(0, reply(filled(server, 1.25), 1))])
    assert params_equal(server, 1.7)


def test_fedadam_server_step_by_hand() -> None:
    """w = 1; weighted mean (1.5 x 1 + 2 x 3)/4 = 1.875, Delta = 0.875; m = 0.0875; v = 0.01 Delta^2;
    w = 1 + 0.01 m / (sqrt(v) + 1e-3) = 1 + 0.01 * 0.0875 / 0.0885."""
    fed = fed_info()
    algo = make("fedadam", fed)
    server = server_of(algo, fill=1.0)
    algo.aggregate(server, [(0, reply(filled(server, 1.5), 1)), (1, reply(filled(server, 2.0), 3))])
    assert params_equal(server, 1 + 0.01 * 0.0875 / 0.0885)
    for k, m in server.state["adam_m"].items():
        assert torch.allclose(m, torch.full_like(m, 0.0875))
        assert torch.allclose(server.state["adam_v"][k], torch.full_like(m, 0.01 * 0.875**2))
    # second step, Delta = -0.5: m = 0.9*0.0875 - 0.05 = 0.02875; v = 0.99*0.00765625 + 0.01*0.25
    w = 1 + 0.01 * 0.0875 / 0.0885
    algo.aggregate(server, [(0, reply(filled(server, w - 0.5), 1))])
    m2, v2 = 0.9 * 0.0875 - 0.1 * 0.5, 0.99 * 0.01 * 0.875**2 + 0.01 * 0.25
    assert params_equal(server, w + 0.01 * m2 / (math.sqrt(v2) + 1e-3))


# ---- MOON -----------------------------------------------------------------------------------------


def test_moon_contrastive_loss_on_hand_vectors() -> None:
    from fedskew.components.terms import model_contrastive_loss

    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cosines 1 and 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 3.0], [-1.0, -1.0]])  # cosines 0 and -1
    t = 0.5
    row1 = math.log(1 + math.exp((0 - 1) / t))
    row2 = math.log(1 + math.exp((-1 - 1 / math.sqrt(2)) / t))
    assert float(model_contrastive_loss(z, z_glob, z_prev, t)) == pytest.approx((row1 + row2) / 2, rel=1e-5)


def test_moon_keeps_the_previous_model_on_the_client_and_uses_it() -> None:
    fed = fed_info("mlp", image_size=2, hidden=(6,))
    algo = make("moon", fed, batch_size=4, lr=0.1, mu=5.0)
    avg = make("fedavg", fed, batch_size=4, lr=0.1)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed, n=8)
    first = algo.client_step("train", msg, client)  # previous = initial = global model: no pull, log 2
    plain = avg.client_step("train", msg, client_of(fed))
    assert torch.allclose(first.arrays["classifier.weight"], plain.arrays["classifier.weight"], atol=1e-6)
    assert first.metrics["train_loss"] == pytest.approx(plain.metrics["train_loss"] + 5.0 * math.log(2), rel=1e-3)
    prev = client.state["prev_model"]
    assert all(torch.equal(prev[k], first.arrays[k]) for k in prev)
    client.round = 2
    second = algo.client_step("train", msg, client)
    plain = avg.client_step("train", msg, client_of(fed, rnd=2))
    assert not torch.equal(second.arrays["classifier.weight"], plain.arrays["classifier.weight"])
    assert set(second.arrays) == set(msg.arrays)  # the wire carries the model only


# ---- FedDyn ---------------------------------------------------------------------------------------


def test_feddyn_server_h_update_by_hand() -> None:
    """M = 4, alpha = 0.5, theta = 0. Round 1: clients 1 and 3: h = -0.5 (1/4)(1 + 3) = -0.5,
    theta = 2 + 0.5/0.5 = 3. Round 2: clients 3 and 5: h = -0.5 - 0.5 (1/4)(0 + 2) = -0.75, theta = 4 + 1.5."""
    fed = fed_info(num_clients=4)
    algo = make("feddyn", fed, alpha=0.5)
    server = server_of(algo, fill=0.0)
    algo.aggregate(server, [(0, reply(filled(server, 1.0), 10)), (1, reply(filled(server, 3.0), 1))])
    assert all(torch.allclose(h, torch.full_like(h, -0.5)) for h in server.state["h"].values())
    assert params_equal(server, 3.0)
    algo.aggregate(server, [(0, reply(filled(server, 3.0), 1)), (1, reply(filled(server, 5.0), 1))])
    assert all(torch.allclose(h, torch.full_like(h, -0.75)) for h in server.state["h"].values())
    assert params_equal(server, 5.5)


def test_feddyn_client_gradient_update_and_linear_term() -> None:
    """grad_prev <- grad_prev - alpha (theta_k - theta); and the term -<g, w> + (alpha/2)||w - w0||^2."""
    from fedskew.components.terms import linear_term, proximal_term

    m = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 2.0]]))
    g = {"weight": torch.tensor([[3.0, -1.0]])}
    anchor = {"weight": torch.zeros(1, 2)}
    dummy = torch.zeros(1)
    with torch.no_grad():
        assert float(linear_term(g)(m, dummy, dummy, dummy)) == pytest.approx(-(3 - 2))
        assert float(proximal_term(anchor, 0.5)(m, dummy, dummy, dummy)) == pytest.approx(0.25 * 5)

    fed = fed_info(image_size=2)
    algo = make("feddyn", fed, alpha=0.5, batch_size=4)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    prev = {k: torch.full_like(v, 0.1) for k, v in server.state["h"].items()}
    client = client_of(fed, state={"grad_prev": {k: v.clone() for k, v in prev.items()}})
    out = algo.client_step("train", msg, client)
    for k, g_prev in prev.items():
        expected = g_prev - 0.5 * (out.arrays[k] - msg.arrays[k])
        assert torch.allclose(client.state["grad_prev"][k], expected)


# ---- FedGen ---------------------------------------------------------------------------------------


def _fedgen_setup(**params: Any) -> tuple[FedGen, ServerContext, FederationInfo]:
    fed = fed_info("mlp", num_classes=3, image_size=2, hidden=(5,))
    algo = make("fedgen", fed, batch_size=4, **params)
    assert isinstance(algo, FedGen)
    return algo, server_of(algo), fed


def test_fedgen_generator_learns_the_heads_ensemble() -> None:
    """Against fixed heads the generator learns embeddings the label-weighted ensemble classifies as y."""
    algo, server, _ = _fedgen_setup(gen_steps=150, gen_lr=0.01, gen_weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    head_a = {"classifier.weight": torch.randn(3, 5, generator=g), "classifier.bias": torch.zeros(3)}
    head_b = {"classifier.weight": torch.randn(3, 5, generator=g), "classifier.bias": torch.zeros(3)}
    body = {k: v for k, v in server.model.state_dict().items() if not k.startswith("classifier")}
    counts_a, counts_b = torch.tensor([5, 5, 0]), torch.tensor([0, 5, 5])
    replies = [(0, reply({**body, **head_a, "label_counts": counts_a}, 10)),
               (1, reply({**body, **head_b, "label_counts": counts_b}, 10))]
    before = {k: v.clone() for k, v in server.state["generator"].items()}
    algo.aggregate(server, replies)
    assert any(not torch.equal(before[k], server.state["generator"][k]) for k in before)
    assert torch.allclose(server.state["prior"], torch.tensor([0.25, 0.5, 0.25]))
    assert server.metrics["generator_loss"] > 0

    gen = algo.new_generator(5)
    gen.load_state_dict(server.state["generator"])
    y = torch.tensor([0] * 20 + [2] * 20)
    with torch.no_grad():
        feats = gen(torch.randn(40, algo.params.noise_dim, generator=g), y)
    # class 0 is only client A's, class 2 only client B's: each is judged by the head that knows it
    pred_a = (feats[:20] @ head_a["classifier.weight"].T).argmax(1)
    pred_b = (feats[20:] @ head_b["classifier.weight"].T).argmax(1)
    assert (pred_a == 0).float().mean() > 0.9 and (pred_b == 2).float().mean() > 0.9


def test_fedgen_client_term_moves_only_the_head() -> None:
    from fedskew.components.terms import head_term

    fed = fed_info("mlp", num_classes=3, image_size=2, hidden=(5,))
    torch.manual_seed(0)
    model = fed.model.build()
    x, y = torch.randn(4, 1, 2, 2), torch.tensor([0, 1, 0, 1])
    feats, labels = torch.randn(6, 5), torch.tensor([2, 2, 2, 1, 0, 2])
    out = {}
    for with_term in (False, True):
        m = fed.model.build()
        m.load_state_dict(model.state_dict())
        terms = [head_term(lambda: (feats, labels), 1.0)] if with_term else []
        train_local(m, x, y, LocalConfig(batch_size=4, lr=0.5, max_steps=1), torch.Generator(), terms)
        out[with_term] = m.state_dict()
    for k in out[False]:
        same = torch.equal(out[False][k], out[True][k])
        assert same != k.startswith("classifier."), k


def test_fedgen_wire_generator_down_label_counts_up(tmp_path: Path) -> None:
    avg = run(tiny_config(rounds=2), tmp_path / "avg")
    gen = run(tiny_config(rounds=2, algorithm={"name": "fedgen"}), tmp_path / "gen")
    num_classes, clients = 4, 3
    for a, g in zip(avg, gen, strict=True):
        assert g["bytes_client_to_server"] == a["bytes_client_to_server"] + clients * num_classes * 8
    assert gen[0]["bytes_server_to_client"] == avg[0]["bytes_server_to_client"]  # no generator yet
    algo = ALGORITHMS.get("fedgen")
    p = algo.Params()
    gen_params = (p.noise_dim + num_classes) * p.gen_hidden + p.gen_hidden + p.gen_hidden * 32 + 32  # mlp [32]
    extra = clients * 4 * (gen_params + num_classes)  # float32 weights and prior
    assert gen[1]["bytes_server_to_client"] == avg[1]["bytes_server_to_client"] + extra
    assert "generator_loss" in gen[0]


def test_diversity_loss_prefers_spread_outputs() -> None:
    eps = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    collapsed = torch.zeros(8, 3)
    spread = eps[:, :3] * 5
    assert float(diversity_loss(eps, collapsed)) == pytest.approx(1.0)
    assert float(diversity_loss(eps, spread)) < 0.5

