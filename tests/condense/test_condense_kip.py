"""Kernel Inducing Points and its kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedskew.condense import (
    KIPConfig,
    RandomConvFeatures,
    centered_one_hot,
    init_synthetic,
    kip,
    kip_loss,
    ntk_fc_relu,
    random_feature_kernel,
)
from fedskew.condense.kip import _step_kernel
from fedskew.core.errors import ConfigError, DataError

Toy = tuple[torch.Tensor, torch.Tensor]


def _linear(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.flatten(1) @ b.flatten(1).T


def _numpy_loss(k_ts: np.ndarray, k_ss: np.ndarray, y_t: np.ndarray, y_s: np.ndarray, reg: float) -> float:
    n = k_ss.shape[0]
    alpha = np.linalg.solve(k_ss + reg * np.trace(k_ss) / n * np.eye(n), y_s)
    return 0.5 * float(((y_t - k_ts @ alpha) ** 2).sum())


@pytest.mark.parametrize("kernel_name", ["linear", "ntk"])
def test_kip_loss_equals_numpy_solve(kernel_name: str) -> None:
    g = torch.Generator().manual_seed(0)
    x_t, x_s = torch.randn((7, 1, 2, 3), generator=g), torch.randn((4, 1, 2, 3), generator=g)
    y_t = centered_one_hot(torch.randint(3, (7,), generator=g), 3)
    y_s = torch.randn((4, 3), generator=g)
    kernel = _linear if kernel_name == "linear" else ntk_fc_relu
    reg = 0.1
    loss = float(kip_loss(x_t, y_t, x_s, y_s, kernel, reg).detach())
    a_t, a_s = x_t.double(), x_s.double()
    k_ts, k_ss = kernel(a_t, a_s).numpy(), kernel(a_s, a_s).numpy()
    assert loss == pytest.approx(_numpy_loss(k_ts, k_ss, y_t.double().numpy(), y_s.double().numpy(), reg), rel=1e-9)


def test_ntk_is_symmetric_psd_and_matches_a_wide_network() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn((6, 5), generator=g, dtype=torch.float64)
    x[5] = -x[0]  # an antipodal pair exercises theta = pi
    k = ntk_fc_relu(x, x, depth=3)
    assert torch.allclose(k, k.T, atol=1e-12)
    assert torch.allclose(ntk_fc_relu(x[:2], x[2:], depth=3), ntk_fc_relu(x[2:], x[:2], depth=3).T)
    assert float(torch.linalg.eigvalsh(k).min()) > -1e-9
    empirical = sum(_empirical_ntk(x[:4].float(), 2, 1024, seed) for seed in range(8)) / 8
    exact = ntk_fc_relu(x[:4], x[:4], depth=2)
    assert float((empirical - exact).norm() / exact.norm()) < 0.06


def _empirical_ntk(x: torch.Tensor, depth: int, width: int, seed: int) -> torch.Tensor:
    """J J^T of a finite ReLU network in NTK parameterisation (w_std = sqrt 2, b_std = 0.1)."""
    g = torch.Generator().manual_seed(seed)
    dims = [x.shape[1]] + [width] * depth + [1]
    weights = [torch.randn((dims[i + 1], dims[i]), generator=g).requires_grad_() for i in range(depth + 1)]
    biases = [torch.randn((dims[i + 1],), generator=g).requires_grad_() for i in range(depth + 1)]
    rows = []
    for v in x:
        h = v
        for i in range(depth + 1):
            z = math.sqrt(2.0) * weights[i] @ h / math.sqrt(dims[i]) + 0.1 * biases[i]
            h = torch.relu(z)
        grads = torch.autograd.grad(z[0], weights + biases)
        rows.append(torch.cat([t.flatten() for t in grads]))
    jac = torch.stack(rows)
    return (jac @ jac.T).double()


def test_random_feature_kernel_is_psd_and_seeded() -> None:
    x = torch.randn((5, 2, 8, 8), generator=torch.Generator().manual_seed(0))
    nets = [RandomConvFeatures(2, 8, 3, torch.Generator().manual_seed(s)) for s in range(2)]
    k = random_feature_kernel(x, x, nets)
    assert k.dtype == torch.float64 and torch.allclose(k, k.T)
    assert float(torch.linalg.eigvalsh(k).min()) > -1e-9
    again = [RandomConvFeatures(2, 8, 3, torch.Generator().manual_seed(s)) for s in range(2)]
    assert torch.equal(random_feature_kernel(x, x, again), k)
    assert list(nets[0].parameters()) == []  # a fixed feature map


def test_a_step_embeds_each_batch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The random-feature kernel of a KIP step embeds the support images once for K_ss and K_ts (issue 45), with
    the kernel values of embedding them each time."""
    cfg = KIPConfig(kernel="rf_convnet", rf_width=4, depth=2, rf_draws=2)
    kernel = _step_kernel(cfg, 1, torch.Generator().manual_seed(0))
    same = torch.Generator().manual_seed(0)
    nets = [RandomConvFeatures(1, 4, 2, same) for _ in range(2)]  # the step's draws
    g = torch.Generator().manual_seed(1)
    x_s, x_t = torch.randn((4, 1, 8, 8), generator=g), torch.randn((6, 1, 8, 8), generator=g)
    expected = random_feature_kernel(x_s, x_s, nets), random_feature_kernel(x_t, x_s, nets)
    calls: list[int] = []
    forward = RandomConvFeatures.forward
    monkeypatch.setattr(RandomConvFeatures, "forward", lambda self, x: (calls.append(x.shape[0]), forward(self, x))[1])
    k_ss, k_ts = kernel(x_s, x_s), kernel(x_t, x_s)
    assert sorted(calls) == [4, 4, 6, 6]  # two networks, each batch once
    assert torch.equal(k_ss, expected[0]) and torch.equal(k_ts, expected[1])


