"""Client-level DP's arithmetic (fedskew.privacy.uploads, .central, .client), each method's declared upload and the
[privacy] refusals: what the server aggregates is the DP-FedAvg estimator, and what a client sends in local mode is
its clipped update plus calibrated noise."""

from __future__ import annotations

import math

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message
from fedskew.core.seeding import torch_generator
from fedskew.privacy.central import noised_mean
from fedskew.privacy.client import ClientPrivacy, local_update, request_config
from fedskew.privacy.mechanisms import noisy_fraction_below
from fedskew.privacy.uploads import WEIGHTS, Upload, Withheld, references
from tests.helpers.configs import runnable_config, tiny_config

pytest.importorskip("opacus")  # the privacy extra: scripts/test.sh installs it

REQUEST = {"w": torch.zeros(3), "b": torch.ones(1), "n": torch.tensor(7)}


def _reply(w: list[float], b: float, n: int = 9) -> Message:
    return Message(arrays={"w": torch.tensor(w), "b": torch.tensor([b]), "n": torch.tensor(n)},
                   metrics={"num_samples": 10.0})


def test_the_central_estimator_is_the_fixed_denominator_mean_of_clipped_updates_plus_noise() -> None:
    """Two of m = 4 sampled clients answer: Delta~ = (sum_k clip(Delta_k) + N(0, (z C)^2)) / 4, every reply
    becomes request + Delta~ (so any mean of them is Delta~), and the counter is not released."""
    replies = [(0, _reply([3.0, 0.0, 0.0], 1.0 + 4.0)), (5, _reply([0.1, 0.0, 0.0], 1.0))]  # norms 5 and 0.1
    reordered = Message(dict(reversed(replies[1][1].arrays.items())), metrics=replies[1][1].metrics)
    replies[1] = (5, reordered)  # a transport may give a reply's arrays in another order
    requests = {0: Message(REQUEST), 5: Message(REQUEST)}
    clip, std, m = 1.0, 0.7, 4
    out, norms = noised_mean(WEIGHTS, requests, replies, clip, std, m, torch_generator(0, "privacy", 3, "server"))
    assert norms == pytest.approx([5.0, 0.1])
    clipped_sum = torch.tensor([4 / 5, 3 / 5 + 0.1, 0.0, 0.0], dtype=torch.float64)  # b then w: sorted by name
    noise = torch.randn(4, generator=torch_generator(0, "privacy", 3, "server"), dtype=torch.float64) * std
    expected = (clipped_sum + noise) / m
    for _, msg in out:
        assert torch.equal(msg.arrays["w"], expected[1:].float())
        assert torch.equal(msg.arrays["b"], (1.0 + expected[:1]).float())
        assert torch.equal(msg.arrays["n"], REQUEST["n"]) and msg.metrics == {"num_samples": 10.0}
    assert noised_mean(WEIGHTS, requests, [], clip, std, m, torch.Generator()) == ([], [])


def test_updates_declared_as_updates_are_measured_from_zero() -> None:
    """SCAFFOLD's upload: dy and dc are updates already; they are clipped together, as one vector."""
    upload = Upload(measured_from=(("dy.", None), ("dc.", None)))
    request = Message({"x.w": torch.full((2,), 5.0), "c.w": torch.full((2,), -5.0)})
    reply = Message({"dy.w": torch.tensor([3.0, 0.0]), "dc.w": torch.tensor([0.0, 4.0])})
    out, norms = noised_mean(upload, {1: request}, [(1, reply)], 1.0, 0.0, 1, torch.Generator())
    assert norms == [5.0]
    assert torch.allclose(out[0][1].arrays["dy.w"], torch.tensor([0.6, 0.0]))
    assert torch.allclose(out[0][1].arrays["dc.w"], torch.tensor([0.0, 0.8]))
    with pytest.raises(FedskewError, match="not part of the method's declared upload"):
        references(upload, request.arrays, {"other": torch.zeros(1)})
    with pytest.raises(FedskewError, match=r"no request array 'w\.v'"):
        references(Upload(measured_from=(("theta.", "w."),)), {}, {"theta.v": torch.zeros(1)})


