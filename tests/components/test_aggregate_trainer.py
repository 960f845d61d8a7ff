import pytest
import torch

from fedskew.components.aggregate import weighted_mean
from fedskew.components.selection import uniform_sample
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.core.errors import FedskewError
from fedskew.core.seeding import numpy_rng
from fedskew.models.evaluation import evaluate_model


def test_weighted_mean_by_hand() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}
    out = weighted_mean([a, b], [1, 2])
    assert torch.allclose(out["w"], torch.tensor([3.0, 6.0]))
    assert out["n"].item() == 5 and out["w"].dtype == torch.float32
    with pytest.raises(FedskewError):
        weighted_mean([], [])


def test_uniform_sample_distinct_sorted_capped() -> None:
    s = uniform_sample(50, 10, numpy_rng(0, "s"))
    assert len(set(s)) == 10 and s == sorted(s) and all(0 <= c < 50 for c in s)
    assert uniform_sample(3, 10, numpy_rng(0, "s")) == [0, 1, 2]


def test_train_local_learns_and_is_reproducible() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    y = (x[:, 0] > 0).long()

    def run() -> tuple[torch.nn.Module, float]:
        torch.manual_seed(1)
        m = torch.nn.Linear(5, 2)
        res = train_local(m, x, y, LocalConfig(epochs=5, batch_size=20, lr=0.5), torch.Generator().manual_seed(3))
        assert res.steps == 50 and res.num_samples == 200
        return m, evaluate_model(m, x, y, 2).accuracy

    m1, acc = run()
    m2, _ = run()
    assert acc > 0.9
    assert torch.equal(m1.weight, m2.weight)


def test_train_local_loss_term_and_grad_hook_are_applied() -> None:
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    w0 = m.weight.detach().clone()
    x, y = torch.randn(8, 3), torch.zeros(8, dtype=torch.long)
    calls = []

    def zero_grads(model: torch.nn.Module) -> None:
        calls.append(1)
        for p in model.parameters():
            p.grad.zero_()

    train_local(m, x, y, LocalConfig(epochs=1, batch_size=4, lr=1.0), torch.Generator(), grad_hooks=[zero_grads])
    assert len(calls) == 2 and torch.equal(m.weight, w0)  # zeroed gradients: no movement
