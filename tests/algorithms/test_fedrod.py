"""FedRoD's rule: the balanced softmax worked by hand (absent classes leave the softmax), the personal head's
loss reaching neither the extractor nor the generic head, the personal head never travelling while the
generic part is averaged, and both accuracies recorded with a client test split."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fedskew.algorithms.fedrod import HEAD, balanced_logits, balanced_softmax_loss
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import config_for, tiny_config
from tests.helpers.runs import assert_resumes_exactly
from tests.helpers.toy_federation import client_of, fed_info, make, reply, server_of


def test_balanced_softmax_by_hand() -> None:
    # Counts (3, 1, 0): n = 4, priors 3/4 and 1/4; the third class is absent.
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    counts = torch.tensor([3, 1, 0])
    y = torch.tensor([0, 1])
    a = 0.75 * math.e ** 1.0
    b = 0.25 * math.e ** 2.0
    first = -math.log(a / (a + b))
    c = 0.75 * math.e ** 0.0
    d = 0.25 * math.e ** -1.0
    second = -math.log(d / (c + d))
    loss = balanced_softmax_loss(logits, y, counts)
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)
    adjusted = balanced_logits(logits, counts)
    assert torch.allclose(adjusted[:, :2], logits[:, :2] + torch.tensor([0.75, 0.25]).log())
    assert torch.isinf(adjusted[:, 2]).all() and (adjusted[:, 2] < 0).all()


def test_equal_counts_are_plain_cross_entropy() -> None:
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3, 0])
    loss = balanced_softmax_loss(logits, y, torch.tensor([7, 7, 7, 7]))
    assert loss.item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)


def test_an_absent_class_leaves_the_softmax() -> None:
    counts = torch.tensor([2, 0, 5])
    y = torch.tensor([0, 2])
    base = torch.tensor([[0.3, -0.2, 1.0], [2.0, 0.1, -0.5]])
    loud = base.clone()
    loud[:, 1] = 50.0  # whatever the absent class's logit, the loss is that of the other two classes
    for z in (base, loud):
        z = z.clone().requires_grad_(True)
        loss = balanced_softmax_loss(z, y, counts)
        loss.backward()
        assert torch.isfinite(loss)
        expected = F.cross_entropy(z.detach()[:, [0, 2]] + torch.tensor([2 / 7, 5 / 7]).log(), torch.tensor([0, 1]))
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
        assert z.grad is not None and torch.equal(z.grad[:, 1], torch.zeros(2))  # no gradient either


def _toy() -> tuple[Any, Any]:
    fed = fed_info("mlp", num_classes=3, image_size=2, hidden=(4,))
    return fed, make("fedrod", fed, lr=0.1, batch_size=4, momentum=0.5)


def test_the_personal_head_never_travels_and_the_generic_part_is_averaged() -> None:
    fed, algo = _toy()
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    assert set(msg.arrays) == set(server.model.state_dict())  # extractor and generic head go down
    clients = [client_of(fed, cid=0), client_of(fed, n=12, cid=1)]
    outs = [algo.client_step("train", msg, c) for c in clients]
    spec = algo.reply_spec("train", server)
    for c, out in zip(clients, outs, strict=True):
        assert set(out.arrays) == set(spec or {}) == set(server.model.state_dict())  # no personal-head keys
        assert not any("personal" in k for k in out.arrays)
        assert set(c.state["personal_head"]) == set(HEAD)
        assert any(not torch.equal(c.state["personal_head"][k], msg.arrays[k]) for k in HEAD)  # it trained
    algo.aggregate(server, [(0, reply(outs[0].arrays, 8)), (1, reply(outs[1].arrays, 12))])
    for k, v in server.model.state_dict().items():
        expected = (8 * outs[0].arrays[k] + 12 * outs[1].arrays[k]) / 20
        assert torch.allclose(v, expected, atol=1e-6), k  # the generic head is averaged too


def test_the_personal_loss_reaches_neither_the_extractor_nor_the_generic_head() -> None:
    fed, algo = _toy()
    (_, msg), *_ = algo.configure(server_of(algo))
    plain = client_of(fed)
    other = client_of(fed, state={"personal_head": {k: torch.full_like(msg.arrays[k], 3.0) for k in HEAD}})
    a = algo.client_step("train", msg, plain)
    b = algo.client_step("train", msg, other)
    assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)  # the same generic update
    assert not torch.equal(plain.state["personal_head"][HEAD[0]], other.state["personal_head"][HEAD[0]])


def test_the_own_model_adds_the_personal_heads_logits_to_the_generic_ones() -> None:
    fed, algo = _toy()
    server = server_of(algo)
    (_, msg), *_ = algo.configure(server)
    client = client_of(fed)
    algo.client_step("train", msg, client)
    own = algo.personal_state(msg, client)
    assert set(own) == set(msg.arrays)
    model = client.model(own)
    head = client.state["personal_head"]
    with torch.no_grad():
        z = model.features(client.x)
        summed = server.model(client.x) + F.linear(z, head[HEAD[0]], head[HEAD[1]])
        assert torch.allclose(model(client.x), summed, atol=1e-5)
    assert "personal_head" in client.state and set(client.state) == {"personal_head"}  # left unchanged


def test_bad_parameters_are_refused() -> None:
    cls = make("fedrod", fed_info()).Params
    with pytest.raises(ConfigError):
        build_params(cls, {"lr": 0.0})
    with pytest.raises(ConfigError):
        build_params(cls, {"local_epochs": 0})
    with pytest.raises(ConfigError):
        build_params(cls, {"personal_lr": 0.1})


def test_both_accuracies_are_recorded_with_a_client_test_split(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=2, algorithm={"name": "fedrod"})
    cfg["partition"]["client_test_fraction"] = 0.25
    RoundLoop(typed_config(cfg), tmp_path, progress=False).run()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for r in recs:
        assert r["accuracy"] is not None
        assert r["client_accuracy_mean"] is not None and r["personal_accuracy_mean"] is not None
        assert all(a is not None for a in r["personal_accuracy"])


def test_fedrod_resumes_exactly(tmp_path: Path) -> None:
    def config(rounds: int) -> dict[str, Any]:
        cfg = config_for("fedrod", rounds=rounds)
        cfg["partition"]["client_test_fraction"] = 0.25
        return cfg

    assert_resumes_exactly(tmp_path, config)


def test_absent_count_reaches_the_generic_step_only_for_clients_lacking_a_class() -> None:
    fed = fed_info("mlp", num_classes=3, image_size=2, hidden=(4,))
    limit = make("fedrod", fed, lr=0.1, batch_size=4)
    floor = make("fedrod", fed, lr=0.1, batch_size=4, absent_count=1.0)
    (_, msg), *_ = limit.configure(server_of(limit))
    # client_of labels are arange(n) % 3: every class present, so the floor changes nothing
    full = [a.client_step("train", msg, client_of(fed)) for a in (limit, floor)]
    assert all(torch.equal(full[0].arrays[k], full[1].arrays[k]) for k in full[0].arrays)
    lacking = []
    for a in (limit, floor):
        c = client_of(fed)
        c.y = c.y % 2  # class 2 absent
        lacking.append(a.client_step("train", msg, c))
    assert any(not torch.equal(lacking[0].arrays[k], lacking[1].arrays[k]) for k in HEAD)
