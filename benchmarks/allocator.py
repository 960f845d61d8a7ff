"""What keeping freed memory in the process (fedskew.core.allocator) buys, per training step.

    python benchmarks/allocator.py

Runs the same single-thread training steps in fresh child processes (three of each, alternating,
the fastest kept), one kind with
``FEDSKEW_KEEP_FREED_MEMORY=0`` (glibc's defaults: large blocks are mmap-ed and returned on free) and
one with the tuning fedskew applies, and prints for each workload the CPU seconds a step
(``time.process_time``: user + system, the page faults' kernel time included), the minor page faults
a step and the child's peak resident memory. Workloads: the width-32 batch-normalised ConvNet of the
FedAF/FedDM quick configs at batch 256 (the server's epoch on a synthetic set) on 28x28x1 and
32x32x3 images, and McMahan et al.'s CNN at batch 64 (a FedAvg client step). The last line is a
JSON object.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

WORKLOADS = {
    "convnet w32 bs256 28x28x1": ("convnet", 1, 28, 256),
    "convnet w32 bs256 32x32x3": ("convnet", 3, 32, 256),
    "fedavg_cnn bs64 28x28x1": ("fedavg_cnn", 1, 28, 64),
}


def child(steps: int = 12, warmup: int = 3) -> dict[str, dict[str, float]]:
    import torch
    import torch.nn.functional as F

    from fedskew.core.allocator import keep_freed_memory
    from fedskew.models import create_model
    from fedskew.models.layout import as_model_format, use_channels_last

    applied = keep_freed_memory()
    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    for label, (name, ch, side, batch) in WORKLOADS.items():
        torch.manual_seed(0)
        opts = {"net_width": 32, "net_norm": "batchnorm"} if name == "convnet" else {}
        m = use_channels_last(create_model(name, in_channels=ch, num_classes=10, image_size=side, **opts))
        x = as_model_format(torch.randn(batch, ch, side, side), True)
        y = torch.randint(0, 10, (batch,))
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

        for i in range(warmup + steps):
            if i == warmup:
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t, wall = time.process_time(), time.perf_counter()
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        out[label] = {
            "cpu_s_per_step": (time.process_time() - t) / steps,
            "wall_s_per_step": (time.perf_counter() - wall) / steps,
            "faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps,
        }
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"_": {"applied": float(applied), "peak_rss_mb": peak}, **out}


def main(rounds: int = 3) -> None:
    """Alternate the two settings ``rounds`` times and keep each workload's fastest child."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    for _ in range(rounds):
        for setting, env in (("glibc default", "0"), ("keep freed memory", "1")):
            proc = subprocess.run(
                [sys.executable, __file__, "--child"], env=dict(os.environ, FEDSKEW_KEEP_FREED_MEMORY=env),
                capture_output=True, text=True, check=True,
            )
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            best = results.setdefault(setting, got)
            for label in WORKLOADS:
                if got[label]["cpu_s_per_step"] < best[label]["cpu_s_per_step"]:
                    best[label] = got[label]
    base, tuned = results["glibc default"], results["keep freed memory"]
    print(f"{'workload':28s} {'CPU s/step':>22s} {'page faults/step':>22s} {'speed-up':>9s}")
    print(f"{'':28s} {'default':>10s} {'tuned':>11s} {'default':>10s} {'tuned':>11s}")
    for label in WORKLOADS:
        b, t = base[label], tuned[label]
        print(f"{label:28s} {b['cpu_s_per_step']:10.3f} {t['cpu_s_per_step']:11.3f} "
              f"{b['faults_per_step']:10.0f} {t['faults_per_step']:11.0f} "
              f"{b['cpu_s_per_step'] / t['cpu_s_per_step']:8.2f}x")
    print(f"peak resident memory: {base['_']['peak_rss_mb']:.0f} MB default, {tuned['_']['peak_rss_mb']:.0f} MB tuned "
          f"(tuning applied: {bool(tuned['_']['applied'])})")
    print(json.dumps(results))


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(child()))
    else:
        main()
