"""What a run ran on: the versions of fedskew, Python, PyTorch and NumPy, and the device's name.

A run folder's ``environment.json`` records them when the run starts, beside ``config.toml`` (the fully
resolved config), so a run record reproduces on its own: "the same config and seed give the same
``metrics.jsonl``" holds for the same versions. ``fedskew run --resume`` compares the record with what is
running and warns in one line when they differ (the run goes on: a resumed run's later rounds are computed
by the running versions).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedskew.core.files import write_atomic
from fedskew.runs import ENVIRONMENT_FILE

log = logging.getLogger("fedskew")


def device_name(device: torch.device) -> str:
    """The device's model: the GPU's name, or the CPU's model name (``/proc/cpuinfo``), else its architecture."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _version() -> str:
    """fedskew's installed version (the package's metadata: no import of the package's top)."""
    try:
        return importlib.metadata.version("fedskew")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def environment(device: torch.device) -> dict[str, Any]:
    """The versions and the device this process computes with."""
    return {
        "fedskew": _version(), "python": platform.python_version(), "torch": str(torch.__version__),
        "numpy": np.__version__, "device": device_name(device),
    }


def record_environment(run_dir: Path, device: torch.device, resume: bool) -> None:
    """Write ``environment.json`` for a run that starts; for one that resumes, warn in one line (and keep
    the record) when what runs now differs from what the run started with."""
    now = environment(device)
    path = Path(run_dir) / ENVIRONMENT_FILE
    if resume and path.is_file():
        try:
            then = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            then = None
        if isinstance(then, dict):
            differ = [f"{k} {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v]
            if differ:
                log.warning("fedskew: %s was started with other versions or another device (%s); its later rounds "
                            "may differ from an uninterrupted run's", run_dir, "; ".join(differ))
            return
    write_atomic(path, json.dumps(now, indent=2) + "\n", sync=False)
