"""The condensation tests' tiny network: the features/classifier split of fedskew's models, for 8x8 inputs."""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """conv3x3(4) - ReLU - avgpool - FC(16) - ReLU | FC(classes), for 8x8 inputs."""

    def __init__(self, in_channels: int = 1, num_classes: int = 2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 4, 3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 16),
            nn.ReLU(),
        )
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
