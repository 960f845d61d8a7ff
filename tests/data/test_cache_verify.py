"""Issue 26: the array cache records whether a dataset's sources were verified.

Arrays cached by a load with ``verify = false`` used to serve every later load, so a later ``verify =
true`` skipped the checksum of a damaged or foreign file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedskew.core.errors import DataError
from fedskew.data import load_dataset
from fedskew.data.cache import ArrayCache, Entry
from tests.helpers.datasets import write_idx_release


def test_an_unverified_entry_never_serves_a_verified_load(tmp_path: Path) -> None:
    write_idx_release(tmp_path / "mnist", 30, 10, gz_train=True, gz_test=False)  # not the official files
    cache = tmp_path / "cache"
    ds = load_dataset("mnist", tmp_path, cache_dir=cache, verify=False)
    assert len(list(cache.glob("*.npz"))) == 1
    with pytest.raises(DataError, match="checksum mismatch"):
        load_dataset("mnist", tmp_path, cache_dir=cache)  # verify = true, the default
    again = load_dataset("mnist", tmp_path, cache_dir=cache, verify=False)
    assert np.array_equal(again.x_train, ds.x_train) and len(list(cache.glob("*.npz"))) == 1


def test_a_verified_entry_serves_both_kinds_of_load(tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(b"data")
    cache = ArrayCache(tmp_path / "cache")
    builds: list[bool | None] = []

    def build(flag: bool | None) -> Entry:
        builds.append(flag)
        return {"x": np.arange(3)}, {"verified": flag}

    for flag in (None, False, False, True, True, False):
        cache.get_or_build("d", {}, [source], lambda f=flag: build(f), verified=flag)
    # None (no checksums) and False each build once; True builds once, though an unverified entry exists.
    assert builds == [None, False, True]
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3
    builds.clear()
    for flag in (True, False):  # an entry made with verification serves a load without it
        cache.get_or_build("e", {}, [source], lambda f=flag: build(f), verified=flag)
    assert builds == [True]
