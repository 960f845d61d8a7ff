"""The batched trainer against train_local, client by client, in float64 (issue 34)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from fedskew.components import batched
from fedskew.components.batching import BatchRequest, draw_batches, why_sequential
from fedskew.components.stacked_forward import LayeredForward, VmapForward, stacked_forward
from fedskew.components.terms import FeatureTap, contrastive_term, correction_hook, linear_term, proximal_term
from fedskew.components.trainer import LocalConfig, functional_of, train_local
from fedskew.core.device import Compute, use_compute
from fedskew.models import create_model
from fedskew.models.layout import use_channels_last
from fedskew.models.registry import FedModel

TOL = 1e-9


@pytest.fixture(autouse=True)
def float64() -> object:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _cnn(seed: int, channels_last: bool = True, **opts: object) -> nn.Module:
    torch.manual_seed(seed)
    m = create_model("cnn", in_channels=1, num_classes=4, image_size=8, **opts)
    return use_channels_last(m) if channels_last else m


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _compare(models: list[nn.Module], data: list[tuple[torch.Tensor, torch.Tensor]], cfg: LocalConfig,
             terms_of: object = None) -> None:
    """Train copies sequentially and batched from the same start; parameters, steps and losses agree."""
    seq_models = [copy.deepcopy(m) for m in models]
    expected = []
    for k, (m, (x, y)) in enumerate(zip(seq_models, data, strict=True)):
        terms = terms_of(m) if callable(terms_of) else []
        expected.append(train_local(m, x, y, cfg, torch.Generator().manual_seed(k), terms))
    requests = []
    for k, (m, (x, y)) in enumerate(zip(models, data, strict=True)):
        terms = terms_of(m) if callable(terms_of) else []
        assert why_sequential(m, x, terms, []) is None
        batches = draw_batches(int(y.shape[0]), cfg, torch.Generator().manual_seed(k))
        requests.append(BatchRequest(m, x, y, cfg, batches, [functional_of(t) for t in terms], terms))
    got = batched.train_batched(requests)
    for res, want, m, ms in zip(got, expected, models, seq_models, strict=True):
        assert (res.num_samples, res.steps) == (want.num_samples, want.steps)
        assert res.mean_loss == pytest.approx(want.mean_loss, abs=TOL)
        for (name, p), q in zip(m.named_parameters(), ms.parameters(), strict=True):
            assert (p - q).abs().max().item() <= TOL, name


SIZES = [70, 33, 16, 5, 48]  # batch 16: 5, 3, 1, 1 and 3 steps an epoch; last batches of 6, 1, 5, 0 samples


@pytest.mark.parametrize("layered", [True, False])
def test_unequal_clients_with_momentum_and_weight_decay(monkeypatch: pytest.MonkeyPatch, layered: bool) -> None:
    monkeypatch.setattr(batched, "USE_LAYERED", layered)
    cfg = LocalConfig(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-3)
    models = [_cnn(k) for k in range(len(SIZES))]
    _compare(models, [_data(n, k) for k, n in enumerate(SIZES)], cfg)


def test_max_steps_and_plain_sgd() -> None:
    cfg = LocalConfig(epochs=3, batch_size=16, lr=0.1, max_steps=4)
    _compare([_cnn(k, channels_last=False) for k in range(3)], [_data(n, k) for k, n in enumerate([70, 20, 40])], cfg)


def test_proximal_and_linear_terms() -> None:
    cfg = LocalConfig(epochs=1, batch_size=16, lr=0.05, momentum=0.5)
    start = [_cnn(k) for k in range(3)]

    def terms(m: nn.Module) -> list:
        params = dict(m.named_parameters())
        anchor = {n: p.detach().clone() + 0.01 for n, p in params.items()}
        coef = {n: torch.full_like(p, 0.1) for n, p in params.items()}
        return [proximal_term(anchor, 0.3), linear_term(coef)]

    _compare(start, [_data(n, k) for k, n in enumerate([40, 17, 64])], cfg, terms)


def test_frozen_and_unreached_parameters_stay_put() -> None:
    """A frozen head (FedBABU) and a parameter the loss never reaches are left alone, as SGD leaves them."""

    class WithSpare(FedModel):
        def __init__(self) -> None:
            super().__init__(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU()), nn.Linear(16, 4))
            self.spare = nn.Linear(3, 3)  # never used in forward

    models = []
    for k in range(3):
        torch.manual_seed(k)
        m = WithSpare()
        m.classifier.weight.requires_grad_(False)
        models.append(m)
    before = [m.spare.weight.detach().clone() for m in models]
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.01)
    _compare(models, [_data(n, k) for k, n in enumerate([30, 9, 17])], cfg)
    for m, b in zip(models, before, strict=True):
        assert torch.equal(m.spare.weight, b)


def test_nothing_to_train_fails_as_train_local_does() -> None:
    """Only an unused parameter is trainable: train_local's backward fails, and so does the batched step."""

    class Unused(FedModel):
        def __init__(self) -> None:
            super().__init__(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU()), nn.Linear(16, 4))
            self.spare = nn.Linear(3, 3)

    models = []
    for k in range(2):
        torch.manual_seed(k)
        m = Unused()
        for name, p in m.named_parameters():
            p.requires_grad_(name.startswith("spare"))
        models.append(m)
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1)
    x, y = _data(30, 0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        train_local(copy.deepcopy(models[0]), x, y, cfg, torch.Generator().manual_seed(0))
    requests = [BatchRequest(m, x, y, cfg, draw_batches(30, cfg, torch.Generator().manual_seed(0)), [], [])
                for m in models]
    with pytest.raises(RuntimeError, match="does not require grad"):  # the probe's autograd.grad
        batched.train_batched(requests)


def test_frozen_channels_last_body() -> None:
    """FedRep's head epochs: the convolutions (channels-last) frozen, the head trained."""
    models = [_cnn(k) for k in range(3)]
    for m in models:
        for name, p in m.named_parameters():
            p.requires_grad_(name.startswith("classifier"))
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    _compare(models, [_data(n, k) for k, n in enumerate([30, 9, 17])], cfg)


def test_group_norm_model_takes_the_layered_forward() -> None:
    torch.manual_seed(0)
    models = [create_model("convnet", in_channels=1, num_classes=4, image_size=8, net_width=8, net_depth=1,
                           net_norm="instancenorm") for _ in range(3)]
    fwd = stacked_forward(models[0], 3, channels_last=False)
    assert isinstance(fwd, LayeredForward)
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.05, momentum=0.9)
    _compare(models, [_data(n, k) for k, n in enumerate([20, 11, 8])], cfg)