def test_local_dp_sends_the_clipped_update_plus_noise_from_the_clients_stream() -> None:
    reply = _reply([3.0, 0.0, 0.0], 1.0 + 4.0)
    noisy = local_update(WEIGHTS, REQUEST, reply.arrays, 1.0, 0.5, torch_generator(0, "privacy", 2, 4))
    noise = torch.randn(4, generator=torch_generator(0, "privacy", 2, 4), dtype=torch.float64) * 0.5
    assert torch.equal(noisy["w"], (torch.tensor([0.6, 0.0, 0.0], dtype=torch.float64) + noise[1:]).float())
    assert torch.equal(noisy["b"], (1.0 + 0.8 + noise[:1]).float())
    assert torch.equal(noisy["n"], REQUEST["n"])
    # What a client reads from its request: the mechanism, and a noise stream of its own for the round.
    privacy = ClientPrivacy.of(request_config("local", 1.0, 0.5), 0, 2, 4)
    assert privacy is not None and (privacy.mode, privacy.clip, privacy.noise_multiplier) == ("local", 1.0, 0.5)
    assert ClientPrivacy.of({}, 0, 2, 4) is None
    out = privacy.finish(WEIGHTS, Message(REQUEST), reply)
    assert all(torch.equal(out.arrays[k], noisy[k]) for k in noisy) and out.metrics == reply.metrics


def test_the_noisy_count_has_a_fixed_denominator() -> None:
    g = torch.Generator()
    assert noisy_fraction_below([0.5, 2.0, 0.9], 1.0, 0.0, g, total=4) == 0.5
    assert noisy_fraction_below([], 1.0, 0.0, g, total=4) == 0.0


# ---- which methods fit, declared on their classes ---------------------------------------------------------------
SHARING = sorted(n for n in ALGORITHMS.names() if isinstance(ALGORITHMS.get(n).upload, Upload))


def test_every_method_declares_its_upload() -> None:
    """The methods that share model weights fit client-level DP; the others say what they upload instead."""
    assert set(SHARING) == {
        "apfl", "ditto", "fedadam", "fedala", "fedavg", "fedavgm", "fedbabu", "fedbn", "feddc_drift", "feddecorr",
        "feddyn", "fedetf", "fedlc", "fednova", "fedntd", "fedper", "fedprox", "fedrep", "fedrod", "fedrs", "moon",
        "perfedavg", "pfedme", "scaffold",
    }
    withheld = {n: ALGORITHMS.get(n).upload for n in ALGORITHMS.names() if n not in SHARING}
    assert all(isinstance(u, Withheld) and u.what for u in withheld.values())
    assert {n for n, u in withheld.items() if "condensation" in u.use} == {"feddc", "feddc_plus", "feddm", "fedaf",
                                                                           "hfldd"}


