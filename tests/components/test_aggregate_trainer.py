import pytest
import torch

from fedskew.components.aggregate import Aggregation, robust_average, update_norms, weighted_mean
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


def _states(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Client states of mixed shapes and dtypes: a non-contiguous float32 tensor, float16, an int counter."""
    g = torch.Generator().manual_seed(seed)
    return [{"conv": torch.randn(4, 3, 3, 2, generator=g).transpose(1, 3), "bias": torch.randn(7, generator=g),
             "half": torch.randn(5, generator=g).half(), "count": torch.tensor(i, dtype=torch.int64)}
            for i in range(n)]


def test_weighted_mean_equals_the_key_by_key_float64_sum_bit_for_bit() -> None:
    """Joining each client's tensors into one vector changes no bit of the mean (same products, same order)."""
    items, weights = _states(5), [3.0, 1.0, 7.0, 2.0, 5.0]
    out = weighted_mean(items, weights)
    for key, first in items[0].items():
        if not first.is_floating_point():
            assert out[key].item() == 4
            continue
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for item, w in zip(items, weights, strict=True):
            acc.add_(item[key].to(torch.float64), alpha=w / sum(weights))
        assert out[key].dtype == first.dtype and out[key].shape == first.shape
        assert torch.equal(out[key], acc.to(first.dtype)), key
    assert list(out) == list(items[0])


def test_update_norms_and_the_one_pass_mean_agree_with_their_definitions() -> None:
    items, reference = _states(4), _states(1, seed=9)[0]
    keys = ["conv", "bias", "half"]
    expected = [float(sum((it[k].double() - reference[k].double()).pow(2).sum() for k in keys)) ** 0.5 for it in items]
    assert update_norms(items, reference) == pytest.approx(expected, rel=1e-12)
    # no outlier: robust_average's one pass (mean and norms together) is weighted_mean exactly
    state, rejected = robust_average(items, [1.0, 2.0, 3.0, 4.0], reference, Aggregation())
    mean = weighted_mean(items, [1.0, 2.0, 3.0, 4.0])
    assert rejected == [] and all(torch.equal(state[k], v) for k, v in mean.items())
    # an outlier: rejected, and the mean is that of the others
    items[2] = {k: (v * 1000 if v.is_floating_point() else v) for k, v in items[2].items()}
    state, rejected = robust_average(items, [1.0, 2.0, 3.0, 4.0], reference, Aggregation())
    assert [i for i, _ in rejected] == [2] and "exceeds 10 x the round's median" in rejected[0][1]
    kept = weighted_mean([items[0], items[1], items[3]], [1.0, 2.0, 4.0])
    assert all(torch.equal(state[k], v) for k, v in kept.items())


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
