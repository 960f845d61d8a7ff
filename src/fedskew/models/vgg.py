"""VGG-11 (Simonyan & Zisserman, ICLR 2015) in its common CIFAR form, the deeper model of FedDC
(Kim & Choi, 2022)."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedskew.models.registry import MODELS, FedModel, NormParams, norm2d

VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""Conv widths of VGG-11 ("M": 2x2 max-pooling)."""

NORMS = ("batchnorm", "groupnorm", "none")


class VggParams(NormParams, kw_only=True):
    """Options of ``vgg11``: ``norm`` (one of :data:`NORMS`) and ``num_groups`` (see :class:`NormParams`)."""

    NORMS: ClassVar[tuple[str, ...]] = NORMS


@MODELS.register("vgg11", params=VggParams)
def vgg11(p: VggParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build VGG-11: eight conv3x3(padding 1)-norm-ReLU layers, five max-pools, one linear classifier.

    As in the usual CIFAR variant, the three-layer ImageNet classifier is replaced by a single
    ``Linear(512, classes)`` on the 1x1x512 map of a 32x32 input (9,231,114 parameters with
    batchnorm on 32x32x3, 10 classes).

    Notes
    -----
    The max-pools round up (``ceil_mode``), which is the same as rounding down on even sides, so 32x32
    is the standard network, while odd sides do not collapse: 28 -> 14 -> 7 -> 4 -> 2 -> 1 and
    8 -> 4 -> 2 -> 1 -> 1 -> 1. Larger images keep a larger map, flattened into the classifier
    (64x64: 512*2*2 = 2048 inputs).
    """
    layers: list[nn.Module] = []
    channels, side = in_channels, image_size
    for item in VGG11_CFG:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True))
            side = (side + 1) // 2
        else:
            width = int(item)
            layers.append(nn.Conv2d(channels, width, kernel_size=3, padding=1))
            if p.norm != "none":
                layers.append(norm2d("vgg11", p.norm, width, p.num_groups))
            layers.append(nn.ReLU())
            channels = width
    layers.append(nn.Flatten())
    return FedModel(nn.Sequential(*layers), nn.Linear(channels * side * side, num_classes))
