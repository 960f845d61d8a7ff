"""Thread-count control.

PyTorch's CPU kernels give bit-different results for different intra-op thread counts, so every unit
of client work and every evaluation chunk runs on exactly one thread, whichever process runs it. This
is what makes metrics byte-identical for any number of workers. The server's own work in the main process
(the condensation methods' training on the condensed sets) takes the run's ``server_threads`` (0: PyTorch's
default, every core): a fixed count gives its results on machines with other core counts too, and 1 keeps it from
stalling when other jobs share the cores (docs/performance.md, "`nice` across sessions").
"""

from __future__ import annotations

import contextlib
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


def server_threads(n: int) -> contextlib.AbstractContextManager[None]:
    """The block with ``n`` intra-op threads, or with the process's own setting when ``n`` is 0 (a run's
    ``server_threads``: the server's work in the main process; client work sets its own one thread inside)."""
    return num_threads(n) if n > 0 else contextlib.nullcontext()
