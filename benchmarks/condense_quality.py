"""Condensed-set quality (issue 4): do DC, DM and KIP beat random real images of the same size?

For each dataset, ipc and seed, every method condenses the training split into ``ipc`` images per
class, the set is quantised to 8-bit pixels, and a freshly initialised ConvNet is trained on it alone
with DC's evaluation protocol (SGD momentum 0.9, lr 0.01 halved half-way, weight decay 5e-4, batch
256, 300 epochs, no augmentation; ``--eval-dsa`` adds DSA's, as DSA and DM evaluate) and tested on
the full real test set. ``random`` is a random real subset of the same size, scored the same way.
For a given seed every method starts from exactly that subset (see :mod:`fedskew.cli.condensation`), so
a gain over ``random`` is the condensation's own.

Prints a Markdown table (mean ± std test accuracy over the seeds, in percent, per dataset x ipc x
method, beside the published figures), the seconds per condensation iteration of each method at
ipc 10 (wall clock and CPU), and, as its last line, one JSON object with every run.

    FEDSKEW_DATA=../shared/datasets .venv/bin/python benchmarks/condense_quality.py

Scaling to a 2-core CPU (the published runs used GPUs at full scale). Measured here on one thread,
with other jobs loading the machine (wall clock about 1.5x CPU time), Fashion-MNIST, ipc 10:

- The ConvNet at its published width 128 costs 2.9 s of CPU per 1,000 test images, 0.63 s per
  ipc-10 training epoch and 4.1 s (DM) / 5.8 s (DC) per condensation step even with 64 real images
  per class: scoring one set would take about 4 CPU minutes and leave no time to condense. So the
  same ConvNet (depth 3, instance norm, average pooling) runs at width 32 for condensation and
  evaluation (``--net-width``): 0.54 s per 1,000 test images, 0.09 s per training epoch.
- 64 real images per class per matching step instead of 256 (``--real-batch``).
- DC matches on one freshly drawn network per iteration without DC's inner network training
  (FedDC's simplification; ``--dc-outer-loop``/``--dc-inner-loop`` restore DC's schedule), with an
  image learning rate of 0.1 x ipc: each image's share of the synthetic gradient is 1/ipc, which DC
  offsets with its ipc-sized outer loop and we, with 10x fewer updates, with the step size.
- Iterations, with the measured CPU (wall) seconds per iteration at width 32:
  DC 100 network draws (FMNIST 0.58 / 0.84 s CPU at ipc 1 / 10, 1.28 s wall at ipc 10; CIFAR-10
  0.69 / 0.79 s CPU, 1.21 s wall), DM 100 steps (FMNIST 0.69 / 0.77 s CPU, 1.12 s wall; CIFAR-10
  0.87 s CPU, 1.29 s wall at ipc 10), KIP 2000 steps with the FC NTK (FMNIST 0.004 / 0.009 s CPU,
  0.014 s wall; CIFAR-10 0.017 s CPU, 0.026 s wall at ipc 10); published: DC 1000 x outer loop,
  DM 20,000, KIP thousands and more.

Estimated full run (2 datasets x ipc {1, 10} x 3 seeds x 4 methods, one thread): about 48 CPU
minutes, 75 minutes wall at the load measured here (condensation 50 min of it: DC 22, DM 23, KIP 5;
scoring the 48 sets 23 min).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from typing import Any, NamedTuple

import torch

from fedskew.cli.condensation import METHODS, MethodSettings, condense_set, dsa_config
from fedskew.condense import ModelFactory, SyntheticSet
from fedskew.condense.evaluate import EvalConfig, evaluate_synthetic
from fedskew.core.seeding import torch_generator
from fedskew.data import ArrayDataset, load_dataset
from fedskew.models import create_model

DC_ITERS, DM_ITERS, KIP_ITERS = 100, 100, 2000
DC_IMAGE_LR = 0.1
REAL_BATCH = 64
NET_WIDTH = 32
EVAL_EPOCHS = 300

NAMES = {"fashion_mnist": "Fashion-MNIST", "cifar10_jpeg": "CIFAR-10 (JPEG)", "digits": "digits"}
PUBLISHED = {
    ("fashion_mnist", 1): "DC 70.5",
    ("fashion_mnist", 10): "DC 82.3",
    ("cifar10_jpeg", 1): "DC 28.3",
    ("cifar10_jpeg", 10): "DC 44.9, DSA 52.1, DM 48.9",
}
"""Published accuracies (%) with the width-128 ConvNet and full iteration counts: DC (Zhao, Mopuri &
Bilen, ICLR 2021, Table 1), DSA (Zhao & Bilen, ICML 2021), DM (Zhao & Bilen, WACV 2023); on the
original CIFAR-10, not its JPEG copy."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["fashion_mnist", "cifar10_jpeg"])
    p.add_argument("--ipc", nargs="+", type=int, default=[1, 10])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["dc", "dm", "kip", "random"])
    p.add_argument("--dc-iterations", type=int, default=DC_ITERS, help=f"DC network draws (default {DC_ITERS})")
    p.add_argument("--dm-iterations", type=int, default=DM_ITERS, help=f"DM steps (default {DM_ITERS})")
    p.add_argument("--kip-iterations", type=int, default=KIP_ITERS, help=f"KIP steps (default {KIP_ITERS})")
    p.add_argument("--dc-outer-loop", type=int, default=1, help="DC matching steps per network (default 1)")
    p.add_argument("--dc-inner-loop", type=int, default=0, help="DC network steps between them (default 0)")
    p.add_argument("--dc-image-lr", type=float, help="DC image learning rate (default 0.1 x ipc)")
    p.add_argument("--real-batch", type=int, default=REAL_BATCH, help=f"real images per class per step ({REAL_BATCH})")
    p.add_argument("--kip-kernel", default="ntk", help="ntk or rf_convnet (default ntk)")
    p.add_argument("--net-width", type=int, default=NET_WIDTH, help=f"ConvNet width (default {NET_WIDTH})")
    p.add_argument("--eval-epochs", type=int, default=EVAL_EPOCHS, help=f"evaluation epochs ({EVAL_EPOCHS})")
    p.add_argument("--eval-dsa", action="store_true", help="DSA augmentation in the evaluation training")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--data-dir", help="dataset folder (default $FEDSKEW_DATA)")
    return p.parse_args(argv)


