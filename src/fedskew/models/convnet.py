"""The ConvNet of dataset condensation (Zhao, Mopuri & Bilen, ICLR 2021) and distribution matching
(Zhao & Bilen, WACV 2023), the backbone of FedDM and FedAF (Wang et al., CVPR 2024).

Each of ``net_depth`` blocks is conv3x3(padding 1) - norm - activation - 2x2 pooling; one linear
classifier reads the flattened feature map. The defaults (width 128, depth 3, instance norm, average
pooling) give 320,010 parameters on 32x32x3 with 10 classes, and 381,450 on 64x64x3 (the ConvNet size
FedAF reports for its experiments).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.core.params import check, minimums
from fedskew.models.registry import MODELS, FedModel, ModelParams

NORMS = ("instancenorm", "batchnorm", "layernorm", "groupnorm", "none")
POOLINGS = ("avgpooling", "maxpooling", "none")
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "leakyrelu": lambda: nn.LeakyReLU(negative_slope=0.01),
    "sigmoid": nn.Sigmoid,
    "swish": nn.SiLU,
}
_GROUPS = 4  # "groupnorm" in the DC code: 4 groups


def _norm(kind: str, channels: int, side: int) -> list[nn.Module]:
    """The DC code's normalisation layers; "instancenorm" is GroupNorm with one channel per group."""
    if kind == "instancenorm":
        return [nn.GroupNorm(channels, channels, affine=True)]
    if kind == "batchnorm":
        return [nn.BatchNorm2d(channels)]
    if kind == "layernorm":
        return [nn.LayerNorm([channels, side, side])]
    if kind == "groupnorm":
        return [nn.GroupNorm(_GROUPS, channels, affine=True)]
    return []


class ConvNetParams(ModelParams, kw_only=True):
    """Options of ``convnet``.

    Attributes
    ----------
    net_width, net_depth
        Channels of every conv layer and number of blocks (positive integers).
    net_norm
        One of :data:`NORMS`. "instancenorm" (the DC default) is ``GroupNorm(width, width)``, as in the
        DC code; "groupnorm" uses 4 groups (``net_width`` must be divisible by 4); "layernorm"
        normalises each sample's (C, H, W) map. FedAF uses "batchnorm" to compare with FedBN.
    net_act
        One of :data:`ACTIVATIONS`.
    net_pooling
        One of :data:`POOLINGS`; each pooling halves the side (rounding down).
    """

    net_width: int = 128
    net_depth: int = 3
    net_norm: str = "instancenorm"
    net_act: str = "relu"
    net_pooling: str = "avgpooling"

    at_least = minimums(net_width=1, net_depth=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, value, allowed in (
            ("net_norm", self.net_norm, NORMS),
            ("net_act", self.net_act, tuple(ACTIVATIONS)),
            ("net_pooling", self.net_pooling, POOLINGS),
        ):
            check(value in allowed, key, value, f"one of {', '.join(allowed)}")
        groupnorm_ok = self.net_norm != "groupnorm" or self.net_width % _GROUPS == 0
        check(groupnorm_ok, "net_width", self.net_width, f"divisible by {_GROUPS} with net_norm 'groupnorm'")


@MODELS.register("convnet", params=ConvNetParams)
def convnet(p: ConvNetParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build the DC/DM ConvNet (options: :class:`ConvNetParams`).

    Notes
    -----
    For 28x28 inputs (MNIST/FMNIST) the first conv is padded by 3 instead of 1, as in the DC code,
    which treats 28x28 images as 32x32: 28 -> 32 -> 16 -> 8 -> 4, so the embedding is 128*4*4 = 2048
    (not 128*3*3). Other sizes use padding 1 throughout (8x8: 8 -> 4 -> 2 -> 1).
    """
    net_width, net_depth, net_pooling = p.net_width, p.net_depth, p.net_pooling
    layers: list[nn.Module] = []
    channels, side = in_channels, image_size
    for depth in range(net_depth):
        padding = 3 if depth == 0 and image_size == 28 else 1
        side += 2 * padding - 2
        layers.append(nn.Conv2d(channels, net_width, kernel_size=3, padding=padding))
        layers += _norm(p.net_norm, net_width, side)
        layers.append(ACTIVATIONS[p.net_act]())
        if net_pooling != "none":
            pool = nn.AvgPool2d if net_pooling == "avgpooling" else nn.MaxPool2d
            layers.append(pool(kernel_size=2, stride=2))
            side //= 2
        if side < 1:
            raise ConfigError(
                f"model 'convnet': image_size {image_size} is too small for {net_depth} pooled blocks"
            )
        channels = net_width
    layers.append(nn.Flatten())
    return FedModel(nn.Sequential(*layers), nn.Linear(channels * side * side, num_classes))
