"""How many worker processes the local engine starts, and on which devices.

``workers = 0`` (auto) asks :func:`pool_size`: ``workers_per_device`` processes per device (a GPU, or one
usable CPU core), never more than the round's client jobs (more would idle), and never more than the
available memory holds at :data:`WORKER_BYTES` each. Every process runs each task on one intra-op thread
whatever the cores: PyTorch's CPU kernels give bit-different results for different thread counts, so
spare cores are not handed to the workers as threads (docs/performance.md, "Worker pool").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

WORKER_BYTES = 800 * 2**20
"""Memory one worker process takes (torch, the model, a client's activations; the federation is shared):
about 0.8 GB, measured as the resident memory of 16 workers of workload W (12.4 GB) on a 16-core box."""


def usable_cores() -> int:
    """CPU cores this process may use: its CPU affinity, capped by a cgroup (container) CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, quota) if quota is not None else cores)


def _cgroup_cpu_quota() -> int | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` limit, or None if unlimited."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return max(1, math.ceil(int(text[0]) / int(text[1])))
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return max(1, math.ceil(quota / period)) if quota > 0 else None
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes this process may still take: the kernel's ``MemAvailable``, capped by a cgroup (container)
    memory limit less what the cgroup uses; None where neither can be read (not Linux)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = Path(limit).read_text().strip()
            if cap != "max" and int(cap) < 2**60:  # v1 writes "no limit" as a huge number
                found.append(max(0, int(cap) - int(Path(used).read_text())))
            break
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def pool_size(devices: list[str], per_device: int, jobs: int | None, cores: int, memory: int | None) -> int:
    """Worker processes for ``workers = 0``: ``per_device`` per GPU of ``devices`` (on the CPU, per usable core
    of ``cores``; on MPS one), at most ``jobs`` (the round's client jobs, None: unknown) and at most what
    ``memory`` bytes hold at :data:`WORKER_BYTES` a worker (None: unknown); at least one."""
    if devices[0] == "mps":
        return 1
    n = (len(devices) if devices[0].startswith("cuda") else cores) * per_device
    if jobs is not None:
        n = min(n, jobs)
    if memory is not None:
        n = min(n, memory // WORKER_BYTES)
    return max(1, n)


def default_workers(devices: Sequence[str] = ("cpu",), jobs: int | None = None, per_device: int = 1) -> int:
    """:func:`pool_size` for the workers' ``devices`` (:attr:`~fedskew.core.device.Compute.workers`) on this
    machine: its usable cores and available memory."""
    return pool_size(list(devices), per_device, jobs, usable_cores(), available_memory())
