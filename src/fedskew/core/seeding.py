"""Derived random streams.

One root seed; every (side, client, round, purpose) draws from its own generator derived from it by
hashing. Results therefore do not depend on execution order, on how many workers run clients, or on
whether a run was resumed from a checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")


def derive_seed(root: int, *keys: int | str) -> int:
    """A 63-bit seed determined by ``root`` and the ``keys`` (stable across Python versions)."""
    text = repr((int(root), *keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def numpy_rng(root: int, *keys: int | str) -> np.random.Generator:
    """A numpy generator for the stream named by ``keys``."""
    return np.random.default_rng(derive_seed(root, *keys))


def torch_generator(root: int, *keys: int | str) -> torch.Generator:
    """A CPU torch generator for the stream named by ``keys``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(root, *keys))
    return g


def seeded_init(factory: Callable[[], T], root: int, *keys: int | str) -> T:
    """Call ``factory()`` with the global torch RNG seeded from the stream, restoring it after.

    Module constructors draw their initial weights from the global generator; forking it keeps model
    initialisation reproducible without disturbing any other stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(root, *keys))
        return factory()
