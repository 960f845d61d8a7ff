"""Sample-level DP-SGD (fedskew.privacy.dpsgd through train_local's ``private``): per-sample gradients against a
naive loop and Opacus, clipping, noise, reproducibility, the refusals, and what it reports for the accountant."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.feddecorr import decorrelation_term
from fedskew.algorithms.fedntd import ntd_term
from fedskew.components.terms import FeatureTap, contrastive_term, correction_hook, head_term, proximal_term
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.core.errors import ConfigError
from fedskew.models.registry import FedModel, create_model
from fedskew.privacy.dpsgd import PrivateGradients, SampleDP


def cnn(seed: int = 0, dtype: torch.dtype = torch.float64) -> FedModel:
    torch.manual_seed(seed)
    return create_model("cnn", in_channels=1, num_classes=10, image_size=28).to(dtype)


def data(n: int, seed: int = 1, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g)


def dp(clip: float = 1.0, z: float = 0.0, seed: int = 0, **kw: object) -> SampleDP:
    return SampleDP(clip, z, torch.Generator().manual_seed(seed), **kw)  # type: ignore[arg-type]


def naive_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, term=None) -> list[dict[str, torch.Tensor]]:
    """Each sample's gradient by torch.autograd, one sample at a time."""
    out = []
    for i in range(len(y)):
        logits = model(x[i:i + 1])
        loss = F.cross_entropy(logits, y[i:i + 1])
        if term is not None:
            loss = loss + term(model, x[i:i + 1], y[i:i + 1], logits)
        names, params = zip(*[(n, p) for n, p in model.named_parameters()], strict=True)
        out.append(dict(zip(names, torch.autograd.grad(loss, params), strict=True)))
    return out


def stacked(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name.removeprefix("model."): g for name, g in grads.items()}


