"""Small LeNet-style CNNs of the federated-learning literature: two 5x5 convolutions, each followed by
ReLU and 2x2 max-pooling, then fully connected layers.

``cnn``, ``fedavg_cnn`` and ``cnn_cim`` differ only in their widths. Their convolutions are unpadded
("valid") at the papers' image sizes; the option ``padding`` (``None``: automatic) pads both
convolutions by 2 ("same") only when the image is too small for valid convolutions (e.g. 8x8 sklearn
digits: 8 -> 8 -> 4 -> 4 -> 2 instead of collapsing to nothing).
"""

from __future__ import annotations

from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.core.params import minimums
from fedskew.models.registry import MODELS, FedModel, ModelParams

_KERNEL = 5
_SAME = _KERNEL // 2


def _side_after_convs(image_size: int, padding: int) -> int:
    """Side of the feature map after the two conv + pool stages, 0 if it collapses."""
    side = image_size
    for _ in range(2):
        conv_side = side + 2 * padding - _KERNEL + 1
        if conv_side < 2:
            return 0
        side = conv_side // 2
    return side


def _resolve_padding(model: str, image_size: int, padding: int | None) -> tuple[int, int]:
    """Return ``(padding, final side)``; ``None`` means 0, or 2 if 0 leaves no feature map."""
    if padding is None:
        padding = 0 if _side_after_convs(image_size, 0) else _SAME
    side = _side_after_convs(image_size, padding)
    if side == 0:
        raise ConfigError(f"model {model!r}: image_size {image_size} is too small for padding {padding}")
    return padding, side


class CnnParams(ModelParams, kw_only=True):
    """Options of the two-conv CNNs: ``padding`` of both convolutions, >= 0; unset: automatic (see above)."""

    padding: int | None = None

    at_least = minimums(padding=0)


_WIDTHS: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = {
    "cnn": ((6, 16), (120, 84)),
    "fedavg_cnn": ((32, 64), (512,)),
    "cnn_cim": ((64, 128), (384, 192)),
}
"""Per model: the channels of the two convolutions and the widths of the hidden linear layers."""


def _two_conv_cnn(model: str, p: CnnParams, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build conv-ReLU-pool x2 with the widths of ``model``, then ReLU hidden layers, then a linear head."""
    (c1, c2), hidden = _WIDTHS[model]
    pad, side = _resolve_padding(model, image_size, p.padding)
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, c1, _KERNEL, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, _KERNEL, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    width = c2 * side * side
    for units in hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    return FedModel(nn.Sequential(*layers), nn.Linear(width, num_classes))


@MODELS.register("cnn", params=CnnParams)
def simple_cnn(p: CnnParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """The small CNN of MOON (Li, He & Song, CVPR 2021, "simple-cnn") used by FedDC (Kim & Choi, 2022).

    conv(C,6,5)-ReLU-pool-conv(6,16,5)-ReLU-pool-FC(16*5*5,120)-ReLU-FC(120,84)-ReLU-FC(84,classes) on
    32x32. The FedDC paper only calls its model "a three-layered CNN ... frequently adopted by a typical
    federated learning experiment" and cites MOON, FedNova and FedAdam; MOON's CIFAR-10 model is this
    one, so we use it. ``features`` ends at the 84-d ReLU, the output of MOON's simple-cnn encoder.

    62,006 parameters on 32x32x3 with 10 classes. On 28x28 (no padding) the feature map is 16*4*4, as
    in MOON's MNIST variant, giving 44,426 parameters on 28x28x1, exactly the MNIST CNN size HFLDD
    reports.
    """
    return _two_conv_cnn("cnn", p, in_channels, num_classes, image_size)


@MODELS.register("fedavg_cnn", params=CnnParams)
def fedavg_cnn(p: CnnParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """The CNN of FedAvg (McMahan et al., AISTATS 2017): conv(C,32,5)-conv(32,64,5)-FC(512)-FC(classes).

    Unpadded by default, so 28x28 gives 64*4*4 = 1024 inputs to FC(1024,512) and 582,026 parameters
    (28x28x1, 10 classes), the size used by LEAF-style benchmarks. ``padding=2`` gives the "same"
    convolutions behind the paper's reported 1,663,370 parameters (64*7*7 = 3136 inputs).
    """
    return _two_conv_cnn("fedavg_cnn", p, in_channels, num_classes, image_size)


@MODELS.register("cnn_cim", params=CnnParams)
def cnn_cim(p: CnnParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """The CIFAR-10 CNN of the class-imbalance-mitigation paper: two 5x5 convolutions with 64 and 128
    filters (each ReLU + 2x2 max-pool), three fully connected layers.

    The paper gives neither the hidden widths nor the padding: we use 384 and 192 hidden units (the
    classic TensorFlow CIFAR-10 tutorial CNN, the usual source of this two-conv/three-FC design) and
    unpadded convolutions like the other two CNNs here, giving 128*5*5 = 3200 features on 32x32 and
    1,514,826 parameters (32x32x3, 10 classes). ``padding=2`` gives the tutorial's "same" convolutions.
    """
    return _two_conv_cnn("cnn_cim", p, in_channels, num_classes, image_size)
