"""Models on flattened pixels: the FedAvg multilayer perceptron and logistic regression."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.models.registry import MODELS, FedModel, require_positive_int


@MODELS.register("mlp")
def mlp(
    *, in_channels: int, num_classes: int, image_size: int, hidden: Sequence[int] = (200, 200)
) -> FedModel:
    """Build a ReLU multilayer perceptron on the flattened image.

    The default is the "2NN" of FedAvg (McMahan et al., AISTATS 2017): two hidden layers of 200 units,
    199,210 parameters on 28x28x1 with 10 classes. ``features`` ends at the last hidden ReLU.

    Parameters
    ----------
    hidden
        Widths of the hidden layers (a list or tuple of positive integers; empty gives logistic
        regression).
    """
    if isinstance(hidden, str | bytes) or not isinstance(hidden, Sequence):
        raise ConfigError(f"model 'mlp': hidden must be a list of positive integers, got {hidden!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_channels * image_size * image_size
    for units in hidden:
        require_positive_int("mlp", "hidden", units)
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    return FedModel(nn.Sequential(*layers), nn.Linear(width, num_classes))


@MODELS.register("logreg")
def logreg(*, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build multinomial logistic regression: one linear layer on the flattened image.

    The class-imbalance-mitigation paper's MNIST model (its case 4): 7,850 parameters on 28x28x1 with
    10 classes. ``features`` is the flattening, so ``embed_dim`` is ``C*H*W``.
    """
    return FedModel(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))