def test_unknown_layer_takes_the_vmap_forward() -> None:
    torch.manual_seed(0)

    def build() -> nn.Module:
        return FedModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.LayerNorm(16), nn.ReLU()), nn.Linear(16, 4))

    models = [build() for _ in range(3)]
    assert isinstance(stacked_forward(models[0], 3, channels_last=False), VmapForward)
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)
    _compare(models, [_data(n, k) for k, n in enumerate([25, 9, 40])], cfg)


def test_what_cannot_batch_says_why() -> None:
    m = _cnn(0)
    x, _ = _data(4, 0)
    assert "gradient" in str(why_sequential(m, x, [], [correction_hook({})]))
    tap_model = create_model("cnn", in_channels=1, num_classes=4, image_size=8)
    assert isinstance(tap_model, FedModel)
    with FeatureTap(tap_model) as tap:
        term = contrastive_term(tap, tap_model, tap_model, 1.0, 0.5)
        assert "batched form" in str(why_sequential(m, x, [term], []))
        assert "hooks" in str(why_sequential(tap_model, x, [], []))
    bn = create_model("convnet", in_channels=1, num_classes=4, image_size=8, net_width=8, net_depth=1,
                      net_norm="batchnorm")
    assert "running statistics" in str(why_sequential(bn, x, [], []))
    assert "random" in str(why_sequential(nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 4)), x, [], []))
    assert "float32 or float64" in str(why_sequential(m.half(), x, [], []))
    with use_compute(Compute("cpu", compile="default")):
        assert "compile" in str(why_sequential(_cnn(0), x, [], []))
    assert why_sequential(_cnn(0), x, [], []) is None


@pytest.mark.slow
def test_importing_a_loss_term_loads_no_batching_module() -> None:
    """The batching code is loaded, and its hand-off installed, by the batched runner only (issue 45): a
    method's loss terms, its condensations and the methods themselves load none of it."""
    code = ("import sys, fedskew.components.terms, fedskew.condense, fedskew.algorithms\n"
            "from fedskew.core import handoff\n"
            "print(len(handoff._HAND_OFF))\n"
            "print(*sorted(m for m in sys.modules if m.startswith(('fedskew.components.batch', "
            "'fedskew.engine.batched'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["0", ""]


class _WithScalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.tensor(1.5))


def test_a_term_written_once_is_its_formula_for_one_client() -> None:
    """proximal_term and linear_term are their stacked forms at K = 1 (components.trainer.stacked_term): the
    papers' formulas, 0-dimensional parameters included."""
    model = _WithScalar()
    g = torch.Generator().manual_seed(0)
    other = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    params = dict(model.named_parameters())
    prox = proximal_term(other, 0.3)(model, torch.zeros(1), torch.zeros(1), torch.zeros(1))
    want = 0.15 * sum(((params[n] - a) ** 2).sum() for n, a in other.items())
    assert prox.shape == () and torch.allclose(prox, want, rtol=1e-12, atol=0)
    lin = linear_term(other)(model, torch.zeros(1), torch.zeros(1), torch.zeros(1))
    assert torch.allclose(lin, -sum((params[n] * c).sum() for n, c in other.items()), rtol=1e-12, atol=0)
