"""GPU tests: skipped where CUDA is absent (CI, this project's CPU machines); run them on a GPU machine
with ``python -m pytest tests/gpu -m gpu`` (see docs/performance.md for the last time they ran)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """True float32 convolutions and products: cuDNN's TF32 default would round two paths of the same
    computation (batched and one client at a time) apart by about 1e-3."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
