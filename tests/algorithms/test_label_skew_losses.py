"""FedLC's calibrated and FedRS's restricted cross-entropy on hand examples, their neutral settings being
FedAvg byte for byte, their refused settings, and two rounds of each through the round loop."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fedskew.algorithms.base import ClientContext
from fedskew.algorithms.fedlc import calibrated_logits
from fedskew.algorithms.fedrs import restricted_logits
from fedskew.components.batching import why_sequential
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import config_for, tiny_config
from tests.helpers.toy_federation import fed_info, make


def run(cfg: dict[str, Any], path: Path) -> bytes:
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return (path / "metrics.jsonl").read_bytes()


def client_with_labels(labels: list[int], num_classes: int = 4) -> ClientContext:
    fed = fed_info(num_classes=num_classes)
    y = torch.tensor(labels)
    return ClientContext(cid=0, round=1, x=torch.zeros(len(labels), 1, 1, 1), y=y, fed=fed, state={})


# ---- FedLC ----------------------------------------------------------------------------------------------


def test_fedlc_calibrated_loss_by_hand() -> None:
    # counts 16, 1, 0, 81 and tau = 2: offsets tau * n^(-1/4) = 2 * (1/2, 1, -, 1/3) = (1, 2, -, 2/3);
    # class 2 is absent from the client: its calibrated logit is -inf (n^(-1/4) infinite), out of the softmax.
    logits = torch.tensor([[1.0, 2.0, 0.0, 3.0], [0.0, 0.0, 5.0, 1.0]], requires_grad=True)
    y = torch.tensor([0, 3])
    counts = torch.tensor([16, 1, 0, 81])
    cal = calibrated_logits(logits, counts, 2.0)
    # sample 1: (0, 0, -inf, 7/3), label 0 -> log(e^0 + e^0 + e^(7/3)) - 0
    # sample 2: (-1, -2, -inf, 1/3), label 3 -> log(e^-1 + e^-2 + e^(1/3)) - 1/3
    by_hand = (math.log(2 + math.exp(7 / 3)) + math.log(math.exp(-1) + math.exp(-2) + math.exp(1 / 3)) - 1 / 3) / 2
    loss = F.cross_entropy(cal, y)
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    loss.backward()
    assert logits.grad is not None
    # the absent class takes no gradient, however large its logit; the others do
    assert torch.equal(logits.grad[:, 2], torch.zeros(2))
    assert torch.all(logits.grad[:, [0, 1, 3]] != 0)


def test_fedlc_absent_count_is_a_finite_floor_for_the_classes_the_client_lacks() -> None:
    # counts 16, 0 and tau = 2; absent_count = 1: the absent class is calibrated as one sample (offset 2),
    # so it stays in the softmax and takes a gradient; a tiny floor (FL-bench's 1e-8, offset 200) is the limit's
    # loss up to exp(-200).
    logits = torch.tensor([[1.0, 0.5]], requires_grad=True)
    y = torch.tensor([0])
    counts = torch.tensor([16, 0])
    cal = calibrated_logits(logits, counts, 2.0, absent_count=1.0)
    assert torch.allclose(cal, torch.tensor([[0.0, -1.5]]))
    loss = F.cross_entropy(cal, y)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1.5)), rel=1e-6)
    loss.backward()
    assert logits.grad is not None and logits.grad[0, 1] > 0
    limit = F.cross_entropy(calibrated_logits(logits, counts, 2.0), y)
    tiny = F.cross_entropy(calibrated_logits(logits, counts, 2.0, absent_count=1e-8), y)
    assert limit.item() == 0.0 and tiny.item() == pytest.approx(0.0, abs=1e-30)


def test_balanced_softmax_absent_count_counts_the_lacking_class_as_that_many_samples() -> None:
    from fedskew.algorithms.fedetf import balanced_logits as etf_balanced
    from fedskew.algorithms.fedrod import balanced_logits as rod_balanced

    logits = torch.tensor([[0.2, 0.3, -0.1]])
    counts = torch.tensor([3, 0, 1])
    as_one = torch.tensor([3, 1, 1])
    # the same softmax as a client that held one sample of the class it lacks
    for balanced in (rod_balanced, etf_balanced):
        got = balanced(logits, counts, absent_count=1.0).softmax(1)
        assert torch.allclose(got, balanced(logits, as_one).softmax(1), atol=1e-7)
        assert torch.isinf(balanced(logits, counts)[0, 1])  # the default: the limit


def test_fedlc_client_calibrates_by_its_own_label_counts() -> None:
    algo = make("fedlc", fed_info(num_classes=4), tau=2.0)
    client = client_with_labels([0] * 16 + [1] + [3] * 81)
    adjust = algo.logit_adjust(client)  # type: ignore[attr-defined]
    assert adjust is not None
    logits = torch.tensor([[1.0, 2.0, 0.0, 3.0]])
    expected = torch.tensor([[0.0, 0.0, float("-inf"), 3.0 - 2.0 / 3.0]])
    torch.testing.assert_close(adjust(logits, torch.tensor([0])), expected)
    assert make("fedlc", fed_info(num_classes=4), tau=0.0).logit_adjust(client) is None  # type: ignore[attr-defined]
    floored = make("fedlc", fed_info(num_classes=4), tau=2.0, absent_count=1.0).logit_adjust(client)  # type: ignore[attr-defined]
    torch.testing.assert_close(floored(logits, torch.tensor([0]))[:, 2], torch.tensor([-2.0]))


def test_fedlc_with_tau_zero_is_fedavg_byte_for_byte(tmp_path: Path) -> None:
    avg = run(tiny_config(rounds=2), tmp_path / "avg")
    lc0 = run(tiny_config(rounds=2, algorithm={"name": "fedlc", "tau": 0.0}), tmp_path / "lc0")
    lc1 = run(tiny_config(rounds=2, algorithm={"name": "fedlc", "tau": 1.0}), tmp_path / "lc1")
    assert lc0 == avg
    assert lc1 != avg


# ---- FedRS ----------------------------------------------------------------------------------------------


def test_fedrs_scales_only_the_missing_classes_logits_by_hand() -> None:
    logits = torch.tensor([[2.0, -1.0, 4.0, 0.5]], requires_grad=True)
    counts = torch.tensor([3, 0, 1, 0])  # classes 1 and 3 missing on this client
    restricted = restricted_logits(logits, counts, 0.25)
    assert torch.equal(restricted.detach(), torch.tensor([[2.0, -0.25, 4.0, 0.125]]))
    loss = F.cross_entropy(restricted, torch.tensor([0]))
    by_hand = math.log(math.exp(2.0) + math.exp(-0.25) + math.exp(4.0) + math.exp(0.125)) - 2.0
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    loss.backward()
    assert logits.grad is not None
    p = torch.softmax(restricted.detach(), dim=1)[0]
    # d loss / d z_c = alpha_c * (p_c - [c = y]): a missing class's logit moves alpha times as much
    expected = torch.tensor([p[0] - 1, 0.25 * p[1], p[2], 0.25 * p[3]])
    torch.testing.assert_close(logits.grad[0], expected)


def test_fedrs_client_restricts_by_its_own_labels() -> None:
    algo = make("fedrs", fed_info(num_classes=4), alpha=0.5)
    adjust = algo.logit_adjust(client_with_labels([0, 0, 2]))  # type: ignore[attr-defined]
    assert adjust is not None
    logits = torch.tensor([[1.0, 2.0, 3.0, -4.0]])
    assert torch.equal(adjust(logits, torch.tensor([0])), torch.tensor([[1.0, 1.0, 3.0, -2.0]]))
    one = make("fedrs", fed_info(num_classes=4), alpha=1.0)
    assert one.logit_adjust(client_with_labels([0, 0, 2])) is None  # type: ignore[attr-defined]


def test_fedrs_proportional_scaling_is_the_authors_soft_scale_by_hand() -> None:
    """scaling = "proportional": alpha + (1 - alpha) n_c / max n for every class (the authors' code)."""
    counts = torch.tensor([4, 0, 1, 2])
    logits = torch.tensor([[2.0, -1.0, 4.0, 0.5]])
    scaled = restricted_logits(logits, counts, 0.2, "proportional")
    # scales: 1, 0.2, 0.2 + 0.8 / 4 = 0.4, 0.2 + 0.8 * 2 / 4 = 0.6
    torch.testing.assert_close(scaled, torch.tensor([[2.0, -0.2, 1.6, 0.3]]))
    algo = make("fedrs", fed_info(num_classes=4), alpha=0.2, scaling="proportional")
    adjust = algo.logit_adjust(client_with_labels([0, 0, 0, 0, 2, 3, 3]))  # type: ignore[attr-defined]
    assert adjust is not None
    torch.testing.assert_close(adjust(logits, torch.tensor([0])), torch.tensor([[2.0, -0.2, 1.6, 0.3]]))


def test_fedrs_bad_scaling_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        typed_config(tiny_config(algorithm={"name": "fedrs", "scaling": "soft"}))
    assert "\n" not in str(err.value) and "algorithm.scaling" in str(err.value) and "proportional" in str(err.value)


def test_fedrs_with_alpha_one_is_fedavg_byte_for_byte(tmp_path: Path) -> None:
    avg = run(tiny_config(rounds=2), tmp_path / "avg")
    rs1 = run(tiny_config(rounds=2, algorithm={"name": "fedrs", "alpha": 1.0}), tmp_path / "rs1")
    rs = run(tiny_config(rounds=2, algorithm={"name": "fedrs", "alpha": 0.1}), tmp_path / "rs")
    assert rs1 == avg
    assert rs != avg


# ---- both -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key", "value", "allowed"), [
    ("fedlc", "tau", -0.5, ">= 0"),
    ("fedlc", "tau", float("inf"), "a finite number"),
    ("fedlc", "absent_count", -1.0, ">= 0"),
    ("fedrod", "absent_count", -1e-8, ">= 0"),
    ("fedetf", "absent_count", float("nan"), "a finite number"),
    ("fedrs", "alpha", -0.1, "in [0, 1]"),
    ("fedrs", "alpha", 1.5, "in [0, 1]"),
    ("fedrs", "alpha", float("nan"), "a finite number"),
])
def test_bad_parameters_are_refused_in_one_line(name: str, key: str, value: float, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        typed_config(tiny_config(algorithm={"name": name, key: value}))
    message = str(err.value)
    assert "\n" not in message
    assert f"algorithm.{key}" in message and allowed in message and repr(value) in message


@pytest.mark.parametrize("name", ["fedlc", "fedrs"])
def test_two_rounds_with_the_paper_defaults(name: str, tmp_path: Path) -> None:
    cfg = config_for(name, rounds=2)
    RoundLoop(typed_config(cfg), tmp_path, progress=False).run()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert '"loss": NaN' not in lines[-1]


def test_the_batched_trainer_says_why_it_runs_them_one_at_a_time() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(1, 4))
    client = client_with_labels([0, 1])
    for name, params in (("fedlc", {"tau": 1.0}), ("fedrs", {"alpha": 0.5})):
        adjust = make(name, fed_info(num_classes=4), **params).logit_adjust(client)  # type: ignore[attr-defined]
        assert "logit" in str(why_sequential(model, client.x, [], [], adjust))
    assert why_sequential(model, client.x, [], []) is None


def test_fedetf_counts_a_lacking_class_as_one_sample_by_default_as_its_authors_code() -> None:
    """FedETF's balanced loss clamps a lacking class's count to 1 (ZexiLee/ICCV-2023-FedETF, nodes.py line 157):
    its logit stays in the softmax unshifted (log 1 = 0) while a held class gets + log n_c; FedRoD keeps the
    formula's limit (-inf), which ``absent_count = 0`` gives FedETF too."""
    client = client_with_labels([0] * 16 + [1] + [3] * 81)
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0]])
    etf = make("fedetf", fed_info(num_classes=4))
    assert etf.params.absent_count == 1.0 and make("fedrod", fed_info(num_classes=4)).params.absent_count == 0.0
    got = etf.logit_adjust(client)(logits, torch.tensor([0]))  # type: ignore[attr-defined]
    torch.testing.assert_close(got, logits + torch.tensor([[math.log(16), 0.0, 0.0, math.log(81)]]))
    limit = make("fedetf", fed_info(num_classes=4), absent_count=0.0).logit_adjust(client)  # type: ignore[attr-defined]
    assert limit(logits, torch.tensor([0]))[0, 2] == float("-inf")