class Data(NamedTuple):
    """A dataset's normalised tensors and the ConvNet factory for it."""

    ds: ArrayDataset
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    factory: ModelFactory


def run_one(data: Data, method: str, ipc: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Condense, quantise and score one set; returns its accuracy and timings."""
    ds, x, y, x_test, y_test, factory = data
    iterations = {"dc": args.dc_iterations, "dm": args.dm_iterations, "kip": args.kip_iterations}.get(method, 0)
    settings = MethodSettings(
        iterations=iterations,
        image_lr=(DC_IMAGE_LR * ipc if args.dc_image_lr is None else args.dc_image_lr) if method == "dc" else None,
        real_batch=args.real_batch,
        outer_loop=args.dc_outer_loop,
        inner_loop=args.dc_inner_loop,
        kernel=args.kip_kernel,
        rf_width=args.net_width,
    )
    augment = dsa_config(ds.name)
    wall, cpu = time.perf_counter(), time.process_time()
    syn = condense_set(method, x, y, ds.num_classes, ipc, factory, settings, torch_generator(seed, "condense"), augment)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stored = SyntheticSet.from_uint8(syn.to_uint8(ds.mean, ds.std), ds.mean, ds.std)
    cfg = EvalConfig(epochs=args.eval_epochs, dsa=augment if args.eval_dsa else None)
    eval_wall = time.perf_counter()
    accuracy = evaluate_synthetic(stored, x_test, y_test, factory, cfg, torch_generator(seed, "evaluate"))
    return {
        "dataset": ds.name,
        "method": method,
        "ipc": ipc,
        "seed": seed,
        "iterations": iterations,
        "accuracy": accuracy,
        "seconds": wall,
        "seconds_per_step": wall / iterations if iterations else None,
        "cpu_seconds_per_step": cpu / iterations if iterations else None,
        "eval_seconds": time.perf_counter() - eval_wall,
    }


def _cell(runs: list[dict[str, Any]]) -> str:
    acc = [100.0 * r["accuracy"] for r in runs]
    if not acc:
        return "—"
    spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
    return f"{statistics.mean(acc):.1f} ± {spread:.1f}"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Markdown table: one row per dataset x ipc, one column per method, then the published figures."""
    methods = [m for m in ("random", "dc", "dm", "kip") if m in args.methods]
    lines = [
        "| dataset | ipc | " + " | ".join(m.upper() if m != "random" else "random real" for m in methods)
        + " | beat random | published (full scale) |",
        "|---" * (len(methods) + 4) + "|",
    ]
    for name in args.datasets:
        for ipc in args.ipc:
            cells, means = [], {}
            for m in methods:
                runs = [r for r in results if r["dataset"] == name and r["ipc"] == ipc and r["method"] == m]
                cells.append(_cell(runs))
                if runs:
                    means[m] = statistics.mean(r["accuracy"] for r in runs)
            beat = [m.upper() for m in methods if m != "random" and "random" in means and m in means
                    and means[m] > means["random"]]
            verdict = (", ".join(beat) or "none") if "random" in means else "—"
            published = PUBLISHED.get((name, ipc), "—")
            lines.append(f"| {NAMES.get(name, name)} | {ipc} | " + " | ".join(cells) + f" | {verdict} | {published} |")
    return "\n".join(lines)


def step_times(results: list[dict[str, Any]], ipc: int) -> list[str]:
    """Seconds per condensation iteration at ``ipc``, per dataset and method (median over seeds)."""
    out = []
    for name in dict.fromkeys(r["dataset"] for r in results):
        for m in ("dc", "dm", "kip"):
            runs = [r for r in results if r["dataset"] == name and r["ipc"] == ipc and r["method"] == m
                    and r["seconds_per_step"] is not None]
            if runs:
                wall = statistics.median(r["seconds_per_step"] for r in runs)
                cpu = statistics.median(r["cpu_seconds_per_step"] for r in runs)
                out.append(f"{NAMES.get(name, name)} {m.upper()} ipc {ipc}: {wall:.3f} s per iteration "
                           f"({cpu:.3f} s CPU)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        sys.exit(f"condense_quality.py: unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    torch.set_num_threads(args.threads)
    results = []
    start = time.perf_counter()
    for name in args.datasets:
        ds = load_dataset(name, args.data_dir)
        x, y = ds.to_tensors("train")
        x_test, y_test = ds.to_tensors("test")
        factory = partial(create_model, "convnet", in_channels=ds.in_channels, num_classes=ds.num_classes,
                          image_size=ds.image_size, net_width=args.net_width)
        data = Data(ds, x, y, x_test, y_test, factory)
        for ipc in args.ipc:
            for method in args.methods:
                for seed in args.seeds:
                    r = run_one(data, method, ipc, seed, args)
                    results.append(r)
                    print(f"{name} ipc {ipc} {method} seed {seed}: {100 * r['accuracy']:.2f}% "
                          f"(condense {r['seconds']:.1f} s, evaluate {r['eval_seconds']:.1f} s)",
                          file=sys.stderr, flush=True)
    total = time.perf_counter() - start
    print(table(results, args))
    ipc_steps = 10 if 10 in args.ipc else args.ipc[-1]
    print(f"\nSeconds per condensation iteration at ipc {ipc_steps} ({args.threads} thread(s)):")
    for line in step_times(results, ipc_steps):
        print(f"- {line}")
    print(f"\nTotal: {total / 60:.1f} min")
    print(json.dumps({"settings": vars(args), "total_seconds": total, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