@pytest.mark.parametrize("which", ["cnn", "convnet-instancenorm", "moon-term", "ntd-term"])
def test_per_sample_gradients_equal_a_naive_loop(which: str) -> None:
    x, y = data(6)
    if which == "convnet-instancenorm":
        torch.manual_seed(0)
        model: nn.Module = create_model("convnet", in_channels=1, num_classes=10, image_size=28, net_width=8,
                                        net_depth=2).double()
    else:
        model = cnn()
    term = None
    if which == "moon-term":
        tap = FeatureTap(model)  # type: ignore[arg-type]
        term = contrastive_term(tap, cnn(1), cnn(2), mu=5.0, temperature=0.5)  # type: ignore[arg-type]
    elif which == "ntd-term":
        term = ntd_term(cnn(1).eval(), beta=2.0, tau=3.0)
    want = naive_grads(model, x, y, term)
    got, _ = PrivateGradients(model, [term] if term else [], None, dp()).per_sample_grads(x, y)
    got = stacked(got)
    assert set(got) == set(want[0])
    for name, g in got.items():
        torch.testing.assert_close(g, torch.stack([w[name] for w in want]), rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Full backward hook")  # Opacus's hooks on an input without gradient
def test_per_sample_gradients_agree_with_opacus() -> None:
    opacus = pytest.importorskip("opacus")
    model, (x, y) = cnn(dtype=torch.float32), data(5, dtype=torch.float32)
    gsm = opacus.GradSampleModule(copy.deepcopy(model), loss_reduction="mean")
    F.cross_entropy(gsm(x), y).backward()
    theirs = {name.removeprefix("_module."): p.grad_sample for name, p in gsm.named_parameters()}
    mine, _ = PrivateGradients(model, [], None, dp()).per_sample_grads(x, y)
    mine = stacked(mine)
    for name, g in mine.items():
        # loss_reduction="mean": Opacus scales its grad_sample back to each sample's own gradient
        torch.testing.assert_close(g, theirs[name], rtol=1e-4, atol=1e-6)


def test_clipping_bounds_each_samples_contribution() -> None:
    model, (x, y) = cnn(), data(8)
    x[3] *= 1e4  # a sample whose gradient is huge
    pg = PrivateGradients(model, [], None, dp(clip=0.5))
    grads, _ = pg.per_sample_grads(x, y)
    norms = torch.sqrt(sum(g.reshape(8, -1).pow(2).sum(1) for g in grads.values()))  # type: ignore[arg-type]
    assert norms[3] > 100 * 0.5
    with_it = pg.clipped_sum(grads)
    without = pg.clipped_sum({k: torch.cat([g[:3], g[4:]]) for k, g in grads.items()})
    moved = torch.sqrt(sum((with_it[k] - without[k]).pow(2).sum() for k in grads))  # type: ignore[arg-type]
    assert float(moved) == pytest.approx(0.5, rel=1e-9)  # exactly clip: the sample was clipped to norm 0.5
    # within the bound a sample is kept as it is
    small = {k: g[:1] * (0.1 / norms[0]) for k, g in grads.items()}  # norm 0.1
    torch.testing.assert_close(pg.clipped_sum(small), {k: g[0] for k, g in small.items()})


def method_pieces(method: str, model: FedModel) -> tuple[list, list]:  # type: ignore[type-arg]
    """The loss terms and gradient hooks of ``method``'s local training, on ``model``."""
    if method == "fedprox":
        anchor = {k: v.detach().clone() + 0.01 for k, v in model.named_parameters()}
        return [proximal_term(anchor, 0.1)], []
    if method == "moon":
        return [contrastive_term(FeatureTap(model), cnn(1), cnn(2), mu=1.0, temperature=0.5)], []
    if method == "fedntd":
        return [ntd_term(cnn(1).eval(), beta=1.0, tau=1.0)], []
    # FedGen's head term on generated embeddings (data-free) and SCAFFOLD's correction hook
    g = torch.Generator().manual_seed(9)

    def sample() -> tuple[torch.Tensor, torch.Tensor]:
        feats = torch.randn(8, model.embed_dim, generator=g, dtype=torch.float64)
        return feats, torch.randint(0, 10, (8,), generator=g)

    correction = {k: torch.full_like(v, 0.01) for k, v in model.named_parameters()}
    return [head_term(sample, 0.5)], [correction_hook(correction)]


@pytest.mark.parametrize(("method", "momentum"), [("fedprox", 0.0), ("fedprox", 0.9), ("moon", 0.0),
                                                  ("fedntd", 0.0), ("fedgen+scaffold", 0.9)])
def test_without_noise_and_clipping_it_is_plain_sgd(method: str, momentum: float) -> None:
    """noise_multiplier 0 and a huge clip: the same steps as train_local's plain SGD (n divisible by the batch
    size, so that every batch has the size the noised sum is divided by), with each kind of loss term, a
    gradient hook and weight decay."""
    x, y = data(48)
    cfg = LocalConfig(batch_size=16, lr=0.05, momentum=momentum, weight_decay=1e-3, epochs=2)
    results, models = [], []
    for private in (None, dp(clip=1e12, z=0.0)):
        model = cnn()
        terms, hooks = method_pieces(method, model)
        results.append(train_local(model, x, y, cfg, torch.Generator().manual_seed(5), terms, hooks, private=private))
        models.append(model)
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert results[0].steps == results[1].steps == 6
    assert results[0].mean_loss == pytest.approx(results[1].mean_loss, rel=1e-9)


def test_parameter_only_terms_are_added_unclipped() -> None:
    """A tiny clip leaves almost nothing of the samples; the proximal term's gradient mu (w - anchor) stays whole."""
    model, (x, y) = cnn(), data(4)
    anchor = {k: v.detach().clone() - 1.0 for k, v in model.named_parameters()}  # w - anchor = 1 everywhere
    pg = PrivateGradients(model, [proximal_term(anchor, 0.3)], None, dp(clip=1e-9))
    pg.batches(4, 4, torch.Generator())
    pg.step(x, y)
    for p in model.parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, torch.full_like(p, 0.3), atol=1e-9, rtol=0)


def test_the_noise_has_std_noise_multiplier_times_clip_over_the_batch_size() -> None:
    model, (x, y) = cnn(), data(16)
    z, clip, b = 1.3, 0.7, 16

    def grads(noise: float) -> torch.Tensor:
        m = copy.deepcopy(model)
        pg = PrivateGradients(m, [], None, dp(clip=clip, z=noise, seed=11))
        pg.batches(b, b, torch.Generator())
        pg.step(x, y)
        return torch.cat([p.grad.reshape(-1) for p in m.parameters()])  # type: ignore[union-attr]

    noise = (grads(z) - grads(0.0)) * b / (z * clip)  # should be N(0, 1) on each of ~44,000 coordinates
    n = noise.numel()
    assert n > 40_000
    assert abs(float(noise.mean())) < 5 / math.sqrt(n)
    assert abs(float(noise.std()) - 1.0) < 5 / math.sqrt(2 * n)


