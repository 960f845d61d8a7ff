"""How far each condensation inner loop is from the machine's limit (issue 45): FLOPs, seconds, fraction of peak.

For one step of each inner loop, at the scale the issue measured:

- ``dm``: distribution matching (DM, FedDM and FedAF's loop): Fashion-MNIST's shape (1x28x28), 10 classes,
  ipc 1, 256 real images a class, the DC/DM ConvNet (width 128, depth 3, instance norm), a fresh random
  network each step (``random_model_sampler``);
- ``dm_bn``: the same with batch normalisation (FedAF's ConvNet-BN), in each of the ``bn_statistics`` readings
  the code offers (one row each; at a commit without the option, one row of what it does);
- ``dc``: gradient matching (FedDC's Algorithm 1, ``--method dc``): the same shape and network, ipc 1, real
  batch 256 a class, per-class batches, cosine distance;
- ``kip``: HFLDD's KIP step (NTK kernel, 10 images a class, 256 real targets);
- ``sgd``: one local SGD step of workload W (McMahan et al.'s CNN, batch 32, Fashion-MNIST's shape).

Each row gives the FLOPs a step must do (``torch.utils.flop_counter.FlopCounterMode``: matrix products and
convolutions, forward and backward), the seconds a step takes (the median of ``--steps`` steps after one
warm-up; on a CPU the process's CPU seconds, one thread), the FLOP/s that makes, and its fraction of the
device's measured peak (the FLOP/s of a 2048 x 2048
float32 matrix product on the same device and threads; float64 for KIP, whose kernels are float64).

``--memory`` also runs ``fedskew condense --dataset fashion_mnist --method dm --ipc 1 --iterations 20
--eval-epochs 20`` as a child process and prints its peak resident memory (``ru_maxrss`` of the children);
it needs the Fashion-MNIST files (``FEDSKEW_DATA`` or ``--data-dir``).

The process keeps freed memory (:func:`fedskew.core.allocator.keep_freed_memory`), as fedskew's run and
condense processes do. The images are the real Fashion-MNIST training images when ``FEDSKEW_DATA`` (or
``--data-dir``) holds them, else standard normal noise of the same shape (what a step costs does not
depend on the pixel values).
The last line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/inner_loops.py --threads 1           # CPU, ~3-6 min
    FEDSKEW_DATA=../shared/datasets python benchmarks/inner_loops.py --memory --loops dm   # + the condense command
    python benchmarks/inner_loops.py --device cuda --steps 20                              # a GPU
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedskew.condense.distribution_matching import DMConfig, distribution_matching
from fedskew.condense.gradient_matching import GMConfig, gradient_matching
from fedskew.condense.kip import KIPConfig, kip
from fedskew.condense.samplers import random_model_sampler
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import tf32_matmul
from fedskew.models import create_model

LOOPS = ("dm", "dm_bn", "dc", "kip", "sgd")


dm_module = importlib.import_module("fedskew.condense.distribution_matching")

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None, reps: int = 5) -> float:
    """FLOP/s of an ``n x n`` matrix product in ``dtype`` on ``device`` (the best of ``reps``); ``n`` 2048 on a CPU,
    8192 on a GPU (a 2048 product is too short to keep a large GPU busy)."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t = _clock(device)
        a @ b
        _sync(device)
        best = min(best, _clock(device) - t)
    return 2 * n**3 / best