@pytest.mark.parametrize("kernel", ["ntk", "rf_convnet"])
def test_gradient_reaches_support_images_and_labels(kernel: str, toy: Toy) -> None:
    x, y = toy
    cfg = KIPConfig(kernel=kernel, rf_width=8)
    x_s = x[[0, 30]].clone().requires_grad_(True)
    y_s = centered_one_hot(torch.tensor([0, 1]), 2).requires_grad_(True)
    k = _step_kernel(cfg, 1, torch.Generator().manual_seed(0))
    kip_loss(x, centered_one_hot(y, 2), x_s, y_s, k, 1e-3).backward()
    for t in (x_s, y_s):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_kip_lowers_the_loss_and_is_reproducible(toy: Toy) -> None:
    x, y = toy
    x = x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    cfg = KIPConfig(iterations=20, ipc=2, target_batch=32, lr=0.05)
    targets = centered_one_hot(y, 2)

    def full_loss(images: torch.Tensor) -> float:
        with torch.no_grad():
            return float(
                kip_loss(x, targets, images, centered_one_hot(torch.tensor([0, 0, 1, 1]), 2), ntk_fc_relu, cfg.reg)
            )

    before = init_synthetic(x, y, [0, 1], 2, "real", torch.Generator().manual_seed(0))
    after = kip(x, y, 2, cfg, torch.Generator().manual_seed(0))
    assert after.soft_labels is None and after.labels.tolist() == [0, 0, 1, 1]
    assert full_loss(after.images) < 0.5 * full_loss(before.images)
    again = kip(x, y, 2, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(after.images, again.images)


def test_label_learning_and_rf_kernel(toy: Toy) -> None:
    x, y = toy
    cfg = KIPConfig(iterations=3, ipc=1, learn_labels=True, kernel="rf_convnet", rf_width=8, rf_draws=2)
    out = kip(x, y, 3, cfg, torch.Generator().manual_seed(0))
    assert out.soft_labels is not None and out.soft_labels.shape == (2, 3)
    assert out.soft_labels.dtype == torch.float32
    assert not torch.allclose(out.soft_labels.double(), centered_one_hot(out.labels, 3))


def test_errors(toy: Toy) -> None:
    x, y = toy
    with pytest.raises(DataError):
        kip(x, y, 1, KIPConfig(iterations=1), torch.Generator())
    with pytest.raises(ConfigError):
        KIPConfig(kernel="rbf")
