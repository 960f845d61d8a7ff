"""Each personalised method's rule, checked where its paper makes a claim that can fail: limits of its
parameters (Ditto, APFL, FedALA), what never travels or never changes (FedPer, FedRep, FedBABU), and
inner steps on a toy quadratic worked by hand (pFedMe, Per-FedAvg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fedskew.algorithms.fedala as fedala_module
from fedskew.algorithms.base import ClientContext
from fedskew.algorithms.fedala import FedALA
from fedskew.algorithms.perfedavg import meta_step
from fedskew.algorithms.pfedme import moreau_pull, moreau_steps
from fedskew.components.personal import head_keys, parameter_layers
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.plugins import MODEL, fresh_registries, write_plugin
from tests.helpers.toy_federation import client_of, fed_info, filled, make, reply, server_of

HEAD = {"classifier.weight", "classifier.bias"}


def personal_config(**over: Any) -> dict[str, Any]:
    """The tiny federation with a 25% test split on every client (the per-client evaluation)."""
    cfg = tiny_config(**over)
    cfg["partition"]["client_test_fraction"] = 0.25
    return cfg


def simulate(cfg: dict[str, Any], path: Path) -> RoundLoop:
    """Run ``cfg``; the loop keeps the final global model and the clients' states (``records``: its metrics)."""
    sim = RoundLoop(typed_config(cfg), path, progress=False)
    sim.records = sim.run().records  # type: ignore[attr-defined]
    return sim


def own_models(sim: RoundLoop) -> list[dict[str, torch.Tensor]]:
    """Each trained client's own model (``personal_state``) under the run's final global model."""
    glob = Message(arrays=sim.server.model.state_dict())
    out = []
    for cid, state in sim.client_states.items():
        x, y = sim.fed.client_data(cid)
        client = ClientContext(cid=cid, round=sim.round, x=x, y=y, fed=sim.fed.info, state=state)
        out.append(sim.algorithm.personal_state(glob, client))
    assert out
    return out


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return sum(float((a[k] - b[k]).pow(2).sum()) for k in a if a[k].is_floating_point()) ** 0.5


# ---- the head/body declaration ----------------------------------------------------------------------


def test_the_head_is_the_models_declaration() -> None:
    fed = fed_info("mlp", image_size=2, hidden=(4,))
    model = fed.model.build()
    assert head_keys(model) == HEAD
    model.head_modules = ("features", "classifier")  # a model may widen its head
    assert head_keys(model) == set(model.state_dict())
    with pytest.raises(ConfigError, match="declares no head"):
        head_keys(nn.Linear(2, 2))
    assert parameter_layers(fed.model.build())[-1] == ["classifier.weight", "classifier.bias"]


def test_a_plugin_models_head_is_kept_by_the_client(tmp_path: Path) -> None:
    """The plug-in's model (a FedModel written outside fedskew) works with a head/body method unchanged."""
    plugin = write_plugin(tmp_path / "code")
    with fresh_registries():
        cfg = personal_config(rounds=2, algorithm={"name": "fedrep", "head_epochs": 1})
        cfg["model"] = {"name": MODEL, "hidden": 12}
        cfg["plugins"] = [str(plugin)]
        sim = simulate(cfg, tmp_path / "r")
        initial = sim.algorithm.init_model().state_dict()
        final = sim.server.model.state_dict()
        assert all(torch.equal(final[k], initial[k]) for k in HEAD)
        assert all(set(s["head"]) == HEAD for s in sim.client_states.values())
        assert all(a is not None for a in sim.records[-1]["personal_accuracy"])


# ---- FedPer and FedRep: the head never travels -----------------------------------------------------------


@pytest.mark.parametrize("name", ["fedper", "fedrep"])
def test_fedper_and_fedrep_never_send_the_head(name: str) -> None:
    fed = fed_info("mlp", image_size=2, hidden=(4,))
    algo = make(name, fed, lr=0.1, batch_size=4)
    server = server_of(algo)
    server_head = {k: v.clone() for k, v in server.model.state_dict().items() if k in HEAD}
    (_, msg), *_ = algo.configure(server)
    assert msg.arrays and not HEAD & set(msg.arrays)
    client = client_of(fed)
    out = algo.client_step("train", msg, client)
    assert out.arrays and not HEAD & set(out.arrays)
    assert set(algo.reply_spec("train", server) or {}) == set(out.arrays)
    assert set(client.state["head"]) == HEAD
    assert any(not torch.equal(client.state["head"][k], server_head[k]) for k in HEAD)  # the client's own head
    algo.aggregate(server, [(0, out)])
    for k, v in server.model.state_dict().items():
        assert torch.equal(v, server_head[k] if k in HEAD else out.arrays[k])
    # the client's own model is the global body under its own head
    own = algo.personal_state(Message(arrays=server.model.state_dict()), client)
    assert all(torch.equal(own[k], client.state["head"][k]) for k in HEAD)


