"""Private condensation (``privacy.mode = "condensation"``): the released class means of distribution matching
(fedskew.condense.private_dm), FedAF's private class logits, the clients' accountants and the refusals."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedskew.algorithms.condensation.knowledge import class_mean_logits
from fedskew.algorithms.condensation.private import (
    ACCOUNTANT,
    CLIENT_EPSILON,
    EPSILON,
    WITHHELD,
    private_class_sums,
    private_condensation,
)
from fedskew.condense import DMConfig, dm_loss
from fedskew.condense.private_dm import (
    class_sample_rates,
    noisy_class_means,
    poisson_rows,
    private_distribution_matching,
    private_dm_loss,
)
from fedskew.condense.samplers import random_model_sampler
from fedskew.config import dump, typed_config
from fedskew.config.schema import full_config
from fedskew.core.errors import ConfigError
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config

opacus = pytest.importorskip("opacus")  # the privacy extra: scripts/test.sh installs it

FAST: dict[str, Any] = {"condense_iterations": 3, "ipc": 2, "init": "noise", "real_batch": 4,
                        "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}
PRIVATE: dict[str, Any] = {"mode": "condensation", "noise_multiplier": 1.3, "clip": 2.0, "delta": 1e-5}


def private_config(name: str = "feddm", rounds: int = 2, privacy: dict[str, Any] | None = None,
                   **algo: Any) -> dict[str, Any]:
    return tiny_config(rounds=rounds, checkpoint_every=0, algorithm={"name": name, **FAST, **algo},
                       privacy={**PRIVATE, **(privacy or {})})


def test_the_released_class_mean_has_the_calibrated_noise() -> None:
    """Over 20,000 releases, the mean is the clipped class mean and each coordinate's std is
    noise_multiplier * clip / m (within 5 standard errors)."""
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(30, 6, generator=g, dtype=torch.float64) * 2  # norms ~5: most rows clipped
    counts, clip, z = [12, 18], 1.5, 0.8
    m = torch.tensor([10.0, 20.0], dtype=torch.float64)
    clipped = emb * torch.clamp(clip / emb.norm(dim=1, keepdim=True), max=1.0)
    expected = torch.stack([clipped[:12].sum(0) / 10, clipped[12:].sum(0) / 20])
    noise = torch.Generator().manual_seed(1)
    n = 20_000
    draws = torch.stack([noisy_class_means(emb, counts, clip, z, m, noise) for _ in range(n)])
    std = (z * clip / m)[:, None].expand(2, 6)
    assert torch.all((draws.mean(0) - expected).abs() < 5 * std / n**0.5)
    assert torch.all((draws.std(0) / std - 1).abs() < 5 / (2 * n) ** 0.5)
    assert torch.allclose(noisy_class_means(emb, counts, clip, 0.0, m, noise), expected, rtol=1e-12, atol=1e-14)


def test_one_example_changes_the_released_sum_by_at_most_clip() -> None:
    """A huge embedding added to class 0: the release (same noise) moves by exactly clip there, not at all in
    class 1; an ordinary one moves it by its own norm (within the bound)."""
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(9, 5, generator=g, dtype=torch.float64)
    clip, ones = 1.0, torch.ones(2, dtype=torch.float64)
    huge = torch.full((1, 5), 1e9, dtype=torch.float64)
    for z in (0.0, 2.0):
        base = noisy_class_means(emb, [4, 5], clip, z, ones, torch.Generator().manual_seed(3))
        added = noisy_class_means(torch.cat([emb[:4], huge, emb[4:]]), [5, 5], clip, z, ones,
                                  torch.Generator().manual_seed(3))
        assert float((added[0] - base[0]).norm()) == pytest.approx(clip)
        assert torch.equal(added[1], base[1])
    small = torch.full((1, 5), 0.1, dtype=torch.float64)
    base = noisy_class_means(emb, [4, 5], clip, 0.0, ones, torch.Generator())
    added = noisy_class_means(torch.cat([emb[:4], small, emb[4:]]), [5, 5], clip, 0.0, ones, torch.Generator())
    assert float((added[0] - base[0]).norm()) == pytest.approx(float(small.norm()))


def test_without_noise_and_with_a_clip_never_reached_the_private_loss_is_dms() -> None:
    """float64: the private loss (denominators = the batch sizes) and its gradient equal dm_loss's."""
    torch.manual_seed(0)
    features = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8)).double()
    real = [torch.randn(n, 3, 2, 2, dtype=torch.float64) for n in (5, 7, 3)]
    syn = torch.randn(6, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    syn_by_class = [syn[0:2], syn[2:4], syn[4:6]]
    counts = torch.tensor([5.0, 7.0, 3.0], dtype=torch.float64)
    private = private_dm_loss(features, real, syn_by_class, 1e12, 0.0, counts, torch.Generator())
    plain = dm_loss(features, real, syn_by_class, "separate")
    assert private.dtype == torch.float64 and torch.equal(private, plain)
    (gp,) = torch.autograd.grad(private, [syn])
    (gd,) = torch.autograd.grad(dm_loss(features, real, syn_by_class, "separate"), [syn])
    assert torch.equal(gp, gd)


def test_empty_batches_release_noise_alone() -> None:
    """A class, or every class, may draw no real image at a step: its target is noise over m_c."""
    features = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    syn = [torch.randn(2, 1, 2, 2), torch.randn(2, 1, 2, 2)]
    m = torch.tensor([2.0, 4.0], dtype=torch.float64)
    for real in ([torch.zeros(0, 1, 2, 2), torch.randn(3, 1, 2, 2)], [torch.zeros(0, 1, 2, 2)] * 2):
        loss = private_dm_loss(features, real, syn, 1.0, 1.0, m, torch.Generator().manual_seed(0))
        assert torch.isfinite(loss)
    target = noisy_class_means(torch.zeros(0, 3), [0, 0], 1.0, 2.0, m, torch.Generator().manual_seed(0))
    noise = torch.randn((2, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2.0
    assert torch.allclose(target, (noise / m[:, None]).float())


def test_poisson_sampling_and_rates() -> None:
    assert class_sample_rates([8, 2, 40], 4) == [0.5, 1.0, 0.1]
    idx = torch.arange(100_000)
    taken = poisson_rows(idx, 0.25, torch.Generator().manual_seed(0))
    assert abs(taken.numel() / 100_000 - 0.25) < 0.01 and torch.equal(taken, taken.sort().values)
    assert poisson_rows(idx[:5], 1.0, torch.Generator()).equal(idx[:5])


def test_private_matching_refuses_real_starts_and_batch_coupled_networks() -> None:
    x, y = torch.randn(20, 1, 4, 4), torch.arange(20) % 2
    cfg = DMConfig(iterations=1, ipc=1, init="mean")
    sampler = random_model_sampler(lambda: nn.Sequential())
    with pytest.raises(ConfigError, match='init = "noise"'):
        private_distribution_matching(x, y, sampler, cfg, torch.Generator(), 1.0, 1.0, torch.Generator())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten())

    with pytest.raises(ConfigError, match="BatchNorm"):
        private_distribution_matching(x, y, random_model_sampler(Net), DMConfig(iterations=1, ipc=1, init="noise"),
                                      torch.Generator(), 1.0, 1.0, torch.Generator())


def test_private_class_logits_without_noise_are_the_clipped_class_means() -> None:
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(20, 4, generator=g), torch.tensor([0, 2] * 10)
    classes, v = private_class_sums(logits, y, 4, 1e9, 0.0, torch.Generator())
    means, _ = class_mean_logits(logits, y, 4)
    assert classes.tolist() == [0, 2] and torch.allclose(v, means[classes], atol=1e-6)
    _, clipped = private_class_sums(logits * 100, y, 4, 0.5, 0.0, torch.Generator())
    assert bool((clipped.norm(dim=1) <= 0.5 + 1e-6).all())


def opacus_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    accountant = opacus.accountants.RDPAccountant()
    accountant.history = list(history)
    return float(accountant.get_epsilon(delta=delta))


@pytest.mark.parametrize(("name", "algo", "logits"), [
    ("feddm", {}, False),
    ("feddm", {"private_sample_rate": 0.3}, False),
    ("fedaf", {}, True),
    ("fedaf", {"knowledge_round": "this"}, True),  # V_k in an exchange of its own, before the matching
    ("fedaf", {"use_cdc": False, "use_lgkm": False}, False),  # V_k unused: not released
])
def test_each_clients_epsilon_is_opacuss_for_its_releases(
    name: str, algo: dict[str, Any], logits: bool, tmp_path: Path
) -> None:
    """Every client's recorded epsilon equals Opacus's RDP epsilon for (z, q, steps): q its largest class
    rate (real_batch / n_c, or the one given rate), condense_iterations steps a round it took part in (FedAF:
    after one release of its class logits at rate 1, where they are used); ``epsilon`` is the largest."""
    sim = RoundLoop(typed_config(private_config(name, rounds=2, **algo)), tmp_path / "r", progress=False)
    res = sim.run()
    z, delta, steps = PRIVATE["noise_multiplier"], PRIVATE["delta"], FAST["condense_iterations"]
    rounds_of = {cid: sum(cid in rec["clients"] for rec in res.records) for cid in range(6)}
    last = res.records[-1]
    for cid, taken in rounds_of.items():
        counts = torch.bincount(sim.fed.client_data(cid)[1])
        q = algo.get("private_sample_rate") or max(min(1.0, 4 / int(n)) for n in counts[counts > 0])
        history = ([(z, 1.0, 1), (z, q, steps)] if logits else [(z, q, steps)]) * taken
        expected = opacus_epsilon(history, delta) if taken else 0.0
        assert last[CLIENT_EPSILON][cid] == pytest.approx(expected, rel=1e-9)
        if taken:  # the accountant kept in the client's state holds every release (equal entries merged)
            kept = sim.client_states[cid][ACCOUNTANT]["history"]
            assert sum(n for _, _, n in kept) == sum(n for _, _, n in history)
    assert last[EPSILON] == last["epsilon_max"] == max(last[CLIENT_EPSILON]) and last[EPSILON] > 0
    assert last["epsilon_mean"] == pytest.approx(sum(last[CLIENT_EPSILON]) / 6)
    # summary.json says the run's epsilon and the mechanism, as the other modes' summaries do
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["epsilon"] == last[EPSILON] == res.summary["epsilon"]
    table = summary["privacy"]
    assert (table["mode"], table["noise_multiplier"], table["clip"], table["delta"]) == (
        "condensation", z, PRIVATE["clip"], delta)
    assert table[CLIENT_EPSILON] == last[CLIENT_EPSILON] and table["epsilon_mean"] == last["epsilon_mean"]
    # A train reply must say its epsilon: one from a client running without the table is rejected.
    assert EPSILON in sim.algorithm.reply_scalars("train", sim.server)
    if name == "fedaf" and not logits:
        assert sim.server.state["knowledge_owner"].numel() == 0  # no rows of V_k travelled


@pytest.mark.parametrize(("name", "algo", "steps"), [
    ("feddm", {}, 3), ("fedaf", {}, 4), ("fedaf", {"knowledge_round": "this"}, 4),
])
def test_a_client_at_its_budget_uploads_nothing_and_keeps_its_last_set(
    name: str, algo: dict[str, Any], steps: int, tmp_path: Path
) -> None:
    """target_epsilon between one round's and two rounds' epsilon: a client's second round is withheld, its
    first set (and FedAF's logits) stays with the server, and no client's epsilon passes the budget."""
    budget = 1.2 * opacus_epsilon([(PRIVATE["noise_multiplier"], 1.0, steps)], PRIVATE["delta"])
    cfg = private_config(name, rounds=4, privacy={"target_epsilon": budget}, real_batch=256, clients_per_round=5,
                         **algo)
    sim = RoundLoop(typed_config(cfg), tmp_path / "r", progress=False)
    res = sim.run()
    assert sum(rec[WITHHELD] for rec in res.records) > 0
    assert all(rec["rejected"] == [] and rec["failed"] == [] for rec in res.records)
    assert all(e <= budget for rec in res.records for e in rec[CLIENT_EPSILON])
    took_part = {cid for rec in res.records for cid in rec["clients"]}
    assert set(sim.server.state["syn_owner"].tolist()) == took_part
    if name == "fedaf":
        assert set(sim.server.state["knowledge_owner"].tolist()) == took_part


def test_the_table_rides_on_the_params_and_leaves_the_record_as_it_was() -> None:
    private = typed_config(private_config("feddm"))
    assert private_condensation(private.algorithm.params) == private.privacy
    plain_cfg = private_config("feddm")
    plain_cfg.pop("privacy")
    plain = typed_config(plain_cfg)
    assert private_condensation(plain.algorithm.params) is None
    assert full_config(private)["algorithm"] == full_config(plain)["algorithm"]
    assert private.algorithm.params == plain.algorithm.params


@pytest.mark.parametrize(("override", "words"), [
    ({"algorithm": {"name": "fedavg", "clients_per_round": 3}}, "feddm and fedaf"),
    ({"algorithm": {"name": "hfldd"}}, "does not cover hfldd"),
    ({"algorithm": {"name": "feddm", **FAST, "init": "mean"}}, 'init = "noise"'),
    ({"algorithm": {"name": "fedaf", **FAST, "cdc_scale": "normalised"}}, 'cdc_scale = "printed"'),
    ({"privacy": {**PRIVATE, "noise_multiplier": 0.0}}, "noise_multiplier > 0"),
    ({"privacy": {**PRIVATE, "target_epsilon": 5.0, "on_target": "calibrate"}}, 'on_target = "stop"'),
])
def test_bad_combinations_are_refused_in_one_line(override: dict[str, Any], words: str) -> None:
    cfg = {**private_config("feddm"), **override}
    with pytest.raises(ConfigError) as err:
        typed_config(cfg)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_model_that_couples_its_batch_is_refused_before_the_first_round(tmp_path: Path) -> None:
    cfg = private_config("feddm")
    cfg["model"] = {"name": "convnet", "net_width": 8, "net_depth": 2, "net_norm": "batchnorm"}
    with pytest.raises(ConfigError, match="BatchNorm") as err:
        RoundLoop(typed_config(cfg), tmp_path / "r", progress=False).run()
    assert "\n" not in str(err.value)


def test_a_resumed_private_run_continues_each_clients_accountant(tmp_path: Path) -> None:
    """Two rounds, then a resume to three: the records (epsilons included) are those of three rounds at once."""
    from fedskew.engine.experiment import resume_run

    def run(rounds: int, path: Path) -> list[dict[str, Any]]:
        cfg = private_config("fedaf", rounds=rounds)
        cfg["checkpoint_every"] = 1
        path.mkdir(parents=True)
        (path / "config.toml").write_text(dump(cfg))
        RoundLoop(typed_config(cfg), path, progress=False).run()
        return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]

    full = run(3, tmp_path / "full")
    run(2, tmp_path / "part")
    res = resume_run(tmp_path / "part", {"rounds": 3}, data_dir=None, progress=False)
    assert res.records == full and full[-1][EPSILON] > full[0][EPSILON]


@pytest.mark.parametrize(("method", "table", "message"), [
    ("feddm", {"private_sample_rate": 0}, "algorithm.private_sample_rate must be > 0, got 0"),
    ("fedaf", {"private_sample_rate": 1.5}, "algorithm.private_sample_rate must be <= 1, got 1.5"),
    ("fedaf", {"knowledge_clip": 0}, "algorithm.knowledge_clip must be > 0, got 0"),
])
def test_bad_private_condensation_keys_are_one_line(method: str, table: dict, message: str) -> None:
    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.core.params import build_params

    with pytest.raises(ConfigError) as err:
        build_params(ALGORITHMS.get(method).Params, table, prefix="algorithm.")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("method", "key"), [("feddm", "private_sample_rate"), ("fedaf", "knowledge_clip")])
