"""FedAF (Wang et al., CVPR 2024): the CDC (SWD) and LGKM (symmetric KL) terms, model re-sampling,
client sets kept across rounds, the ledger of its uploads and downloads, ablation switches, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fedskew.algorithms.fedaf as fedaf_module
from fedskew.algorithms.base import ClientContext, FederationInfo, ModelSpec, ServerContext
from fedskew.algorithms.condensation.knowledge import (
    class_mean_logits,
    knowledge_matching_term,
    masked_lgkm,
    symmetric_kl,
)
from fedskew.algorithms.fedaf import FedAF
from fedskew.condense import (
    DMConfig,
    SyntheticSet,
    distribution_matching,
    init_synthetic,
    interpolated_model_sampler,
    sliced_wasserstein,
)
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params
from fedskew.core.seeding import seeded_init
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly
from tests.helpers.spies import record_amps

FAST: dict[str, Any] = {"condense_iterations": 3, "ipc": 2, "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}


def fedaf_config(rounds: int = 2, **algo: Any) -> dict[str, Any]:
    return tiny_config(
        rounds=rounds, checkpoint_every=0, algorithm={"name": "fedaf", "clients_per_round": 6, **FAST, **algo}
    )


def toy_fed(num_classes: int = 3) -> FederationInfo:
    return FederationInfo(
        num_clients=2, num_classes=num_classes, model=ModelSpec("mlp", 1, num_classes, 4, (("hidden", (16,)),)),
        seed=0, mean=(0.0,), std=(1.0,), image_shape=(1, 4, 4),
    )


def make(fed: FederationInfo, **params: Any) -> FedAF:
    return FedAF(build_params(FedAF.Params, params), fed)


# ---- LGKM: symmetric KL ------------------------------------------------------------------------------


def test_symmetric_kl_is_zero_for_equal_inputs_symmetric_and_the_mean_of_both_kls() -> None:
    g = torch.Generator().manual_seed(0)
    log_p = F.log_softmax(torch.randn(4, 5, generator=g), dim=1)
    log_q = F.log_softmax(torch.randn(4, 5, generator=g), dim=1)
    assert float(symmetric_kl(log_p, log_p)) == pytest.approx(0.0, abs=1e-7)
    assert float(symmetric_kl(log_p, log_q)) == pytest.approx(float(symmetric_kl(log_q, log_p)), rel=1e-6)
    kl_pq = F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)  # KL(P||Q)
    kl_qp = F.kl_div(log_p, log_q, reduction="batchmean", log_target=True)
    assert float(symmetric_kl(log_p, log_q)) == pytest.approx(float(kl_pq + kl_qp) / 2, rel=1e-5)
    assert float(symmetric_kl(log_p, log_q)) > 0
    assert float(symmetric_kl(log_p[:0], log_q[:0])) == 0.0


def test_knowledge_matching_term_vanishes_when_batch_soft_labels_equal_r() -> None:
    logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 1, 0])
    means, _ = class_mean_logits(logits.detach(), y, 3)
    r = F.softmax(means / 2.0, dim=1)
    known = torch.tensor([True, True, False])
    term = knowledge_matching_term(r, known, tau=2.0, weight=5.0)
    assert float(term(torch.nn.Identity(), torch.zeros(6), y, logits).detach()) == pytest.approx(0.0, abs=1e-6)
    other = knowledge_matching_term(torch.full((3, 3), 1 / 3), known, tau=2.0, weight=5.0)
    value = other(torch.nn.Identity(), torch.zeros(6), y, logits)
    value.backward()
    assert float(value.detach()) > 0 and logits.grad is not None and float(logits.grad.abs().sum()) > 0


SYNCING_OPS = ("nonzero", "bincount", "_local_scalar_dense", "masked_select", "index.Tensor", "unique")
"""aten operators whose output shape depends on the data (or that read a value to the host): each is a host sync
on a GPU."""


def recorded_ops(fn: Any) -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func.overloadpacket.__name__) + "." + func._overloadname)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


@pytest.mark.parametrize("reduction", ["batchmean", "mean"])
@pytest.mark.parametrize("labels", [[0, 0, 1, 3, 3, 3, 1], [2, 2, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1]])
def test_lgkm_without_host_syncs_equals_the_picked_rows(reduction: str, labels: list[int]) -> None:
    """The accelerators' form (every class's row, weighted) gives the CPU's (the rows picked by index): value and
    gradient, float64; class 1 has no r_c, so a batch of class 1 alone counts no row and gives 0."""
    g = torch.Generator().manual_seed(4)
    r = F.softmax(torch.randn(4, 4, dtype=torch.float64, generator=g), dim=1)
    known = torch.tensor([True, False, True, True])
    y = torch.tensor(labels)
    logits = torch.randn(7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    picked = knowledge_matching_term(r, known, tau=1.5, weight=1.0, reduction=reduction)(None, None, y, logits)
    # no row counted: the CPU form returns a constant 0, without a graph
    grad_picked = torch.autograd.grad(picked, logits)[0] if picked.requires_grad else torch.zeros_like(logits)
    log_r = r.clamp_min(torch.finfo(r.dtype).tiny).log()
    masked = masked_lgkm(log_r, known, logits, y, 1.5, reduction)
    (grad_masked,) = torch.autograd.grad(masked, logits)
    torch.testing.assert_close(masked, picked, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad_masked, grad_picked, rtol=1e-12, atol=1e-15)
    if labels[0] == 1:
        assert float(masked.detach()) == 0.0 and float(grad_masked.abs().sum()) == 0.0


def test_lgkm_on_an_accelerator_runs_no_operator_that_syncs() -> None:
    g = torch.Generator().manual_seed(5)
    r = F.softmax(torch.randn(5, 5, generator=g), dim=1)
    known = torch.tensor([True, True, False, True, True])
    y, logits = torch.randint(0, 5, (32,), generator=g), torch.randn(32, 5, generator=g, requires_grad=True)
    log_r = r.clamp_min(torch.finfo(r.dtype).tiny).log()
    masked = recorded_ops(lambda: masked_lgkm(log_r, known, logits, y, 1.0).backward())
    assert masked and not [op for op in masked if op.startswith(SYNCING_OPS)], masked
    # the detector sees the CPU form's syncing operators (picking rows by a mask, bincount)
    term = knowledge_matching_term(r, known, tau=1.0, weight=1.0)
    picked = recorded_ops(lambda: term(None, None, y, logits).backward())
    assert [op for op in picked if op.startswith(SYNCING_OPS)]
    with pytest.raises(ValueError, match="reduction must be one of"):
        masked_lgkm(log_r, known, logits, y, 1.0, "sum")


def test_global_knowledge_averages_over_the_clients_holding_each_class() -> None:
    fed = toy_fed()
    algo = make(fed)
    server = ServerContext(fed=fed, model=algo.init_model(), exchange=None)  # type: ignore[arg-type]
    assert algo.global_knowledge(server) is None
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    soft = F.softmax(logits, dim=1)
    server.state.update(knowledge_labels=torch.tensor([0, 1, 0]), knowledge_logits=logits, knowledge_soft=soft,
                        knowledge_owner=torch.tensor([0, 0, 1]))
    knowledge = algo.global_knowledge(server)
    assert knowledge is not None
    v, r, known = knowledge
    assert torch.allclose(v[0], torch.tensor([2.0, 0.0, 0.0])) and torch.allclose(v[1], logits[1])
    assert torch.allclose(r[0], (soft[0] + soft[2]) / 2)
    assert known.tolist() == [True, True, False]


# ---- CDC: the SWD term and model re-sampling -----------------------------------------------------------


def test_resampling_with_gamma_one_returns_the_global_model() -> None:
    fed = toy_fed()
    model = seeded_init(fed.model.build, 0, "global")
    same = interpolated_model_sampler(model, fed.model.build, 1.0)(0, torch.Generator().manual_seed(3))
    for k, v in model.state_dict().items():
        assert torch.equal(same.state_dict()[k], v)
    moved = interpolated_model_sampler(model, fed.model.build, 0.9)(0, torch.Generator().manual_seed(3))
    assert any(not torch.equal(moved.state_dict()[k], v) for k, v in model.state_dict().items())


def test_swd_term_moves_the_condensed_logits_toward_the_global_ones() -> None:
    fed = toy_fed()
    g = torch.Generator().manual_seed(0)
    model = seeded_init(fed.model.build, 0, "global")
    x, y = torch.randn(60, 1, 4, 4, generator=g), torch.arange(3).repeat(20)
    classes, v = torch.arange(3), 4.0 * torch.eye(3)
    start = init_synthetic(x, y, [0, 1, 2], 5, "real", torch.Generator().manual_seed(1))

    def distance(syn: SyntheticSet) -> float:
        with torch.no_grad():
            logits = model(syn.images)
            return sum(
                float(sliced_wasserstein(logits[syn.labels == c], v[c : c + 1], 256, torch.Generator().manual_seed(9)))
                for c in range(3)
            )

    def condense(lambda_loc: float) -> SyntheticSet:
        algo = make(fed, lambda_loc=lambda_loc, swd_projections=64)
        return distribution_matching(
            x, y, interpolated_model_sampler(model, fed.model.build, 1.0),
            DMConfig(iterations=40, ipc=5, image_lr=0.2, momentum=0.9), torch.Generator().manual_seed(2),
            init_set=start, extra_loss=algo.cdc_loss(classes, v, torch.Generator().manual_seed(5)),
        )

    before, plain, pulled = distance(start), distance(condense(0.0)), distance(condense(100.0))
    assert pulled < 0.6 * before and pulled < 0.6 * plain


# ---- runs --------------------------------------------------------------------------------------------


def test_sets_persist_on_clients_and_uploads_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real_dm = fedaf_module.distribution_matching

    def spy(*args: Any, **kwargs: Any) -> SyntheticSet:
        out = real_dm(*args, **kwargs)
        calls.append({"init": kwargs["init_set"], "out": out, "cdc": kwargs["extra_loss"] is not None})
        return out

    monkeypatch.setattr(fedaf_module, "distribution_matching", spy)
    sim = RoundLoop(typed_config(fedaf_config()), tmp_path / "r", progress=False)
    res = sim.run()
    n = sim.fed.info.num_clients
    assert len(calls) == 2 * n  # every client, both rounds, in client order
    for cid in range(n):
        first, second = calls[cid], calls[n + cid]
        assert first["init"] is None and not first["cdc"]  # round 1: "mean" init, no V yet
        assert second["cdc"]
        assert torch.equal(second["init"].images, first["out"].images)  # round 2 starts from round 1's S_k
        assert torch.equal(sim.client_states[cid]["syn_images"], second["out"].images)
    c, h, w = sim.fed.info.image_shape
    classes = sim.fed.info.num_classes
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    held = [int((sim.fed.client_data(cid)[1].bincount() > 0).sum()) for cid in range(n)]
    images = [len(calls[n * r + cid]["out"]) for r in range(2) for cid in range(n)]
    any_held = int((sim.fed.y.bincount(minlength=classes) > 0).sum())
    for r, rec in enumerate(res.records):
        up = sum(images[n * r : n * (r + 1)]) * (c * h * w + 8) + sum(held) * (8 + 2 * classes * 4)
        assert rec["bytes_client_to_server"] == up
        down = model_bytes if r == 0 else model_bytes + any_held * (8 + classes * 4)
        assert rec["bytes_server_to_client"] == n * down
        assert rec["synthetic_images"] == sum(images[n * r : n * (r + 1)])
    assert len(sim.algorithm.server_terms(sim.server)) == 1


def test_ablation_switches(tmp_path: Path) -> None:
    sim = RoundLoop(typed_config(fedaf_config(use_cdc=False, use_lgkm=False)), tmp_path / "r", progress=False)
    res = sim.run()
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    assert res.records[1]["bytes_server_to_client"] == sim.fed.info.num_clients * model_bytes  # no V sent
    assert sim.algorithm.server_terms(sim.server) == []
    assert "global.labels" not in sim.algorithm.download(sim.server)


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    full = assert_resumes_exactly(
        tmp_path, lambda rounds: fedaf_config(rounds=rounds, clients_per_round=3) | {"checkpoint_every": 1}
    )
    assert json.loads((full / "metrics.jsonl").read_text().splitlines()[-1])["synthetic_images"] > 0


def test_bf16_condenses_in_bf16_and_uploads_float32_knowledge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amps = record_amps(monkeypatch, fedaf_module, "distribution_matching")
    sim = RoundLoop(typed_config({**fedaf_config(rounds=2), "amp": "bf16"}), tmp_path / "bf16", progress=False)
    records = sim.run().records
    assert amps and set(amps) == {"bf16"}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records)
    for key in ("knowledge_logits", "knowledge_soft"):
        assert sim.server.state[key].dtype == torch.float32 and bool(torch.isfinite(sim.server.state[key]).all())
    assert sim.server.state["syn_images"].dtype == torch.uint8
    assert all(s["syn_images"].dtype == torch.float32 for s in sim.client_states.values() if "syn_images" in s)


# ---- the readings the paper leaves open (issue "Fidelity, second pass") ------------------------------


def test_the_mean_kl_reading_is_batchmean_divided_by_the_class_count() -> None:
    g = torch.Generator().manual_seed(0)
    log_p = F.log_softmax(torch.randn(4, 10, generator=g), dim=1)
    log_q = F.log_softmax(torch.randn(4, 10, generator=g), dim=1)
    batchmean, mean = symmetric_kl(log_p, log_q), symmetric_kl(log_p, log_q, "mean")
    assert batchmean > 0 and torch.allclose(mean * 10, batchmean)
    with pytest.raises(ValueError, match="reduction must be one of"):
        symmetric_kl(log_p, log_q, "sum")
    r = F.softmax(torch.randn(10, 10, generator=g), dim=1)
    logits, y = torch.randn(32, 10, generator=g), torch.arange(32) % 10
    known = torch.ones(10, dtype=torch.bool)
    terms = [knowledge_matching_term(r, known, 1.0, 2.0, red) for red in ("batchmean", "mean")]
    values = [float(t(torch.nn.Identity(), torch.zeros(0), y, logits)) for t in terms]
    assert values[0] == pytest.approx(10 * values[1], rel=1e-5)


def _final_sets(tmp_path: Path, name: str, **algo: Any) -> tuple[list[dict[str, Any]], dict[int, torch.Tensor]]:
    sim = RoundLoop(typed_config(fedaf_config(rounds=2, **algo)), tmp_path / name, progress=False)
    records = sim.run().records
    return records, {cid: s["syn_images"] for cid, s in sim.client_states.items() if "syn_images" in s}


def test_normalised_cdc_logs_its_gradient_fraction_and_moves_the_images(tmp_path: Path) -> None:
    printed, printed_sets = _final_sets(tmp_path, "printed", lambda_loc=1e-4)
    normalised, normalised_sets = _final_sets(tmp_path, "norm", lambda_loc=1e-4, cdc_scale="normalised",
                                              cdc_fraction=0.5)
    _, without = _final_sets(tmp_path, "off", lambda_loc=1e-4, use_cdc=False)
    assert "cdc_grad_fraction" not in printed[0]  # round 1: no V yet
    assert normalised[1]["cdc_grad_fraction"] == pytest.approx(0.5, rel=1e-6)  # by construction
    assert 0 < printed[1]["cdc_grad_fraction"] < 0.01  # the printed weight: numerically small
    moved = max(float((normalised_sets[c] - without[c]).abs().max()) for c in without)
    barely = max(float((printed_sets[c] - without[c]).abs().max()) for c in without)
    assert moved > 1e-2 and moved > 100 * barely, (moved, barely)


def test_this_rounds_knowledge_needs_a_first_exchange_and_turns_cdc_on_in_round_one(tmp_path: Path) -> None:
    records, _ = _final_sets(tmp_path, "this", knowledge_round="this")
    last, _ = _final_sets(tmp_path, "last")
    assert "cdc_grad_fraction" in records[0] and "cdc_grad_fraction" not in last[0]
    # The knowledge exchange adds a model download per selected client; V_k and R_k go up once a round
    # either way (in the knowledge reply rather than with the set), so the upload is the same.
    for this_round, last_round in zip(records, last, strict=True):
        assert this_round["bytes_server_to_client"] > last_round["bytes_server_to_client"]
        assert this_round["bytes_client_to_server"] == last_round["bytes_client_to_server"]


def test_knowledge_this_round_resumes_exactly(tmp_path: Path) -> None:
    assert_resumes_exactly(
        tmp_path, lambda rounds: fedaf_config(rounds=rounds, clients_per_round=3, knowledge_round="this")
        | {"checkpoint_every": 1},
    )


def test_init_noise_separates_a_small_class_whose_images_start_alike() -> None:
    fed = toy_fed(num_classes=2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 1, 4, 4, generator=g), torch.tensor([0] * 10 + [1] * 2)  # class 1: 2 images
    client = ClientContext(cid=0, round=1, x=x, y=y, fed=fed)
    for noise in (0.0, 0.05):
        algo = make(fed, init="mean", ipc=3, init_noise=noise)
        start = algo.start_set(client, client.generator("condense"))
        small = start.images[start.labels == 1].flatten(1)
        alike = bool((small == small[:1]).all())  # "mean" over all of a class with <= 16 images
        assert alike == (noise == 0.0)
        plain = make(fed, init="mean", ipc=3).start_set(client, client.generator("condense"))
        big = start.labels == 0  # class 0's averages differ already: no noise added there
        assert torch.equal(start.images[big], plain.images[big])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cdc_fraction": 0.0}, "cdc_fraction"),
        ({"init_noise": -1.0}, "init_noise"),
        ({"kl_reduction": "sum"}, "kl_reduction must be one of 'batchmean', 'mean'"),
        ({"knowledge_round": "next"}, "knowledge_round must be one of 'last', 'this'"),
    ],
)
def test_the_reading_options_refuse_bad_values_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(toy_fed(), **options)