def test_fedrep_updates_the_body_with_the_head_fixed() -> None:
    """Without head epochs the client's head stays as it was: the body's epochs never move it (Alg. 1)."""
    fed = fed_info("mlp", image_size=2, hidden=(4,))
    heads = {}
    for head_epochs in (0, 1):
        algo = make("fedrep", fed, lr=0.1, batch_size=4, head_epochs=head_epochs)
        server = server_of(algo)
        (_, msg), *_ = algo.configure(server)
        client = client_of(fed)
        out = algo.client_step("train", msg, client)
        assert distance(out.arrays, msg.arrays) > 0  # the body trained
        heads[head_epochs] = client.state["head"]
    initial = algo.initial_head()
    assert all(torch.equal(heads[0][k], initial[k]) for k in HEAD)
    assert any(not torch.equal(heads[1][k], initial[k]) for k in HEAD)


# ---- FedBABU: the head never changes during federated training -------------------------------------------


def test_fedbabu_never_updates_the_head_during_training(tmp_path: Path) -> None:
    cfg = personal_config(rounds=2, algorithm={"name": "fedbabu", "clients_per_round": 6})
    sim = simulate(cfg, tmp_path / "r")
    initial = sim.algorithm.init_model().state_dict()
    final = sim.server.model.state_dict()
    assert all(torch.equal(final[k], initial[k]) for k in HEAD)
    assert any(not torch.equal(final[k], initial[k]) for k in final if k not in HEAD)  # the body trained
    fed = sim.fed.info
    algo = sim.algorithm
    (_, msg), *_ = algo.configure(sim.server)
    assert not HEAD & set(msg.arrays)
    client = ClientContext(cid=0, round=3, x=sim.fed.client_data(0)[0], y=sim.fed.client_data(0)[1], fed=fed)
    out = algo.client_step("train", msg, client)
    assert not HEAD & set(out.arrays) and not client.state
    trained = client.model().state_dict()  # the model the client trained: the fixed head is as it was
    assert all(torch.equal(trained[k], initial[k]) for k in HEAD)
    # the own model is the global model fine-tuned, head included
    own = algo.personal_state(Message(arrays=final), client)
    assert any(not torch.equal(own[k], initial[k]) for k in HEAD)


def test_fedbabu_fine_tunes_body_and_head_with_finetune_lr() -> None:
    """One epoch, one batch of all 8 samples, no momentum: the own model is w - finetune_lr grad f(w), the
    training lr playing no part (the authors' notebook fine-tunes at 1e-3 what it trained at 0.1)."""
    fed = fed_info(image_size=2)
    algo = make("fedbabu", fed, lr=0.3, batch_size=64, finetune_epochs=1, finetune_lr=0.05)
    server = server_of(algo)
    client = client_of(fed)
    own = algo.personal_state(Message(arrays=server.model.state_dict()), client)
    model = fed.model.build()
    model.load_state_dict(server.model.state_dict())
    nn.functional.cross_entropy(model(client.x), client.y).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(own[name], p.detach() - 0.05 * p.grad, atol=1e-6)


# ---- Ditto ---------------------------------------------------------------------------------------------


def test_ditto_with_lambda_zero_is_local_training(tmp_path: Path) -> None:
    local = simulate(personal_config(rounds=3, algorithm={"name": "local"}), tmp_path / "local")
    ditto = simulate(personal_config(rounds=3, algorithm={"name": "ditto", "lam": 0.0}), tmp_path / "ditto0")
    pulled = simulate(personal_config(rounds=3, algorithm={"name": "ditto", "lam": 1.0}), tmp_path / "ditto1")
    assert set(local.client_states) == set(ditto.client_states)
    for cid, state in local.client_states.items():
        own = ditto.client_states[cid]["personal"]
        assert all(torch.equal(state["model"][k], own[k]) for k in own)
    assert [r["personal_accuracy"] for r in local.records] == [r["personal_accuracy"] for r in ditto.records]
    assert any(distance(local.client_states[c]["model"], s["personal"]) > 0 for c, s in pulled.client_states.items())