def test_deterministic_given_the_generators() -> None:
    x, y = data(40)
    cfg = LocalConfig(batch_size=16, lr=0.1, epochs=1)

    def run(noise_seed: int) -> list[torch.Tensor]:
        m = cnn()
        train_local(m, x, y, cfg, torch.Generator().manual_seed(3), private=dp(clip=0.5, z=1.0, seed=noise_seed))
        return list(m.state_dict().values())

    a, b, c = run(7), run(7), run(8)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not all(torch.equal(u, v) for u, v in zip(a, c, strict=True))


def test_steps_and_sample_rate_are_filled() -> None:
    x, y = data(100)
    private = dp(clip=1.0, z=1.0)
    res = train_local(cnn(), x, y, LocalConfig(batch_size=32, lr=0.01, epochs=2), torch.Generator().manual_seed(0),
                      private=private)
    assert private.steps == res.steps == 8 and private.sample_rate == pytest.approx(0.32)
    capped = dp()
    train_local(cnn(), x, y, LocalConfig(batch_size=32, epochs=2, max_steps=3), torch.Generator(), private=capped)
    assert capped.steps == 3
    few = dp()  # fewer samples than the batch size: every sample in each step
    train_local(cnn(), x[:10], y[:10], LocalConfig(batch_size=32), torch.Generator(), private=few)
    assert few.steps == 1 and few.sample_rate == 1.0


def test_poisson_sampling_draws_batches_of_the_expected_size() -> None:
    pg = PrivateGradients(cnn(), [], None, dp(poisson=True))
    g = torch.Generator().manual_seed(0)
    sizes = [len(b) for _ in range(50) for b in pg.batches(1000, 50, g)]
    assert len(sizes) == 50 * 20 and pg.private.sample_rate == 0.05
    assert abs(sum(sizes) / len(sizes) - 50) < 5 * math.sqrt(50 * 0.95 / len(sizes))
    x, y = data(30)
    private = dp(clip=1.0, z=1.0, poisson=True)
    train_local(cnn(), x, y, LocalConfig(batch_size=8), torch.Generator(), private=private)
    assert private.steps == 4


def refusal(model: nn.Module, terms: list, adjust=None) -> str:  # type: ignore[type-arg]
    x, y = data(4)
    with pytest.raises(ConfigError) as err:
        train_local(model, x, y, LocalConfig(batch_size=2), torch.Generator(), terms, logit_adjust=adjust,
                    private=dp())
    message = str(err.value)
    assert "\n" not in message
    return message


def test_batchnorm_is_refused_in_one_line() -> None:
    torch.manual_seed(0)
    bn = create_model("convnet", in_channels=1, num_classes=10, image_size=28, net_width=8, net_norm="batchnorm")
    before = copy.deepcopy(bn.state_dict())
    message = refusal(bn.double(), [])
    assert "BatchNorm" in message and "groupnorm" in message and "instancenorm" in message
    assert all(torch.equal(before[k].double(), v.double()) for k, v in bn.state_dict().items())  # untouched


def test_terms_without_a_per_sample_gradient_are_refused_in_one_line() -> None:
    model = cnn()
    with FeatureTap(model) as tap:
        assert "FedDecorr" in refusal(model, [decorrelation_term(tap, 0.1)])
    assert "not" in refusal(model, [lambda m, x, y, logits: logits.sum() * 0])  # unmarked: refused
    counts = torch.ones(10)
    assert "label counts" in refusal(model, [], lambda logits, y: logits - counts.log())


def test_without_private_nothing_changes() -> None:
    x, y = data(40)
    cfg = LocalConfig(batch_size=16, lr=0.1, momentum=0.9, epochs=2)
    a, b = cnn(), cnn()
    train_local(a, x, y, cfg, torch.Generator().manual_seed(3))
    train_local(b, x, y, cfg, torch.Generator().manual_seed(3), private=None)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_batched_runner_trains_it_one_client_at_a_time() -> None:
    """Under clients_in_parallel the hand-off declines DP-SGD and says why; train_local then trains privately."""
    from fedskew.components.batching import batching, install_hand_off

    class Rendezvous:
        def __init__(self) -> None:
            self.reasons: list[str] = []

        def submit(self, request: object) -> object:
            raise AssertionError("DP-SGD was handed to the batched trainer")

        def sequential(self, reason: str, kind: str = "training") -> None:
            self.reasons.append(reason)

    install_hand_off()
    x, y = data(20)
    private, rendezvous = dp(clip=1.0, z=1.0), Rendezvous()
    with batching(rendezvous):
        train_local(cnn(), x, y, LocalConfig(batch_size=10), torch.Generator(), private=private)
    assert private.steps == 2 and rendezvous.reasons == ['DP-SGD (privacy.mode = "sample": per-sample gradients, '
                                                         'clipped and noised)']
