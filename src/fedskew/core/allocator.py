"""Keep freed memory in the process instead of returning it to the kernel (glibc on Linux).

glibc's ``malloc`` serves large blocks (a training step's activations: 25 MB for a width-32 ConvNet
on a batch of 256 Fashion-MNIST images) with ``mmap`` and gives them back with ``munmap`` when
PyTorch frees them, so the next step faults every page in again and the kernel zeroes it. On this
project's CPU machines that cost a third of a small ConvNet's training step (``benchmarks/
allocator.py``: ~50,000 page faults a step before, none after). :func:`keep_freed_memory` turns off
``mmap`` for allocations and the trimming of the heap's top, so freed blocks are reused. The
arithmetic is untouched (results are bit-identical); the price is that a process keeps its peak
heap until it exits (~130 MB more resident memory in that benchmark).

Set ``FEDSKEW_KEEP_FREED_MEMORY=0`` to leave the allocator alone (other libc, a memory-tight host).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

ENV_VAR = "FEDSKEW_KEEP_FREED_MEMORY"

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune this process's allocator once (see the module docstring); True if it took effect.

    A no-op returning False off Linux, without glibc, or with ``FEDSKEW_KEEP_FREED_MEMORY=0``.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; both must hold, or the tuning is only half there.
    _applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _INT_MAX))
    return _applied
