"""FedNTD's not-true distillation and FedDecorr's decorrelation penalty, checked by hand, plus their
FedAvg limits (beta = 0) and their refused parameters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.feddecorr import authors_decorrelation_loss, decorrelation_loss, decorrelation_term
from fedskew.algorithms.fedntd import not_true_distillation, not_true_logits, ntd_term
from fedskew.components.batching import why_sequential
from fedskew.components.terms import FeatureTap
from fedskew.config import typed_config
from fedskew.core.errors import ConfigError
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.tiny_net import TinyNet

# ---- FedNTD ---------------------------------------------------------------------------------------


def test_not_true_logits_drop_the_true_class_and_keep_the_order() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert torch.equal(not_true_logits(logits, torch.tensor([0, 2])), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))


def test_ntd_by_hand_on_three_classes() -> None:
    # True class 0. Not-true logits: local (2, 3), global (1, 1): q~_g = (1/2, 1/2), q~_l = softmax(2, 3)/tau.
    # KL(q~_g || q~_l) = ln((e^{a} + e^{b}) / (2 e^{(a+b)/2})) = ln cosh((b - a)/2) for q~_l = softmax(a, b).
    local = torch.tensor([[1.0, 2.0, 3.0]])
    global_ = torch.tensor([[5.0, 1.0, 1.0]])
    y = torch.tensor([0])
    assert not_true_distillation(local, global_, y, 1.0).item() == pytest.approx(math.log(math.cosh(0.5)), rel=1e-6)
    # tau = 2 halves the logits' gap and scales by tau^2 (the authors' criterion.py line 42).
    assert not_true_distillation(local, global_, y, 2.0).item() == pytest.approx(
        4 * math.log(math.cosh(0.25)), rel=1e-6)


def test_ntd_ignores_the_true_class_of_either_model() -> None:
    gen = torch.Generator().manual_seed(0)
    local, global_ = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    y = torch.randint(0, 5, (8,), generator=gen)
    rows = torch.arange(8)
    base = not_true_distillation(local, global_, y, 1.5)
    assert base.item() > 0
    for which in ("local", "global"):
        moved_local, moved_global = local.clone(), global_.clone()
        target = moved_local if which == "local" else moved_global
        target[rows, y] += torch.randn(8, generator=gen) * 10
        assert torch.allclose(not_true_distillation(moved_local, moved_global, y, 1.5), base, atol=1e-6)
    # ... while a not-true logit does matter.
    moved = local.clone()
    moved[rows, (y + 1) % 5] += 3.0
    assert not torch.allclose(not_true_distillation(moved, global_, y, 1.5), base)


def test_ntd_is_zero_when_the_models_agree_on_the_not_true_classes() -> None:
    gen = torch.Generator().manual_seed(1)
    global_ = torch.randn(6, 4, generator=gen)
    y = torch.randint(0, 4, (6,), generator=gen)
    # Different true-class logits and a per-row shift (softmax is shift-invariant): same not-true softmax.
    local = global_ + torch.randn(6, 1, generator=gen)
    local[torch.arange(6), y] = 7.0
    local.requires_grad_(True)
    loss = not_true_distillation(local, global_, y, 1.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    assert local.grad is not None and local.grad.abs().max().item() < 1e-6


# ---- FedDecorr ------------------------------------------------------------------------------------


def test_decorrelation_is_minimal_for_uncorrelated_dimensions() -> None:
    # Two orthogonal +-1 columns: K = I, (1/d^2) ||K||_F^2 = 2/4 = 1/d, the minimum.
    z = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    assert decorrelation_loss(z).item() == pytest.approx(0.5, rel=1e-6)


def test_decorrelation_by_hand_on_a_correlated_batch() -> None:
    # Columns (1, -1, 1, -1) and (2, 0, 0, -2): z-scores (1, -1, 1, -1) and (r, 0, 0, -r), r = sqrt 2;
    # K_12 = 2r/4 = 1/sqrt 2, so ||K||_F^2 = 1 + 1 + 2 * 1/2 = 3 and the loss is 3/4.
    z = torch.tensor([[1.0, 2.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, -2.0]])
    assert decorrelation_loss(z).item() == pytest.approx(0.75, rel=1e-6)
    # Fully correlated dimensions (a column and an affine copy): K is all ones, the loss is its maximum 1.
    z = torch.tensor([[0.0], [1.0], [3.0]]) @ torch.tensor([[1.0, -2.0, 0.5]]) + torch.tensor([[4.0, 0.0, 1.0]])
    assert decorrelation_loss(z).item() == pytest.approx(1.0, rel=1e-5)


def test_decorrelation_gradient_lowers_the_correlation() -> None:
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(32, 1, generator=gen)
    z = (base + 0.3 * torch.randn(32, 3, generator=gen)).requires_grad_(True)
    before = decorrelation_loss(z)
    before.backward()
    assert z.grad is not None
    after = decorrelation_loss(z.detach() - 0.5 * z.grad)
    assert before.item() > 1 / 3 + 0.1 and after.item() < before.item()


def test_decorrelation_of_one_sample_is_zero() -> None:
    assert decorrelation_loss(torch.randn(1, 4)).item() == 0.0


# ---- both -----------------------------------------------------------------------------------------


def _metrics(cfg: dict[str, Any], path: Path) -> bytes:
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return (path / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("name", ["fedntd", "feddecorr"])
def test_beta_zero_is_fedavg_byte_for_byte(tmp_path: Path, name: str) -> None:
    avg = _metrics(tiny_config(rounds=2), tmp_path / "avg")
    assert _metrics(tiny_config(rounds=2, algorithm={"name": name, "beta": 0.0}), tmp_path / "zero") == avg
    assert _metrics(tiny_config(rounds=2, algorithm={"name": name, "beta": 1.0}), tmp_path / "one") != avg


@pytest.mark.parametrize(("name", "key", "value", "allowed"), [
    ("fedntd", "beta", -0.1, ">= 0"), ("fedntd", "tau", 0.0, "> 0"), ("fedntd", "tau", -1.0, "> 0"),
    ("feddecorr", "beta", -1.0, ">= 0"),
])
def test_bad_parameters_are_refused_in_one_line(name: str, key: str, value: float, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        typed_config(tiny_config(algorithm={"name": name, key: value}))
    message = str(err.value)
    assert "\n" not in message and key in message and allowed in message and str(value) in message


def test_the_terms_have_no_batched_form_so_a_batched_runner_trains_one_client_at_a_time() -> None:
    model = TinyNet()
    with FeatureTap(model) as tap:  # type: ignore[arg-type]
        for term in (ntd_term(TinyNet(), 1.0, 1.0), decorrelation_term(tap, 0.1)):
            reason = why_sequential(model, torch.zeros(2, 1, 8, 8), [term], [])
            assert reason is not None and "no batched form" in reason


def test_fedskew_list_cites_the_papers(capsys: pytest.CaptureFixture[str]) -> None:
    from fedskew.cli import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, cited in (("fedntd", "NeurIPS 2022, \"Preservation of the Global Knowledge by Not-True"),
                        ("feddecorr", "ICLR 2023, \"Towards Understanding and Mitigating Dimensional Collapse")):
        at = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        assert "beta=" in lines[at] and "paper:" in lines[at + 1] and cited in lines[at + 1]


def test_the_authors_penalty_is_the_papers_rescaled_and_runs_as_an_option(tmp_path: Path) -> None:
    """The authors' code's penalty = ((N - 1)^2 / N) * (d / (d - 1)) * (the paper's - 1/d), up to EPS."""
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    n, d = z.shape
    expected = (n - 1) ** 2 / n * d / (d - 1) * (decorrelation_loss(z).item() - 1 / d)
    assert authors_decorrelation_loss(z).item() == pytest.approx(expected, rel=1e-6)
    assert authors_decorrelation_loss(z[:1]).item() == 0.0
    cfg = tiny_config(rounds=1, algorithm={"name": "feddecorr", "penalty": "authors"})
    records = RoundLoop(typed_config(cfg), tmp_path, progress=False).run().records
    assert len(records) == 1 and records[0]["accuracy"] is not None
    with pytest.raises(ConfigError, match=r"algorithm\.penalty must be one of 'paper', 'authors', got 'code'"):
        typed_config(tiny_config(algorithm={"name": "feddecorr", "penalty": "code"}))


def test_feddecorr_defaults_to_the_authors_penalty_with_their_beta() -> None:
    """The paper's beta = 0.1 ran under the authors' normalisation (bytedance/FedDecorr loss.py), so that pair is
    the default; the paper's formula is ``penalty = "paper"``."""
    params = typed_config(tiny_config(algorithm={"name": "feddecorr"})).algorithm.params
    assert (params.beta, params.penalty) == (0.1, "authors")  # type: ignore[attr-defined]