def test_ditto_with_a_large_lambda_keeps_the_personal_model_at_the_global_one() -> None:
    fed = fed_info(image_size=2)
    moved = {}
    for lam in (0.0, 100.0):
        algo = make("ditto", fed, lam=lam, lr=0.005, batch_size=4, personal_epochs=10)
        server = server_of(algo, fill=0.5)
        (_, msg), *_ = algo.configure(server)
        start = filled(server, -1.0)
        client = client_of(fed, state={"personal": start})
        algo.client_step("train", msg, client)
        moved[lam] = distance(client.state["personal"], msg.arrays) / distance(start, msg.arrays)
    assert moved[0.0] > 0.5  # alone, v_k stays far from w^t
    assert moved[100.0] < 0.01  # pulled hard, it is at w^t


def test_ditto_personal_epochs_follow_local_epochs_when_unset() -> None:
    """The authors' solver gives v_k as many steps as w: unset, personal_epochs is local_epochs."""
    fed = fed_info(image_size=2)
    personal = {}
    for key, over in (("unset", {}), ("two", {"personal_epochs": 2}), ("one", {"personal_epochs": 1})):
        algo = make("ditto", fed, lr=0.05, batch_size=4, local_epochs=2, **over)
        server = server_of(algo, fill=0.5)
        (_, msg), *_ = algo.configure(server)
        client = client_of(fed, state={"personal": filled(server, -1.0)})
        algo.client_step("train", msg, client)
        personal[key] = client.state["personal"]
    assert distance(personal["unset"], personal["two"]) == 0.0
    assert distance(personal["unset"], personal["one"]) > 0.0


# ---- APFL ----------------------------------------------------------------------------------------------


def test_apfl_with_alpha_zero_is_fedavgs_global_model(tmp_path: Path) -> None:
    avg = simulate(personal_config(rounds=3), tmp_path / "avg")
    apfl = simulate(personal_config(rounds=3, algorithm={"name": "apfl", "alpha": 0.0, "adaptive": False}),
                    tmp_path / "apfl0")
    a, b = avg.server.model.state_dict(), apfl.server.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    last = apfl.records[-1]
    assert last["personal_accuracy"] == last["client_accuracy"] == avg.records[-1]["client_accuracy"]
    assert all(distance(own, b) == 0 for own in own_models(apfl))  # the personalised model is w itself
    mixed = simulate(personal_config(rounds=3, algorithm={"name": "apfl", "alpha": 0.5, "adaptive": False}),
                     tmp_path / "apfl5")
    assert all(distance(own, b) > 0 for own in own_models(mixed))


def test_apfl_learns_alpha_within_bounds() -> None:
    fed = fed_info(image_size=2)
    for alpha_lr, start in ((0.1, 0.25), (1e4, 0.5)):
        algo = make("apfl", fed, lr=0.1, batch_size=4, alpha=start, alpha_lr=alpha_lr)
        server = server_of(algo)
        (_, msg), *_ = algo.configure(server)
        client = client_of(fed, state={"local": filled(server, 1.0)})
        algo.client_step("train", msg, client)
        alpha = client.state["alpha"]
        assert 0.0 <= alpha <= 1.0 and alpha != start
    assert alpha in (0.0, 1.0)  # a huge step is clipped to the bounds


def test_apfl_raises_alpha_when_the_local_model_fits_the_client_better() -> None:
    """v_i trained on the client's data, w the untrained global model: the gradient in alpha_i is negative
    (mixing in more of v_i lowers the loss), so alpha_i grows (Eq. 10)."""
    fed = fed_info(image_size=2)
    algo = make("apfl", fed, lr=0.05, batch_size=4, alpha=0.25)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed, n=16)
    fitted = fed.model.build()
    fitted.load_state_dict(msg.arrays)
    train_local(fitted, client.x, client.y, LocalConfig(epochs=50, batch_size=16, lr=0.5), torch.Generator())
    client.state["local"] = {k: v.detach().clone() for k, v in fitted.state_dict().items()}
    algo.client_step("train", msg, client)
    assert client.state["alpha"] > 0.25


