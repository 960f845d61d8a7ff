"""ResNet-18 (He et al., CVPR 2016) in its CIFAR form, the larger model of FedAF's appendix."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from fedskew.core.params import check
from fedskew.models.registry import MODELS, FedModel, NormParams, norm2d

NORMS = ("batchnorm", "groupnorm")
STEMS = ("cifar", "imagenet")
_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (width, stride of the first block)
_BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """Two conv3x3-norm layers with an identity (or 1x1 conv-norm projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm: str, num_groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm2d("resnet18", norm, planes, num_groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = norm2d("resnet18", norm, planes, num_groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                norm2d("resnet18", norm, planes, num_groups),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))``."""
        out = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNetParams(NormParams, kw_only=True):
    """Options of ``resnet18``.

    Attributes
    ----------
    norm, num_groups
        One of :data:`NORMS` ("groupnorm" is the usual FL replacement, since BatchNorm statistics
        differ across non-IID clients) and its groups; see :class:`NormParams`.
    stem
        "cifar" (default): conv3x3 stride 1 and no max-pool, the standard CIFAR ResNet-18
        (11,173,962 parameters on 32x32x3, 10 classes). "imagenet": conv7x7 stride 2 + 3x3 max-pool
        as in torchvision, which is the 11,181,642-parameter ResNet18 FedAF's appendix reports.
    """

    NORMS: ClassVar[tuple[str, ...]] = NORMS

    stem: str = "cifar"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.stem in STEMS, "stem", self.stem, f"one of {', '.join(STEMS)}")


@MODELS.register("resnet18", params=ResNetParams)
def resnet18(p: ResNetParams, *, in_channels: int, num_classes: int, image_size: int) -> FedModel:
    """Build ResNet-18: a stem, four stages of two BasicBlocks, global average pooling, Linear(512).

    Notes
    -----
    Global average pooling makes the embedding 512-d for every image size (8x8 with the CIFAR stem:
    8 -> 8 -> 4 -> 2 -> 1).
    """
    norm, num_groups = p.norm, p.num_groups
    del image_size  # global average pooling: the network is the same for every image size
    layers: list[nn.Module]
    if p.stem == "cifar":
        layers = [
            nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False),
            norm2d("resnet18", norm, 64, num_groups),
            nn.ReLU(),
        ]
    else:
        layers = [
            nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
            norm2d("resnet18", norm, 64, num_groups),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        ]
    planes = 64
    for width, stride in _STAGES:
        for block in range(_BLOCKS_PER_STAGE):
            layers.append(BasicBlock(planes, width, stride if block == 0 else 1, norm, num_groups))
            planes = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return FedModel(nn.Sequential(*layers), nn.Linear(planes, num_classes))
