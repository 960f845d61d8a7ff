"""Thread-count control.

PyTorch's CPU kernels give bit-different results for different intra-op thread counts, so every unit
of client work and every evaluation chunk runs on exactly one thread, whichever process runs it. This
is what makes metrics byte-identical for any number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads, then restore the previous setting."""
    old = torch.get_num_threads()
    if n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != old:
            torch.set_num_threads(old)
