"""Pieces shared by the personalised methods (FedPer, FedRep, FedBABU, Ditto, APFL, pFedMe, Per-FedAvg, FedALA).

Which layers are personal is the model's declaration, not the method's: every :class:`~fedskew.models.FedModel`
names the submodules of its head in ``head_modules`` (default: the last linear layer, ``classifier``), and
the rest is the body. :func:`head_keys` reads that declaration from any model, registered or a plug-in's,
so the head/body methods work on every model without a list of layer names.

The other helpers are the small steps the methods' own training loops share: one mini-batch loss
(:func:`batch_loss`), its gradient (:func:`gradients`), freezing part of a model (:func:`trainable`), a
stream of mini-batches that runs over epochs (:func:`batch_stream`) and the grouping of parameters by
layer (:func:`parameter_layers`, FedALA's "layers").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.models.layout import as_model_format, is_channels_last, shuffled_batches

V = TypeVar("V")


def head_keys(model: nn.Module) -> set[str]:
    """State-dict keys (parameters and buffers) of the model's head, the submodules named in ``head_modules``.

    Raises
    ------
    ConfigError
        If the model declares no head (it is not a :class:`~fedskew.models.FedModel`) or the declared
        submodules hold nothing.
    """
    names = getattr(model, "head_modules", None)
    if not names:
        raise ConfigError(f"model {type(model).__name__} declares no head (FedModel.head_modules): "
                          "the head/body methods (fedper, fedrep, fedbabu) need one")
    prefixes = tuple(f"{n}." for n in names)
    keys = {k for k in model.state_dict() if k.startswith(prefixes)}
    if not keys:
        raise ConfigError(f"model {type(model).__name__}: its head {list(names)} holds no parameters")
    return keys


def only(state: dict[str, V], keys: set[str]) -> dict[str, V]:
    """The entries of ``state`` whose key is in ``keys``."""
    return {k: v for k, v in state.items() if k in keys}


def without(state: dict[str, V], keys: set[str]) -> dict[str, V]:
    """``state`` without ``keys``."""
    return {k: v for k, v in state.items() if k not in keys}


@contextmanager
def trainable(model: nn.Module, keys: set[str]) -> Iterator[nn.Module]:
    """Within the block only the parameters named in ``keys`` take gradients (the others are frozen).

    :func:`~fedskew.components.trainer.train_local`'s SGD skips parameters without a gradient, weight
    decay and momentum included, so a frozen parameter does not change. The flags are restored on exit
    (models are reused across clients and rounds).
    """
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        for name, p in model.named_parameters():
            p.requires_grad_(name in keys)
        yield model
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``model`` on one batch (in the model's memory layout)."""
    return F.cross_entropy(model(as_model_format(x, is_channels_last(model))), y)


def gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The gradient of :func:`batch_loss` for each parameter of ``model`` (in ``parameters()`` order)."""
    loss = batch_loss(model, x, y)
    return list(torch.autograd.grad(loss, list(model.parameters())))


def batch_stream(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of shuffled epochs, one epoch after the other, without end (pFedMe's and Per-FedAvg's
    clients draw a fixed number of batches, not epochs). Empty for ``n = 0``."""
    while n > 0:
        yield from shuffled_batches(n, batch_size, generator)


def parameter_layers(model: nn.Module) -> list[list[str]]:
    """The model's layers as lists of parameter names, input to output: every module that holds parameters
    of its own (a convolution, a normalisation layer, a linear layer), in registration order."""
    layers = []
    for prefix, module in model.named_modules():
        names = [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]
        if names:
            layers.append(names)
    return layers
