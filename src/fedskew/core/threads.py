"""Thread-count control.

PyTorch's CPU kernels give bit-different results for different intra-op thread counts, so every unit
of client work and every evaluation chunk runs on exactly one thread, whichever process runs it. This
is what makes metrics byte-identical for any number of workers. The server's own work in the main process
(the condensation methods' training on the condensed sets) takes the run's ``server_threads`` (0: PyTorch's
default, every core): a fixed count gives its results on machines with other core counts too, and 1 keeps it from
stalling when other jobs share the cores (docs/performance.md, "`nice` across sessions").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads, then restore the previous setting; 0 leaves the setting as it
    is (a run's ``server_threads`` default: PyTorch's own)."""
    old = torch.get_num_threads()
    change = n > 0 and n != old
    if change:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(old)
