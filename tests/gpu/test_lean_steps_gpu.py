"""Lean steps on CUDA (issue 34, point 1): local training, evaluation and distribution matching make no host
sync inside their steps. PyTorch's sync debug mode is set to fail on any synchronising call for the steps
(the first step, which sets things up, and the one read at the end are let through).

Skipped without CUDA (tests/gpu/conftest.py); tests/components/test_lean_steps.py checks the same loops on the
CPU by counting reads. Also here: the launch-cutting switches (``sgd_impl``, ``compile``, ``tf32``) on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fedskew.components.trainer as trainer
import fedskew.condense as cd
import fedskew.models.evaluation as evaluation
from fedskew.algorithms.base import ModelSpec
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.core.device import Compute, use_compute
from fedskew.models.layout import use_channels_last
from tests.helpers.device_draws import tiny3, toy_data

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)


@contextmanager
def syncs_fail() -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _let_through(real: Any) -> Any:
    def read(*args: Any, **kwargs: Any) -> Any:
        torch.cuda.set_sync_debug_mode("default")  # the one read at the end
        return real(*args, **kwargs)

    return read


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return use_channels_last(ModelSpec("fedavg_cnn", 1, 10, 28).build().to(CUDA))


def _fmnist_like(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn((n, 1, 28, 28), generator=g).to(CUDA), torch.randint(0, 10, (n,), generator=g).to(CUDA)


def test_local_training_makes_no_host_sync_in_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model, (x, y) = _cnn(), _fmnist_like(300)
    cfg = LocalConfig(epochs=2, batch_size=32, lr=0.01)
    train_local(model, x, y, cfg, torch.Generator().manual_seed(0))  # warm-up: cuDNN, the allocator
    monkeypatch.setattr(trainer, "host_floats", _let_through(trainer.host_floats))
    with syncs_fail():
        res = train_local(model, x, y, cfg, torch.Generator().manual_seed(0))
    assert res.steps == 20 and res.mean_loss > 0


def test_fedaf_server_steps_with_the_lgkm_term_make_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedAF's server training (its LGKM term on every step) on a GPU: the term's masked form reads nothing."""
    from fedskew.algorithms.condensation.knowledge import knowledge_matching_term

    model, (x, y) = _cnn(), _fmnist_like(300)
    r = torch.softmax(torch.randn(10, 10, generator=torch.Generator().manual_seed(2)), dim=1)
    known = torch.arange(10) != 3
    terms = [knowledge_matching_term(r, known, tau=1.0, weight=2.0)]
    cfg = LocalConfig(epochs=2, batch_size=32, lr=0.01)
    train_local(model, x, y, cfg, torch.Generator().manual_seed(0), terms)  # warm-up, and R placed on the GPU
    monkeypatch.setattr(trainer, "host_floats", _let_through(trainer.host_floats))
    with syncs_fail():
        res = train_local(model, x, y, cfg, torch.Generator().manual_seed(0), terms)
    assert res.steps == 20 and res.mean_loss > 0


def test_evaluation_makes_no_host_sync_until_its_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    model, (x, y) = _cnn(), _fmnist_like(1000)
    expected = evaluation.evaluate_model(model, x, y, 10)
    monkeypatch.setattr(evaluation, "_to_host", _let_through(evaluation._to_host))
    with syncs_fail():
        counts = evaluation.evaluate_model(model, x, y, 10)
    assert int(counts.total.sum()) == 1000 and counts.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)


@pytest.mark.parametrize("sampler", ["perturbed", "interpolated"])
def test_distribution_matching_steps_make_no_host_sync(sampler: str) -> None:
    x, y = toy_data(CUDA)
    g = torch.Generator().manual_seed(0)
    base = cd.fresh_model(tiny3, g, CUDA)
    make = cd.perturbed_model_sampler(base, tiny3, 1.0) if sampler == "perturbed" else \
        cd.interpolated_model_sampler(base, tiny3, 0.9)
    target = torch.randn((1, 3), generator=g).to(CUDA)

    def checked(step: int, generator: torch.Generator) -> nn.Module:
        if step == 1:  # step 0 set up the network and the kept tensors
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        return make(step, generator)

    def swd(model: nn.Module, syn: cd.SyntheticSet) -> torch.Tensor:  # FedAF's kind of extra term
        return 1e-3 * cd.sliced_wasserstein(model(syn.images)[:2], target, 8, g)

    cfg = cd.DMConfig(iterations=4, ipc=2, real_batch=8, clip_norm=2.0)
    try:
        syn = cd.distribution_matching(x, y, checked, cfg, g, extra_loss=swd)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool(torch.isfinite(syn.images).all())


@pytest.mark.parametrize("options", [{"sgd_impl": "fused"}, {"sgd_impl": "foreach"}, {"tf32": True},
                                     {"compile": "reduce-overhead"}])
def test_launch_cutting_switches_train_close_to_the_plain_step(options: dict[str, Any]) -> None:
    x, y = _fmnist_like(200)
    cfg = LocalConfig(epochs=2, batch_size=32, lr=0.01, momentum=0.9)
    plain, switched = _cnn(), _cnn()
    train_local(plain, x, y, cfg, torch.Generator().manual_seed(0))
    with use_compute(Compute("cuda:0", **options)):
        res = train_local(switched, x, y, cfg, torch.Generator().manual_seed(0))
    assert res.steps == 14
    for a, b in zip(plain.parameters(), switched.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-3)


def test_a_run_with_every_switch_on_cuda(tmp_path: Path) -> None:
    from tests.helpers.runs import run_metrics

    records = run_metrics(tmp_path, device="cuda:0", sgd_impl="fused", compile="reduce-overhead", tf32=True)
    assert len(records) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in records)
