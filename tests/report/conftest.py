"""Shared fixtures of the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from fedskew.report import plots as plots_module


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """The figures the report saves, by file stem (the files are written as usual)."""
    saved: dict[str, Figure] = {}
    original = plots_module._save

    def spy(fig: Figure, path: Path, fmt: str = "png", dpi: int = 150) -> Path:
        saved[path.name] = fig
        return original(fig, path, fmt, dpi)

    monkeypatch.setattr(plots_module, "_save", spy)
    return saved