def images(args: argparse.Namespace, per_class: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` images of each of the 10 classes: Fashion-MNIST's first ones when its files are there."""
    data_dir = args.data_dir or os.environ.get("FEDSKEW_DATA")
    if data_dir:
        from fedskew.data.sources.base import load_dataset

        ds = load_dataset("fashion_mnist", data_dir)
        rows = [int(i) for c in range(10) for i in (ds.y_train == c).nonzero()[0][:per_class]]
        import numpy as np

        x, y = ds.to_tensors("train", np.asarray(rows))
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(10 * per_class, 1, 28, 28, generator=g)
        y = torch.arange(10).repeat_interleave(per_class)
    return x.to(device), y.to(device)


def convnet(norm: str) -> Callable[[], torch.nn.Module]:
    return lambda: create_model("convnet", in_channels=1, num_classes=10, image_size=28, net_norm=norm)


def dm_step(args: argparse.Namespace, device: torch.device, norm: str, reading: str | None) -> Callable[[int], Any]:
    x, y = images(args, 256, device)
    options = {} if reading is None else {"bn_statistics": reading}

    def run(steps: int) -> Any:
        cfg = DMConfig(iterations=steps, ipc=1, real_batch=256, **options)
        return distribution_matching(x, y, random_model_sampler(convnet(norm)), cfg, torch.Generator().manual_seed(0))

    return run


def dc_step(args: argparse.Namespace, device: torch.device) -> Callable[[int], Any]:
    x, y = images(args, 256, device)

    def run(steps: int) -> Any:
        cfg = GMConfig(iterations=steps, ipc=1, real_batch=256)
        return gradient_matching(x, y, convnet("instancenorm"), cfg, torch.Generator().manual_seed(0))

    return run


def kip_step(args: argparse.Namespace, device: torch.device) -> Callable[[int], Any]:
    x, y = images(args, 256, device)

    def run(steps: int) -> Any:
        cfg = KIPConfig(iterations=steps, ipc=10, target_batch=256)
        return kip(x, y, 10, cfg, torch.Generator().manual_seed(0))

    return run


def sgd_step(args: argparse.Namespace, device: torch.device) -> Callable[[int], Any]:
    x, y = images(args, 32, device)
    torch.manual_seed(0)
    model = create_model("fedavg_cnn", in_channels=1, num_classes=10, image_size=28).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(steps: int) -> Any:
        for i in range(steps):
            rows = torch.arange(32, device=device) * 10 % x.shape[0] + i % 10
            opt.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()

    return run


def _clock(device: torch.device) -> float:
    """CPU seconds of this process on a CPU (one thread: the step's compute, less disturbed by other jobs on a
    shared machine than wall time), else wall seconds."""
    return time.process_time() if device.type == "cpu" else time.perf_counter()


def measure(run: Callable[[int], Any], steps: int, device: torch.device) -> tuple[float, float]:
    """(FLOPs of one step, median seconds a step). A loop's fixed cost (its start set, its optimiser) is taken
    out by timing ``run(1)`` and ``run(2)`` and keeping the difference."""
    with FlopCounterMode(display=False) as counter:
        run(2)
    two = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        run(1)
    flops = two - counter.get_total_flops()
    run(1)  # warm-up
    times = []
    for _ in range(steps):
        _sync(device)
        t = _clock(device)
        run(1)
        _sync(device)
        one = _clock(device) - t
        t = _clock(device)
        run(2)
        _sync(device)
        times.append(max(_clock(device) - t - one, 1e-9))
    return float(flops), statistics.median(times)


def condense_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Peak resident memory of ``fedskew condense --method dm --ipc 1 --iterations 20`` (a child process)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(Path(sys.executable).with_name("fedskew")), "condense", "--dataset", "fashion_mnist",
               "--method", "dm", "--ipc", "1", "--iterations", "20", "--eval-epochs", "20", "--out", out]
        if args.data_dir:
            cmd += ["--data-dir", args.data_dir]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"fedskew condense failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
    return {"command": " ".join(cmd[1:]), "seconds": round(seconds, 1), "peak_rss_gib": round(peak, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on a CPU (default 1, as a worker runs)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps a loop (median; default 3)")
    ap.add_argument("--loops", default=",".join(LOOPS), help=f"comma-separated subset of {', '.join(LOOPS)}")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--real-chunk", type=int, default=None,
                    help="real images a no-graph forward pass on a CPU (distribution_matching.REAL_CHUNK)")
    ap.add_argument("--memory", action="store_true", help="also the peak memory of `fedskew condense --method dm`")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    keep_freed_memory()  # as fedskew's run and condense processes do (a DM step on a CPU: 6.4 CPU-s without, 3.6 with)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.real_chunk is not None:
        dm_module.REAL_CHUNK = args.real_chunk
    loops = [name.strip() for name in args.loops.split(",") if name.strip()]
    unknown = sorted(set(loops) - set(LOOPS))
    if unknown:
        ap.error(f"--loops: unknown {', '.join(unknown)}; allowed: {', '.join(LOOPS)}")
    peak32 = peak_flops(device)
    peak_tf32 = None
    if device.type == "cuda":  # what TF32 gives a matrix product (cuDNN's convolutions use TF32 by default)
        with tf32_matmul(True):  # fedskew's switch (torch >= 2.9 refuses mixing its two APIs)
            peak_tf32 = peak_flops(device)
    peak64 = peak_flops(device, torch.float64) if "kip" in loops else 0.0
    readings = getattr(dm_module, "BN_STATISTICS", (None,))
    with_option = "bn_statistics" in inspect.signature(DMConfig).parameters
    cases: list[tuple[str, Callable[[int], Any], float]] = []
    for name in loops:
        if name == "dm":
            cases.append(("dm (instance norm)", dm_step(args, device, "instancenorm", None), peak32))
        elif name == "dm_bn":
            for reading in readings if with_option else (None,):
                label = f"dm (batch norm, {reading or 'as built'})"
                cases.append((label, dm_step(args, device, "batchnorm", reading), peak32))
        elif name == "dc":
            cases.append(("dc (instance norm)", dc_step(args, device), peak32))
        elif name == "kip":
            cases.append(("kip (ntk, float64)", kip_step(args, device), peak64))
        else:
            cases.append(("sgd (W's local step)", sgd_step(args, device), peak32))
    print(f"device {device} ({platform.processor() or platform.machine()}), threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}; peak {peak32 / 1e9:.1f} GFLOP/s float32"
          + (f", {peak64 / 1e9:.1f} float64" if peak64 else ""))
    print(f"{'loop':34s} {'GFLOP a step':>12s} {'s a step':>9s} {'GFLOP/s':>8s} {'of peak':>8s}")
    rows = []
    for label, run, peak in cases:
        flops, seconds = measure(run, args.steps, device)
        rate = flops / seconds
        rows.append({"loop": label, "gflop": round(flops / 1e9, 3), "seconds": round(seconds, 4),
                     "gflops": round(rate / 1e9, 2), "of_peak": round(rate / peak, 3)})
        print(f"{label:34s} {flops / 1e9:12.2f} {seconds:9.3f} {rate / 1e9:8.1f} {rate / peak:8.1%}", flush=True)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak resident memory of this process: {peak_rss:.0f} MB (real chunk {dm_module.REAL_CHUNK})")
    result: dict[str, Any] = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                              "peak_gflops_f32": round(peak32 / 1e9, 1),
                              **({"peak_gflops_tf32": round(peak_tf32 / 1e9, 1)} if peak_tf32 else {}), "rows": rows,
                              "real_chunk": dm_module.REAL_CHUNK, "peak_rss_mb": round(peak_rss)}
    if args.memory:
        result["condense_dm"] = condense_memory(args)
        print(f"fedskew condense --method dm --ipc 1 --iterations 20: {result['condense_dm']['seconds']} s, "
              f"peak resident memory {result['condense_dm']['peak_rss_gib']} GiB")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
