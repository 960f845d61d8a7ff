"""Models on flattened pixels: the FedAvg multilayer perceptron and logistic regression."""

from __future__ import annotations

from dataclasses import field

from torch import nn

from fedskew.core.params import check
from fedskew.models.registry import MODELS, FedModel, ModelParams


class MlpParams(ModelParams, kw_only=True):
    """Options of ``mlp``: ``hidden``, the widths of the hidden layers (positive integers; empty gives
    logistic regression)."""

    hidden: list[int] = field(default_factory=lambda: [200, 200])

    def __post_init__(self) -> None:
        super().__post_init__()
        # A bound on each item of a list: no declaration says it.
        check(all(units >= 1 for units in self.hidden), "hidden", self.hidden, "a list of positive integers")


@MODELS.register("mlp", params=MlpParams)
def mlp(p: MlpParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build a ReLU multilayer perceptron on the flattened image.

    The default is the "2NN" of FedAvg (McMahan et al., AISTATS 2017): two hidden layers of 200 units,
    199,210 parameters on 28x28x1 with 10 classes. ``features`` ends at the last hidden ReLU.
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_channels * image_size * image_size
    for units in p.hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    return FedModel(nn.Sequential(*layers), nn.Linear(width, num_classes))


@MODELS.register("logreg", params=ModelParams)
def logreg(p: ModelParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build multinomial logistic regression: one linear layer on the flattened image.

    The class-imbalance-mitigation paper's MNIST model (its case 4): 7,850 parameters on 28x28x1 with
    10 classes. ``features`` is the flattening, so ``embed_dim`` is ``C*H*W``.
    """
    return FedModel(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))
