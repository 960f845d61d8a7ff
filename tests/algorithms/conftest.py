"""Fixtures of the algorithm tests: the folder of real dataset copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_datasets() -> Path:
    """The folder of real dataset copies, read from ``$FEDSKEW_DATA``.

    Unset while ``<repo>/../shared/datasets`` exists: the test fails (the copies are there but the run
    would not use them; ``scripts/test.sh`` sets the variable). Unset and no such folder: the test is
    skipped. Set to something that is not a folder: the test fails.
    """
    env = os.environ.get("FEDSKEW_DATA")
    if env:
        path = Path(env)
        if not path.is_dir():
            pytest.fail(f"FEDSKEW_DATA={env!r} is not a folder; set it to the folder of dataset copies", pytrace=False)
        return path
    local = REPO.parent / "shared" / "datasets"
    if local.is_dir():
        pytest.fail(
            f"FEDSKEW_DATA is not set but {local} exists: set FEDSKEW_DATA={local} (scripts/test.sh does)",
            pytrace=False,
        )
    pytest.skip("needs real dataset copies: set FEDSKEW_DATA to their folder")
