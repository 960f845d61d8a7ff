"""Lean steps (issue 34, point 1): local training, evaluation and FedDM's clipping read the device once, not per
step, and give the numbers the step-by-step reads gave, bit for bit.

A CPU has no host syncs to count, so the reads are counted as calls that bring a tensor's values to the host
(``float``, ``item``, ``tolist``, ``cpu``, ``numpy``): their number must not grow with the steps. On CUDA,
tests/gpu/test_lean_steps_gpu.py runs the same loops with PyTorch's sync debug mode set to fail on any sync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.trainer import LocalConfig, train_local
from fedskew.condense.distribution_matching import _clip_total
from fedskew.core.device import host_floats
from fedskew.models.evaluation import EvalCounts, evaluate_model
from fedskew.models.layout import shuffled_batches

READS = ("__float__", "item", "tolist", "cpu", "numpy")


@contextmanager
def counted_reads() -> Iterator[list[str]]:
    """Every call of a host-reading tensor method inside the block, by name."""
    seen: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def spy(name: str, real: Callable[..., object]) -> Callable[..., object]:
        def read(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            seen.append(name)
            return real(self, *args, **kwargs)

        return read

    for name, real in saved.items():
        setattr(torch.Tensor, name, spy(name, real))
    try:
        yield seen
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))


def _data(n: int = 45) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn((n, 1, 4, 4), generator=g), torch.randint(0, 3, (n,), generator=g)


def _l2(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return 0.01 * sum((p**2).sum() for p in model.parameters())  # type: ignore[return-value]


def _reference_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: LocalConfig, g: torch.Generator,
                     terms: Sequence[Callable[..., torch.Tensor]]) -> tuple[int, float]:
    """train_local as it was before issue 34: each step's loss read with float(), indices moved per step."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    steps, loss_sum = 0, 0.0
    for _ in range(cfg.epochs):
        for idx in list(torch.randperm(int(y.shape[0]), generator=g).split(cfg.batch_size)):
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
            xb, yb = x[idx], y[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            for term in terms:
                loss = loss + term(model, xb, yb, logits)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += float(loss.detach())
    return steps, loss_sum / max(steps, 1)


@pytest.mark.parametrize("max_steps", [None, 5])
def test_train_local_gives_the_step_by_step_loss_and_weights_bit_for_bit(max_steps: int | None) -> None:
    x, y = _data()
    cfg = LocalConfig(epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3, max_steps=max_steps)
    ref_model, new_model = _net(), _net()
    steps, mean_loss = _reference_train(ref_model, x, y, cfg, torch.Generator().manual_seed(1), [_l2])
    res = train_local(new_model, x, y, cfg, torch.Generator().manual_seed(1), terms=[_l2])
    assert (res.steps, res.mean_loss) == (steps, mean_loss)  # the float, exactly
    assert steps == (5 if max_steps else 18)
    for a, b in zip(ref_model.parameters(), new_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_train_local_reads_the_device_once_whatever_the_steps() -> None:
    x, y = _data()
    counts = []
    for epochs in (1, 4):
        with counted_reads() as seen:
            res = train_local(_net(), x, y, LocalConfig(epochs=epochs, batch_size=4, lr=0.1), torch.Generator())
        counts.append(len(seen))
        assert res.steps == 12 * epochs
    assert counts[0] == counts[1] <= 2, counts  # one copy of the losses (cpu, then tolist)


def _reference_eval(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> EvalCounts:
    """evaluate_model as it was: numpy bincounts and a float loss per chunk of 250."""
    out = EvalCounts(np.zeros(num_classes, np.int64), np.zeros(num_classes, np.int64), 0.0)
    model.eval()
    for s in range(0, int(y.shape[0]), 250):
        xc, yc = x[s : s + 250], y[s : s + 250]
        with torch.inference_mode():
            logits = model(xc)
            loss = float(F.cross_entropy(logits.float(), yc, reduction="sum"))
            pred = logits.argmax(dim=1)
        yn = yc.numpy()
        correct = np.bincount(yn[pred.numpy() == yn], minlength=num_classes).astype(np.int64)
        out = out + EvalCounts(correct, np.bincount(yn, minlength=num_classes).astype(np.int64), loss)
    return out


def test_evaluation_reads_once_and_counts_as_before() -> None:
    x, y = _data(1100)  # five chunks, the last one short
    model = _net()
    ref = _reference_eval(model, x, y, 4)  # four classes: one of them never occurs
    with counted_reads() as seen:
        new = evaluate_model(model, x, y, 4)
    assert new.loss_sum == ref.loss_sum
    assert np.array_equal(new.correct, ref.correct) and np.array_equal(new.total, ref.total)
    assert new.correct.dtype == np.int64 and new.total[3] == 0 and new.total.sum() == 1100
    with counted_reads() as one_chunk:
        evaluate_model(model, x[:100], y[:100], 4)
    assert len(seen) == len(one_chunk) <= 4, seen


@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])
def test_feddm_clipping_on_the_device_equals_the_float_one(scale: float) -> None:
    grad = torch.randn((6, 1, 5, 5), generator=torch.Generator().manual_seed(2)) * scale
    expected = grad.clone()
    norm = float(expected.norm())
    if norm > 2.0:
        expected.mul_(2.0 / norm)
    with counted_reads() as seen:
        _clip_total(grad, 2.0)
    assert torch.equal(grad, expected) and seen == []


def test_an_epochs_order_moves_once_and_draws_as_before() -> None:
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    moved = shuffled_batches(23, 5, a, torch.device("cpu"))
    assert [t.tolist() for t in moved] == [t.tolist() for t in shuffled_batches(23, 5, b)]
    assert torch.equal(a.get_state(), b.get_state())
    assert len({t.untyped_storage().data_ptr() for t in moved}) == 1  # views of one copy


def test_host_floats_are_the_floats_of_each_value() -> None:
    values = [torch.tensor(0.1), torch.tensor(1 / 3, dtype=torch.bfloat16), torch.tensor([2.5])]
    assert host_floats(values) == [float(v) for v in values]
    assert host_floats([]) == []
