"""The model interface every algorithm codes against, and the registry of model factories.

Every model is a :class:`FedModel`: ``forward(x) = classifier(features(x))``. Algorithms rely on the
split: FedAF and distribution matching (DM) embed images with ``features`` (all layers before the last
linear layer), FedGen, FedBN and MOON work on the ``classifier`` head. Model families register a factory
``f(params, *, in_channels, num_classes, image_size) -> FedModel`` in :data:`MODELS`, together with the
Params dataclass (a :class:`ModelParams`) of its options; :func:`create_model` builds one by name and
rejects options the model does not take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, check, minimums, params_doc
from fedskew.core.registry import Registry

norm_layer_types: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.InstanceNorm2d,
)
"""Normalisation module classes; FedBN keeps modules of these types local to each client."""

_DIMENSIONS = ("in_channels", "num_classes", "image_size")


class FedModel(nn.Module):
    """A classifier split into a feature extractor and a linear head.

    Parameters
    ----------
    features
        Maps a batch ``(B, C, H, W)`` to flat embeddings ``(B, embed_dim)``: every layer before the last
        linear layer, as the feature extractor ``h_w`` of FedAF/DM is defined.
    classifier
        The last linear layer (the "head").

    Attributes
    ----------
    embed_dim
        Width of the embedding, ``classifier.in_features``.
    head_modules
        Names of the submodules that form the model's head, the layers the personalised methods keep on
        each client (FedPer, FedRep) or freeze (FedBABU); the rest is the body (:mod:`fedskew.components.personal`).
        Default: the last linear layer. A model widens it by naming more submodules (FedPer's paper keeps
        up to its last two layers personal).
    """

    features: nn.Module
    classifier: nn.Linear
    embed_dim: int
    head_modules: tuple[str, ...] = ("classifier",)

    def __init__(self, features: nn.Module, classifier: nn.Linear) -> None:
        super().__init__()
        self.features = features
        self.classifier = classifier
        self.embed_dim = classifier.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits ``classifier(features(x))``."""
        return self.classifier(self.features(x))


class ModelParams(Options, kw_only=True):
    """Keys every ``[model]`` table may hold besides ``name`` (none so far); each model's Params adds its options
    and declares their bounds (:class:`~fedskew.core.params.Options`)."""


class NormParams(ModelParams, kw_only=True):
    """Options of a network with 2-d normalisation layers (VGG, ResNet).

    Attributes
    ----------
    norm
        One of the class's ``NORMS``; "groupnorm" uses ``num_groups`` groups (an FL-friendly choice, as
        BatchNorm statistics differ across non-IID clients).
    num_groups
        Groups for "groupnorm"; must divide the channels of every layer (64 divides them all).
    """

    NORMS: ClassVar[tuple[str, ...]] = ("batchnorm", "groupnorm")

    norm: str = "batchnorm"
    num_groups: int = 2

    at_least = minimums(num_groups=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.norm in self.NORMS, "norm", self.norm, f"one of {', '.join(self.NORMS)}")


MODELS: Registry[Callable[..., FedModel]] = Registry("model", ModelParams)
"""Model factories by name, each registered with its Params class; a factory is called as
``f(params, *, in_channels, num_classes, image_size)``."""


def model_options(name: str) -> dict[str, Any]:
    """Return the options of model ``name`` with their defaults (the fields of its Params class).

    Raises
    ------
    ConfigError
        If ``name`` is not a registered model.
    """
    cls = MODELS.params_of(name)
    return {} if cls is None else {key: default for key, _, default in params_doc(cls)}


def create_model(
    name: str, *, in_channels: int, num_classes: int, image_size: int, **options: Any
) -> FedModel:
    """Build the registered model ``name`` for square images of side ``image_size``.

    Parameters
    ----------
    name
        A name in ``MODELS.names()``.
    in_channels, num_classes, image_size
        Input channels, number of classes and image side in pixels (positive integers).
    **options
        Model-specific options (the fields of ``MODELS.params_of(name)``; see :func:`model_options`).

    Raises
    ------
    ConfigError
        For an unknown name, an option the model does not take, or an invalid value.
    """
    factory = MODELS.get(name)
    for key, value in zip(_DIMENSIONS, (in_channels, num_classes, image_size), strict=True):
        require_positive_int(name, key, value)
    params = MODELS.build_params(name, options, prefix="model.")
    return factory(params, in_channels=in_channels, num_classes=num_classes, image_size=image_size)


def count_parameters(model: nn.Module) -> int:
    """Return the number of scalar parameters of ``model`` (buffers such as BN statistics excluded)."""
    return sum(p.numel() for p in model.parameters())


def require_positive_int(model: str, option: str, value: object) -> None:
    """Raise a :class:`ConfigError` naming the option unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model {model!r}: {option} must be a positive integer, got {value!r}")


def norm2d(model: str, kind: str, channels: int, num_groups: int) -> nn.Module:
    """Return the 2-d normalisation layer ``kind`` ("batchnorm" or "groupnorm") for VGG/ResNet.

    "groupnorm" uses ``num_groups`` groups: Hsieh et al. (2020, "The non-IID data quagmire of
    decentralized machine learning") replace BatchNorm by GroupNorm because batch statistics differ
    across non-IID clients.
    """
    if kind == "batchnorm":
        return nn.BatchNorm2d(channels)
    if channels % num_groups:
        raise ConfigError(f"model {model!r}: num_groups={num_groups} does not divide {channels} channels")
    return nn.GroupNorm(num_groups, channels)