# ---- pFedMe and Per-FedAvg on a toy quadratic --------------------------------------------------------------


class Point(nn.Module):
    """A model that is just a vector w (float64), for losses written by hand."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(values, dtype=torch.float64))


def quadratic(a: list[float], c: list[float]) -> Any:
    """f(w) = 1/2 sum_j a_j (w_j - c_j)^2: gradient a (w - c), Hessian diag(a)."""
    at, ct = torch.tensor(a, dtype=torch.float64), torch.tensor(c, dtype=torch.float64)
    return lambda model: 0.5 * (at * (model.w - ct) ** 2).sum()


def test_pfedme_inner_steps_and_local_update_by_hand() -> None:
    """f = (w - 3)^2 (a = 2, c = 3), lambda = 1, personal lr 0.1, K = 2, theta and w from 1:
    theta1 = 1 - 0.1(2(1 - 3) + 0) = 1.4; theta2 = 1.4 - 0.1(2(1.4 - 3) + (1.4 - 1)) = 1.68;
    w <- w - eta lambda (w - theta2) = 1 - 0.5(1 - 1.68) = 1.34 (eta = 0.5). Second coordinate: a = 0, so
    only the proximal term acts and theta stays at w = -2."""
    model = Point([1.0, -2.0])
    anchor = [model.w.detach().clone()]
    moreau_steps(model, quadratic([2.0, 0.0], [3.0, 5.0]), anchor, lam=1.0, lr=0.1, steps=2)
    assert model.w.detach().tolist() == pytest.approx([1.68, -2.0], abs=1e-12)
    moreau_pull(anchor, [model.w.detach()], lam=1.0, lr=0.5)
    assert anchor[0].tolist() == pytest.approx([1.34, -2.0], abs=1e-12)


def test_pfedme_client_sends_w_and_keeps_theta() -> None:
    """R = K = 1 on one batch of all the data: theta = w - personal_lr g (no pull at the start, theta = w)
    is kept, and w - lr lam (w - theta) = w - lr lam personal_lr g is sent, g = grad f(w^t)."""
    fed = fed_info(image_size=2)
    algo = make("pfedme", fed, batch_size=64, local_rounds=1, inner_steps=1, lr=0.01, personal_lr=0.1, lam=15.0)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed)
    out = algo.client_step("train", msg, client)
    model = fed.model.build()
    model.load_state_dict(msg.arrays)
    nn.functional.cross_entropy(model(client.x), client.y).backward()
    for name, p in model.named_parameters():
        w, g = p.detach(), p.grad
        assert torch.allclose(client.state["personal"][name], w - 0.1 * g, atol=1e-6)
        assert torch.allclose(out.arrays[name], w - 0.01 * 15.0 * 0.1 * g, atol=1e-6)


def test_pfedme_server_step_by_hand() -> None:
    """w = 1, clients 2 and 4 (equal sizes): mean 3; beta = 0.5: w = 1 + 0.5 (3 - 1) = 2."""
    fed = fed_info()
    algo = make("pfedme", fed, beta=0.5)
    server = server_of(algo, fill=1.0)
    algo.aggregate(server, [(0, reply(filled(server, 2.0), 5)), (1, reply(filled(server, 4.0), 5))])
    assert all(torch.allclose(p, torch.full_like(p, 2.0)) for p in server.model.parameters())


@pytest.mark.parametrize(("variant", "expected"), [("fo", [1.1, 2.2]), ("hf", [1.06, 1.99])])
def test_per_fedavg_meta_step_by_hand(variant: str, expected: list[float]) -> None:
    """w = (1, -2), alpha = 0.1, beta = 0.5; D: a = (2, 1), c = 0; D': a = (1, 3), c = 1; D'': a = (4, 0.5).
    g = (2, -2), w~ = (0.8, -1.8), g' = grad f(w~; D') = (-0.2, -8.4).
    FO: w - beta g' = (1.1, 2.2). HF: (I - alpha H'') g' = (-0.2 + 0.08, -8.4 + 0.42) = (-0.12, -7.98),
    w - beta (that) = (1.06, 1.99)."""
    model = Point([1.0, -2.0])
    losses = (quadratic([2.0, 1.0], [0.0, 0.0]), quadratic([1.0, 3.0], [1.0, 1.0]), quadratic([4.0, 0.5], [-1.0, 2.0]))
    meta_step(model, losses, alpha=0.1, beta=0.5, variant=variant, delta=1e-3)
    assert model.w.detach().tolist() == pytest.approx(expected, abs=1e-9)


def test_per_fedavg_own_model_is_one_local_step_from_the_global_one() -> None:
    fed = fed_info(image_size=2)
    algo = make("perfedavg", fed, alpha=0.5, batch_size=64)  # one batch holds the client's 8 samples
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed)
    own = algo.personal_state(msg, client)
    model = fed.model.build()
    model.load_state_dict(msg.arrays)
    loss = nn.functional.cross_entropy(model(client.x), client.y)
    loss.backward()
    for name, p in model.named_parameters():
        assert torch.allclose(own[name], p.detach() - 0.5 * p.grad, atol=1e-6)
    assert not client.state


# ---- FedALA --------------------------------------------------------------------------------------------


def test_fedala_weights_stay_in_the_unit_interval() -> None:
    fed = fed_info("mlp", image_size=2, hidden=(4,))
    algo = make("fedala", fed, lr=0.1, batch_size=4, eta=50.0, max_init_epochs=3)
    assert isinstance(algo, FedALA)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed, n=16)
    algo.client_step("train", msg, client)  # round 1: no local model yet, starts from the global one
    assert "weights" not in client.state
    client.round = 2
    msg2 = Message(arrays={k: v + 0.5 for k, v in msg.arrays.items()})  # a global model that moved
    algo.client_step("train", msg2, client)
    weights = client.state["weights"]
    assert set(weights) == HEAD  # p = 1: the head only
    values = torch.cat([w.reshape(-1) for w in weights.values()])
    assert values.min() >= 0 and values.max() <= 1
    assert (values < 1).any()  # learnt, not left at 1
    assert ((values == 0) | (values == 1)).any()  # a large eta reaches the bounds, which hold


def test_fedala_with_no_layers_is_fedavg(tmp_path: Path) -> None:
    avg = simulate(personal_config(rounds=3), tmp_path / "avg")
    ala0 = simulate(personal_config(rounds=3, algorithm={"name": "fedala", "layers": 0}), tmp_path / "ala0")
    ala1 = simulate(personal_config(rounds=3, algorithm={"name": "fedala"}), tmp_path / "ala1")
    a, b, c = (s.server.model.state_dict() for s in (avg, ala0, ala1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert not any("weights" in s for s in ala0.client_states.values())
    assert any("weights" in s for s in ala1.client_states.values())


@pytest.mark.parametrize(("threshold", "passes"), [(1e9, 3), (0.0, 5)])
def test_fedala_start_phase_counts_passes_not_batches(
    monkeypatch: pytest.MonkeyPatch, threshold: float, passes: int
) -> None:
    """The start phase tests the spread of one loss per pass over the sample (the authors' ALA.py): 12 of 16
    samples in batches of 4 are 3 batches a pass; with num_pre_loss = 2 even a huge threshold needs 3 passes
    (9 batches), and a threshold of 0 runs to max_init_epochs = 5 passes (15 batches)."""
    calls: list[int] = []
    original = fedala_module.batch_loss

    def counting(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(len(y))
        return original(model, x, y)

    monkeypatch.setattr(fedala_module, "batch_loss", counting)
    fed = fed_info("mlp", image_size=2, hidden=(4,))
    algo = make("fedala", fed, lr=0.1, batch_size=4, rand_percent=75, num_pre_loss=2, threshold=threshold,
                max_init_epochs=5)
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed, n=16)
    algo.client_step("train", msg, client)  # round 1: no ALA
    assert calls == []
    client.round = 2
    algo.client_step("train", Message(arrays={k: v + 0.5 for k, v in msg.arrays.items()}), client)
    assert calls == [4] * (3 * passes)
    calls.clear()
    client.round = 3
    algo.client_step("train", Message(arrays={k: v + 1.0 for k, v in msg.arrays.items()}), client)
    assert calls == [4] * 3  # after the start phase: one pass
