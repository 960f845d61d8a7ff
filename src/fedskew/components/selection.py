"""Client selectors."""

from __future__ import annotations

import numpy as np


def uniform_sample(num_clients: int, k: int, rng: np.random.Generator) -> list[int]:
    """``min(k, num_clients)`` distinct clients drawn uniformly, sorted by id."""
    k = min(k, num_clients)
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))
