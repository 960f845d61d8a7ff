"""fedskew.core.allocator: large blocks (a training step's activations) come from the heap and stay
in the process instead of being mapped and unmapped each time; the environment switch leaves the
allocator alone. The speed this buys is measured by benchmarks/allocator.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# mallinfo2().hblkhd: bytes glibc currently holds in mmap-ed blocks.
PROBE = """
import ctypes, json
import torch
from fedskew.core.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory()
before = libc.mallinfo2().hblkhd
t = torch.ones(16 * 1024 * 1024)  # 64 MB, an activation-sized block
mapped = libc.mallinfo2().hblkhd - before
del t
print(json.dumps({"applied": applied, "again": keep_freed_memory(), "mapped": mapped}))
"""


def _probe(env_value: str | None) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("FEDSKEW_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["FEDSKEW_KEEP_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
@pytest.mark.slow
def test_large_blocks_come_from_the_heap_unless_switched_off() -> None:
    tuned, default = _probe(None), _probe("0")
    assert tuned["applied"] is True and tuned["again"] is True  # applied once, then remembered
    assert default["applied"] is False and default["again"] is False
    # glibc's default serves a 64 MB block with mmap (and unmaps it on free: the page faults that
    # benchmarks/allocator.py counts); tuned, it comes from the heap and is reused.
    assert default["mapped"] == pytest.approx(64 * 2**20, rel=0.01)
    assert tuned["mapped"] == 0


def test_switch_off_is_case_insensitive() -> None:
    assert _probe("Off")["applied"] is False
