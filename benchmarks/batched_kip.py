"""Batched KIP against one client at a time (issue 34): aten operations of one KIP step and seconds of 10 steps.

HFLDD's distillation (NTK kernel, ``--ipc`` images a class, the class means with a little noise as the start)
of the round-1 clients of ``experiments/fedaf/fmnist_quick.toml`` (Fashion-MNIST 10%, 10 clients): one after
another (:func:`fedskew.condense.kip.kip`) and together (:mod:`fedskew.components.batched_kip`), with the CPU
seconds of 10 steps on a CPU (wall seconds on a GPU). KIP is the only condensation the batched runner runs
together; distribution matching (FedDM, FedAF) ran no faster batched than in worker processes on an H200 and
slower on a CPU, so it runs one client at a time in its job (docs/performance.md, "Batched condensation").

``--quick``: a synthetic stand-in (3 IID clients of 100 images, 2 images a class), the GPU check's dry run. The last
line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_kip.py                  # CPU, about 10 s
    python benchmarks/batched_kip.py --device cuda        # or: benchmarks/gpu_check.py --parts kip
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from condensation_round import QUICK, run_specs

DRY_RUN = {"dataset.name": "synthetic", "dataset.num_train": 3000, "dataset.num_test": 100, "dataset.image_size": 28,
           "dataset.channels": 1, "partition": {"name": "iid", "num_clients": 3}, "algorithm.clients_per_round": 3}
"""``--quick``'s overrides of the quick FedAF config: a synthetic stand-in of 3 IID clients of 100 images (every
class held, so their support sets and target batches are the same sizes and they step together)."""


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def kip_step_ops(spec: Any, args: argparse.Namespace, ipc: int = 10) -> dict[str, float]:
    """Aten operations of one KIP step (HFLDD's distillation: NTK kernel, ``ipc`` images a class, the class means
    with a little noise as the start) of the config's round-1 clients: one after another and batched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fedskew.components.batched_kip import kip_batched
    from fedskew.condense.kip import KIPConfig, kip, prepare_kip
    from fedskew.condense.synthetic import SyntheticSet, init_synthetic
    from fedskew.config.schema import typed_config
    from fedskew.engine.federation import build_federation

    config = typed_config(spec.config)
    fed = build_federation(config.dataset, config.partition, config.model, 0, args.data_dir)
    clients = list(range(int(spec.config["algorithm"]["clients_per_round"])))
    data = []
    for cid in clients:
        x, y = fed.client_data(cid)
        x, y = x.to(args.device), y.to(args.device)
        g = torch.Generator().manual_seed(cid)
        means = init_synthetic(x, y, sorted(set(y.tolist())), ipc, "mean", g, mean_samples=int(y.shape[0]))
        start = SyntheticSet(means.images + 0.1 * torch.randn(means.images.shape, generator=g).to(args.device),
                             means.labels)
        data.append((x, y, start))

    def count(fn: Any) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
            _sync(args.device)
        return sum(1 for e in prof.events() if e.name.startswith("aten::"))

    def run(iterations: int, together: bool) -> int:
        cfg = KIPConfig(iterations=iterations, ipc=ipc, target_batch=256)
        n = fed.info.num_classes
        if together:
            requests = [prepare_kip(x, y, n, cfg, torch.Generator().manual_seed(c), s)
                        for c, (x, y, s) in enumerate(data)]
            return count(lambda: kip_batched(requests))
        return count(lambda: [kip(x, y, n, cfg, torch.Generator().manual_seed(c), start=s)
                              for c, (x, y, s) in enumerate(data)])

    def distil(together: bool, iterations: int) -> None:
        """Every client's KIP for ``iterations`` steps, batched or one client after another."""
        cfg = KIPConfig(iterations=iterations, ipc=ipc, target_batch=256)
        n = fed.info.num_classes
        if together:
            kip_batched([prepare_kip(x, y, n, cfg, torch.Generator().manual_seed(c), s)
                         for c, (x, y, s) in enumerate(data)])
        else:
            for c, (x, y, s) in enumerate(data):
                kip(x, y, n, cfg, torch.Generator().manual_seed(c), start=s)

    def seconds(together: bool, iterations: int = 10) -> float:
        t0 = time.process_time() if args.device == "cpu" else time.perf_counter()
        distil(together, iterations)
        _sync(args.device)
        return round((time.process_time() if args.device == "cpu" else time.perf_counter()) - t0, 3)

    def flops(together: bool) -> float:
        """FLOPs of 2 steps (``FlopCounterMode``: the products; the solves it leaves out)."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            distil(together, 2)
        return float(counter.get_total_flops())

    run(1, False), run(1, True)  # warm-up
    return {"sequential": (run(3, False) - run(1, False)) / 2, "batched": (run(3, True) - run(1, True)) / 2,
            "flops_2_steps": {"sequential": flops(False), "batched": flops(True)},
            "clients": len(clients), "seconds_10_steps": {"sequential": seconds(False), "batched": seconds(True)},
            "seconds_kind": "CPU" if args.device == "cpu" else "wall"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ipc", type=int, default=10, help="images a class (default 10, HFLDD's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="a synthetic stand-in of 3 clients, 2 images a class (a dry "
                                                         "run; --ipc does not apply)")
    args = ap.parse_args(argv)
    if args.ipc < 1:
        ap.error(f"--ipc {args.ipc}: expected a positive number of images a class")
    if args.quick and args.ipc != 10:
        ap.error(f"--ipc {args.ipc} with --quick: the dry run uses 2 images a class; give one of them")
    import torch

    [spec] = run_specs(QUICK, ["FedDM"], {"seeds": [0], "device": args.device, **(DRY_RUN if args.quick else {})})
    ipc = 2 if args.quick else args.ipc
    out: dict[str, Any] = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda")
                           else None, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                           "load_before": [round(v, 2) for v in os.getloadavg()]}
    out["ipc"] = ipc
    out["kip_step_ops"] = ops = kip_step_ops(spec, args, ipc)
    print(f"KIP: aten ops of one step of {ops['clients']} clients: sequential {ops['sequential']:.0f}, "
          f"batched {ops['batched']:.0f}; 10 steps, {ops['seconds_kind']} s: {ops['seconds_10_steps']}; FLOPs of 2 "
          f"steps: {ops['flops_2_steps']}", flush=True)
    out["load_after"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