def test_private_condensation_keys_without_the_mode_are_refused(method: str, key: str) -> None:
    from fedskew.config import DEFAULTS
    from fedskew.config.schema import typed_config

    cfg = copy.deepcopy(DEFAULTS)
    cfg["algorithm"] = {"name": method, key: 0.5}
    with pytest.raises(ConfigError) as err:
        typed_config(cfg)
    assert f'algorithm.{key} = 0.5 applies only with privacy.mode = "condensation", got privacy.mode = "off"' \
        in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["feddm", "fedaf"])
def test_secret_noise_changes_the_release_not_the_accounting(name: str, tmp_path: Path) -> None:
    """privacy.noise_seed = "secret" in condensation mode: the class means (and FedAF's logits) get noise nobody can
    regenerate, so two runs condense different sets, with the same epsilons."""
    out = []
    for k in range(2):
        sim = RoundLoop(typed_config(private_config(name, rounds=1, privacy={"noise_seed": "secret"})),
                        tmp_path / f"r{k}", progress=False)
        out.append(sim.run().records[-1])
    assert out[0][CLIENT_EPSILON] == out[1][CLIENT_EPSILON] and max(out[0][CLIENT_EPSILON]) > 0
    assert out[0]["loss"] != out[1]["loss"] or out[0]["accuracy"] != out[1]["accuracy"]