@pytest.mark.parametrize(("name", "table", "message"), [
    ("fedaf", {"mode": "central"}, "privacy.mode = \"central\" needs a method whose clients upload model weights; "
     "'fedaf' uploads condensed images: use privacy.mode = \"condensation\""),
    ("feddm", {"mode": "local"}, "'feddm' uploads condensed images: use privacy.mode = \"condensation\""),
    ("cim", {"mode": "central"}, "'cim' uploads its class counts"),
    ("ccvr", {"mode": "local"}, "'ccvr' uploads class-wise feature statistics"),
    ("centralized", {"mode": "central"}, "'centralized' uploads its raw training data"),
    ("local", {"mode": "local"}, "'local' uploads nothing (its clients train alone): use privacy.mode = \"off\""),
    ("fednova", {"mode": "central"}, "privacy.mode = \"central\" cannot privatise 'fednova': its aggregate scales "
     "each client's update by that client's own step count"),
    ("apfl", {"mode": "sample"}, "privacy.mode = \"sample\" cannot privatise 'apfl': its clients train with a loop "
     "of their own"),
    ("fedlc", {"mode": "sample"}, "'fedlc': its loss uses the client's class counts"),
    ("fedavg", {"mode": "central", "noise_multiplier": 0}, "privacy.noise_multiplier must be > 0 for privacy.mode = "
     "\"central\" (0 adds no noise and gives no guarantee), got 0"),
    ("fedavg", {"mode": "central", "adaptive_clip": True}, "adaptive clipping's count noise 0.15 (clients per round "
     "/ 20 = 3/20) is too small for privacy.noise_multiplier 1: it needs 2 * count_noise > noise_multiplier; set "
     "privacy.count_noise > 0.5"),
    ("fedavg", {"mode": "off", "target_epsilon": 4.0}, "privacy.target_epsilon must be unset while privacy.mode = "
     "\"off\""),
    ("fedavg", {"mode": "condensation"}, "privacy.mode = \"condensation\" privatises the condensed uploads of "
     "feddm and fedaf; fedavg has none"),
])
def test_a_private_run_a_method_cannot_carry_is_refused_in_one_line(name: str, table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        typed_config(runnable_config(name, privacy=table))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_central_dp_replaces_a_robust_aggregation_and_calibration_needs_known_steps() -> None:
    with pytest.raises(ConfigError, match=r'privacy.mode = "central" replaces \[algorithm.aggregation\] \(the '
                       r"noised mean of the clipped updates is the aggregate\): remove algorithm.aggregation.rule$"):
        typed_config(tiny_config(privacy={"mode": "central"}, algorithm={"aggregation": {"rule": "median"}}))
    # the outlier bound has nothing to judge among the equal replies: free to set (secure aggregation sets it to 0)
    typed_config(tiny_config(privacy={"mode": "central"}, algorithm={"aggregation": {"max_norm_ratio": 0}}))
    typed_config(tiny_config(privacy={"mode": "local"}, algorithm={"aggregation": {"rule": "median"}}))  # fine
    typed_config(tiny_config(privacy={"mode": "central", "on_target": "calibrate", "target_epsilon": 2.0,
                                      "noise_multiplier": 0}))  # derived: the given value does not count


def test_sample_mode_without_dpsgd_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "fedskew.privacy.dpsgd", None)
    with pytest.raises(ConfigError, match=r'^privacy.mode = "sample" needs DP-SGD \(fedskew.privacy.dpsgd\)'):
        typed_config(tiny_config(privacy={"mode": "sample"}))


def test_epsilon_of_a_central_round_is_the_sampled_gaussian_at_m_over_n() -> None:
    """q = clients per round / clients (3 / 6 in the tiny federation), one release a round."""
    from fedskew.privacy.accounting import Accountant
    from fedskew.privacy.run import RunPrivacy

    cfg = typed_config(tiny_config(privacy={"mode": "central", "noise_multiplier": 1.3}))
    algo = ALGORITHMS.get("fedavg")(cfg.algorithm.params, None)  # type: ignore[arg-type]
    privacy = RunPrivacy.of(cfg, algo, 6)
    assert privacy is not None and privacy.q == 0.5 and privacy.m == 3
    privacy.received("train", 1, [0, 1, 2], {}, [])
    acc = Accountant("rdp")
    acc.step(1.3, 0.5)
    assert privacy.record() == {"epsilon": acc.epsilon(1e-5)}
    acc.step(1.3, 0.5)
    assert privacy.next_epsilon() == pytest.approx(acc.epsilon(1e-5), rel=1e-12) and math.isfinite(acc.epsilon(1e-5))
    with pytest.raises(FedskewError, match="exchanged its upload task 'train' twice"):
        privacy.received("train", 1, [0, 1, 2], {}, [])
