"""Loss terms and gradient hooks that baselines add to FedAvg's local SGD.

Each piece is one equation of one paper, written against :func:`~fedskew.components.trainer.train_local`'s
:data:`~fedskew.components.trainer.LossTerm` / :data:`~fedskew.components.trainer.GradHook` signatures,
so a method file only says which pieces it adds:

- :func:`proximal_term`: FedProx's (mu/2)||w - w_global||^2 (Li et al., MLSys 2020, Eq. 2); FedDyn reuses
  it with alpha in place of mu (Acar et al., ICLR 2021, Alg. 1).
- :func:`linear_term`: FedDyn's -<grad_prev, w> (Acar et al. 2021, Alg. 1).
- :func:`contrastive_term` with :class:`FeatureTap`: MOON's model-contrastive loss (Li, He & Song, CVPR 2021,
  Eq. 3).
- :func:`head_term`: cross-entropy of the classifier head on given embeddings (FedGen, Zhu, Hong & Zhou,
  ICML 2021, Eq. 5).
- :func:`correction_hook`: SCAFFOLD's gradient correction g + c - c_i (Karimireddy et al., ICML 2020,
  Alg. 1 line 10).
- :func:`weight_correction_hook`: the same correction applied to the weights outside the optimiser, as
  NIID-Bench's SCAFFOLD does (Li, Diao, Chen & He, ICDE 2022), which lets it run with momentum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.trainer import GradHook, LossTerm, stacked_term
from fedskew.models.registry import FedModel
from fedskew.privacy.dpsgd import data_free, per_sample


def parameter_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the trainable parameters, by name: an anchor that later steps do not move."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def proximal_term(anchor: dict[str, torch.Tensor], mu: float) -> LossTerm:
    """The proximal term (mu/2) * ||w - anchor||^2 over the named parameters.

    FedProx (Li et al. 2020, Eq. 2) adds it with ``anchor`` = the received global model so that local
    models cannot drift far from it on skewed data; its gradient is ``mu * (w - anchor)``.
    """
    return stacked_term(_stacked_proximal, anchor, mu)


def _stacked_proximal(params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """:func:`proximal_term` of K clients at once (parameters and anchors stacked on a first axis)."""
    sq = sum(((p - anchor[name]) ** 2).reshape(p.shape[0], -1).sum(1) for name, p in params.items())
    return 0.5 * mu * torch.as_tensor(sq)


def linear_term(coef: dict[str, torch.Tensor]) -> LossTerm:
    """The linear penalty -<coef, w> summed over the named parameters.

    FedDyn (Acar et al. 2021, Alg. 1) subtracts <grad L_k(theta_k^{t-1}), theta> so that each client's
    stationary point agrees with the global one; its gradient is the constant ``-coef``.
    """
    return stacked_term(_stacked_linear, coef)


def _stacked_linear(params: dict[str, torch.Tensor], coef: dict[str, torch.Tensor]) -> torch.Tensor:
    """:func:`linear_term` of K clients at once (parameters and coefficients stacked on a first axis)."""
    return -torch.as_tensor(sum((p * coef[name]).reshape(p.shape[0], -1).sum(1) for name, p in params.items()))


class FeatureTap:
    """Records the embedding ``features(x)`` a :class:`FedModel` computes on its way to the logits.

    A forward pre-hook on the classifier keeps its input, so a loss term can use the embedding of the
    batch without running the feature extractor a second time. Use as a context manager: the hook is
    removed on exit (models are reused across clients and rounds).
    """

    def __init__(self, model: FedModel) -> None:
        self.value: torch.Tensor | None = None
        self._handle = model.classifier.register_forward_pre_hook(self._record)

    def _record(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.value = args[0]

    def __enter__(self) -> FeatureTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float
) -> torch.Tensor:
    """MOON's model-contrastive loss (Li, He & Song 2021, Eq. 3), averaged over the batch.

    ``-log(exp(sim(z, z_glob)/T) / (exp(sim(z, z_glob)/T) + exp(sim(z, z_prev)/T)))`` with cosine
    similarity ``sim``: the local embedding is pulled towards the global model's and pushed from the
    client's previous local model's. It is a two-way cross-entropy whose target is the global pair.
    """
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1)
    target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / temperature, target)


def contrastive_term(
    tap: FeatureTap, global_model: FedModel, prev_model: FedModel, mu: float, temperature: float
) -> LossTerm:
    """MOON's mu * l_con on the batch (Li, He & Song 2021, Eq. 4).

    ``tap`` supplies the local embedding of the batch; the global and previous models are frozen (their
    embeddings are computed without gradient).
    """

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        assert tap.value is not None, "FeatureTap saw no forward pass"
        with torch.no_grad():
            z_glob = global_model.features(x)
            z_prev = prev_model.features(x)
        return mu * model_contrastive_loss(tap.value, z_glob, z_prev, temperature)

    return per_sample(term)  # a batch mean of one value per sample (DP-SGD clips it in)


def head_term(sample: Callable[[], tuple[torch.Tensor, torch.Tensor]], weight: float) -> LossTerm:
    """``weight`` * cross-entropy of the model's classifier head on sampled (embedding, label) pairs.

    FedGen (Zhu, Hong & Zhou 2021, Eq. 5) regularises the head with embeddings its server-trained
    generator produces for labels drawn from the global label prior, which teaches the head classes the
    client barely holds. ``sample()`` returns a fresh batch each step.
    """

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        feats, labels = sample()
        head = model.classifier
        assert isinstance(head, nn.Module)
        return weight * F.cross_entropy(head(feats), labels)

    return data_free(term)  # generated embeddings, none of the client's samples (DP-SGD adds it unclipped)


def correction_hook(correction: dict[str, torch.Tensor]) -> GradHook:
    """Add ``correction[name]`` to each parameter's gradient before the optimiser step.

    SCAFFOLD (Karimireddy et al. 2020, Alg. 1 line 10) passes c - c_i, which turns the local gradient
    into an estimate of the global one and so removes client drift.
    """

    def hook(model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if p.grad is not None:
                p.grad.add_(correction[name])

    return hook


def weight_correction_hook(correction: dict[str, torch.Tensor], lr: float, weight_decay: float) -> GradHook:
    """Move each parameter by ``-lr * correction[name]`` at every step, outside the optimiser.

    NIID-Bench's SCAFFOLD (``train_net_scaffold`` in the authors' ``experiments.py``) takes an ordinary
    SGD step (with momentum and weight decay) and then sets ``w <- w - lr (c - c_i)``, so the correction
    never enters the momentum buffer. A hook runs before the step, so this one shifts the weights first
    and adds ``weight_decay * lr * correction`` to the gradient, which cancels the decay the step would
    otherwise apply to the shift: the step's ``grad + weight_decay * w`` is then the unshifted weights',
    and the result is NIID-Bench's step-then-shift exactly (up to float rounding). Without momentum it
    equals :func:`correction_hook` (both give ``w - lr (g + wd w + c - c_i)``).
    """

    def hook(model: nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                shift = correction[name] * lr
                p.sub_(shift)
                if p.grad is not None and weight_decay:
                    p.grad.add_(shift, alpha=weight_decay)

    return hook
