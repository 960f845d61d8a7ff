"""The Gaussian mechanism's parts (fedskew.privacy.mechanisms), the accountant layer over Opacus and the
[privacy] table's checks."""

from __future__ import annotations

import math

import pytest
import torch

from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params
from fedskew.privacy import mechanisms as m
from fedskew.privacy.accounting import Accountant, noise_for_epsilon
from fedskew.privacy.params import PrivacyParams

pytest.importorskip("opacus")  # the privacy extra: scripts/test.sh installs it


def test_clip_by_global_norm_bounds_the_joint_norm_and_keeps_direction() -> None:
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0]])  # joint norm 5
    (ca, cb), norm = m.clip_by_global_norm([a, b], 1.0)
    assert norm == pytest.approx(5.0)
    assert float(m.global_norm([ca, cb])) == pytest.approx(1.0)
    assert torch.allclose(ca, a / 5) and torch.allclose(cb, b / 5)
    (ua, ub), _ = m.clip_by_global_norm([a, b], 10.0)  # within the bound: unchanged
    assert torch.equal(ua, a) and torch.equal(ub, b)


def test_clip_rows_clips_each_example_alone() -> None:
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = m.clip_rows(rows, 1.0)
    assert torch.allclose(out.norm(dim=1), torch.tensor([1.0, 0.5, 0.0]))
    assert torch.allclose(out[0], rows[0] / 5) and torch.equal(out[1], rows[1])


def test_noise_has_the_calibrated_scale() -> None:
    """Sample std of 200,000 draws within 5 standard errors (std / sqrt(2n)) of noise_multiplier * clip."""
    std, n = 0.7 * 2.5, 200_000
    g = torch.Generator().manual_seed(0)
    noised = m.add_gaussian_noise([torch.zeros(n)], std, g)[0].double()
    assert abs(float(noised.mean())) < 5 * std / math.sqrt(n)
    assert abs(float(noised.std()) - std) < 5 * std / math.sqrt(2 * n)


def test_noise_is_reproducible_from_the_generator() -> None:
    draw = lambda: m.add_gaussian_noise([torch.zeros(5)], 1.0, torch.Generator().manual_seed(3))[0]  # noqa: E731
    assert torch.equal(draw(), draw())


def test_adaptive_clip_moves_towards_the_target_quantile() -> None:
    assert m.next_clip(1.0, below=1.0, target_quantile=0.5, lr=0.2) == pytest.approx(math.exp(-0.1))  # all fit: shrink
    assert m.next_clip(1.0, below=0.0, target_quantile=0.5, lr=0.2) == pytest.approx(math.exp(0.1))  # none fit: grow
    g = torch.Generator().manual_seed(0)
    assert m.noisy_fraction_below([0.5, 2.0, 0.9, 3.0], 1.0, 0.0, g) == 0.5


def test_adaptive_noise_multiplier_keeps_the_total_budget() -> None:
    """Andrew et al. (2021), Thm 1: z_delta^-2 + (2 sigma_b)^-2 = z^-2."""
    z, sb = 1.0, 1.5
    zd = m.adaptive_noise_multiplier(z, sb)
    assert zd ** -2 + (2 * sb) ** -2 == pytest.approx(z ** -2)
    with pytest.raises(ValueError, match="too small"):
        m.adaptive_noise_multiplier(1.0, 0.4)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_epsilon_matches_opacus_own_computation(kind: str) -> None:
    """The same mechanism and steps give Opacus's epsilon: the layer adds no accounting of its own."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    ours = Accountant(kind)
    theirs = {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()
    for z, q, n in ((1.1, 0.01, 30), (0.9, 0.02, 20)):
        ours.step(z, q, n)
        for _ in range(n):
            theirs.step(noise_multiplier=z, sample_rate=q)
    assert ours.steps == 50
    assert ours.epsilon(1e-5) == pytest.approx(theirs.get_epsilon(delta=1e-5), rel=1e-9)


def test_epsilon_matches_the_rdp_formula_directly() -> None:
    from opacus.accountants.analysis import rdp as analysis

    acc = Accountant("rdp")
    acc.step(1.3, 0.05, 100)
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    rdp = analysis.compute_rdp(q=0.05, noise_multiplier=1.3, steps=100, orders=orders)
    eps, _ = analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert acc.epsilon(1e-5) == pytest.approx(float(eps), rel=1e-9)


def test_accountant_state_round_trips_exactly() -> None:
    acc = Accountant("rdp")
    acc.step(1.0, 1.0, 3)
    acc.step(1.0, 1.0, 2)  # merged
    acc.step(2.0, 0.5)
    again = Accountant.from_state(acc.state())
    assert again.history == [(1.0, 1.0, 5), (2.0, 0.5, 1)]
    assert again.epsilon(1e-5) == acc.epsilon(1e-5)
    assert Accountant("rdp").epsilon(1e-5) == 0.0


def test_noise_for_epsilon_spends_about_the_budget() -> None:
    z = noise_for_epsilon(4.0, 1e-5, 0.1, 200)
    acc = Accountant("rdp")
    acc.step(z, 0.1, 200)
    assert 3.9 <= acc.epsilon(1e-5) <= 4.0


@pytest.mark.parametrize(("table", "message"), [
    ({"mode": "dp"}, "privacy.mode must be one of 'off', 'central', 'local', 'sample', 'condensation', got 'dp'"),
    ({"clip": 0}, "privacy.clip must be > 0, got 0"),
    ({"noise_multiplier": -1}, "privacy.noise_multiplier must be >= 0, got -1"),
    ({"delta": 1.0}, "privacy.delta must be in [0, 1), got 1"),
    ({"delta": 0.0}, "privacy.delta must be > 0, got 0"),
    ({"target_quantile": 1.5}, "privacy.target_quantile must be in [0, 1], got 1.5"),
    ({"mode": "local", "adaptive_clip": True}, 'privacy.adaptive_clip must be false unless privacy.mode = "central"'),
    ({"on_target": "calibrate"}, 'privacy.on_target must be "stop" unless privacy.target_epsilon is set'),
    ({"accountant": "gdp"}, "privacy.accountant must be one of 'rdp', 'prv', got 'gdp'"),
    ({"mode": "local", "noise_seed": "os"}, "privacy.noise_seed must be one of 'run', 'secret', got 'os'"),
    ({"noise_seed": "secret"}, 'privacy.noise_seed must be unset while privacy.mode = "off"'),
])
def test_bad_privacy_values_are_one_line(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_params(PrivacyParams, table, prefix="privacy.")
    assert message in str(err.value) and "\n" not in str(err.value)
