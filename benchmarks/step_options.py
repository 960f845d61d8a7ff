"""Seconds a training step with and without the switches that cut its kernel launches (issue 34, point 3).

The step is workload W's (benchmarks/simulation.py): McMahan et al.'s CNN (``fedavg_cnn``, channels-last as
fedskew runs it), a batch of 32 Fashion-MNIST-sized images, SGD lr 0.01, run through fedskew's own
``train_local`` under each setting of ``Compute`` (the run keys ``sgd_impl``, ``compile``, ``tf32``, ``amp``).
Per variant: seconds a step (median of ``--reps`` interleaved repetitions of ``--steps`` steps, after a
warm-up that also compiles), images a second, operators a step (torch.profiler: aten operators, and on CUDA
kernel launches and memory copies), and the effect on results: the largest difference of any weight from
the plain step's after the same steps from the same start (0.0: bit for bit).

    python benchmarks/step_options.py                      # CPU, one thread: default, foreach, fused, compile
    python benchmarks/step_options.py --device cuda        # adds tf32, reduce-overhead, bf16 and combinations

The data are random (the step's cost does not depend on the pixels). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

CPU_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "foreach": {"sgd_impl": "foreach"},
    "fused": {"sgd_impl": "fused"},
    "compile": {"compile": "default"},
    "compile+fused": {"compile": "default", "sgd_impl": "fused"},
}
CUDA_VARIANTS: dict[str, dict[str, Any]] = {
    **CPU_VARIANTS,
    "tf32": {"tf32": True},
    "reduce-overhead": {"compile": "reduce-overhead"},
    "reduce-overhead+fused": {"compile": "reduce-overhead", "sgd_impl": "fused"},
    "bf16": {"amp": "bf16"},
    "bf16+reduce-overhead+fused": {"amp": "bf16", "compile": "reduce-overhead", "sgd_impl": "fused"},
}


def _setup(device: str, steps: int, batch: int) -> tuple[Any, Any, Any]:
    import torch

    from fedskew.algorithms.base import ModelSpec
    from fedskew.models.layout import use_channels_last

    g = torch.Generator().manual_seed(0)
    x = torch.randn((steps * batch, 1, 28, 28), generator=g).to(device)
    y = torch.randint(0, 10, (steps * batch,), generator=g).to(device)
    torch.manual_seed(0)
    model = use_channels_last(ModelSpec("fedavg_cnn", 1, 10, 28).build().to(device))
    return model, x, y


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _train(model: Any, x: Any, y: Any, compute: Any, steps: int, batch: int, seed: int = 0) -> Any:
    import torch

    from fedskew.components.trainer import LocalConfig, train_local
    from fedskew.core.device import use_compute

    with use_compute(compute):
        cfg = LocalConfig(epochs=1, batch_size=batch, lr=0.01, max_steps=steps)
        return train_local(model, x, y, cfg, torch.Generator().manual_seed(seed))


def operators_a_step(model: Any, x: Any, y: Any, compute: Any, batch: int, steps: int = 5) -> dict[str, float]:
    """aten operators, kernel launches and memory copies a step (torch.profiler over ``steps`` steps)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if compute.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        _train(model, x, y, compute, steps, batch)
        _sync(compute.device)
    return count_events(prof.events(), steps)


def count_events(events: Any, per: int) -> dict[str, float]:
    """aten operators, kernel launches (CUDA runtime and driver launch calls) and memory copies in profiler
    ``events``, divided by ``per``."""
    aten = launches = copies = 0
    for e in events:
        name = e.name
        if name.startswith("aten::"):
            aten += 1
        elif "LaunchKernel" in name or name in ("cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"):
            launches += 1
        elif name.startswith("cudaMemcpy"):
            copies += 1
    return {"aten_ops": aten / per, "kernel_launches": launches / per, "memcpy_calls": copies / per}


def measure(device: str, variants: dict[str, dict[str, Any]], steps: int, reps: int, batch: int) -> dict[str, Any]:
    """Every variant: s/step, images/s, operators a step, effect on the weights (see the module text)."""

    from fedskew.core.device import Compute

    computes = {name: Compute(device, **opts) for name, opts in variants.items()}
    out: dict[str, Any] = {}
    for name, compute in computes.items():  # warm-up (and compile) once per variant, errors recorded
        try:
            compute.check()
            model, x, y = _setup(device, steps, batch)
            t0 = time.perf_counter()
            _train(model, x, y, compute, steps, batch)
            _sync(device)
            out[name] = {"options": variants[name], "warmup_s": round(time.perf_counter() - t0, 2), "times": []}
        except Exception as e:  # a switch the machine cannot run (no compiler, no CUDA graphs ...)
            out[name] = {"options": variants[name], "error": f"{type(e).__name__}: {e}"[:300]}
    alive = [n for n in computes if "error" not in out[n]]
    for _ in range(reps):  # interleaved: A B C ... A B C
        for name in alive:
            model, x, y = _setup(device, steps, batch)
            _train(model, x, y, computes[name], 2, batch)  # this model's first steps (graphs, allocator)
            _sync(device)
            t0 = time.perf_counter()
            _train(model, x, y, computes[name], steps, batch, seed=1)
            _sync(device)
            out[name]["times"].append(time.perf_counter() - t0)
    reference = None
    for name in alive:
        model, x, y = _setup(device, steps, batch)
        _train(model, x, y, computes[name], steps, batch)
        weights = [p.detach().double().cpu() for p in model.parameters()]
        reference = reference or weights
        s_step = statistics.median(out[name].pop("times")) / steps
        out[name].update(
            s_step=round(s_step, 6), images_per_s=round(batch / s_step, 1),
            max_weight_diff=max(float((a - b).abs().max()) for a, b in zip(reference, weights, strict=True)),
            **{k: round(v, 1) for k, v in operators_a_step(model, x, y, computes[name], batch).items()},
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=100, help="steps a timed repetition (default 100)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as fedskew's tasks run)")
    ap.add_argument("--only", nargs="+", help="variant names (default: all for the device)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    variants = CUDA_VARIANTS if args.device.startswith("cuda") else CPU_VARIANTS
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    res = measure(args.device, variants, args.steps, args.reps, args.batch)
    for name, r in res.items():
        if "error" in r:
            print(f"{name:28s} failed: {r['error']}")
        else:
            print(f"{name:28s} {1000 * r['s_step']:8.3f} ms/step {r['images_per_s']:9.0f} img/s  "
                  f"aten {r['aten_ops']:6.1f}  launches {r['kernel_launches']:6.1f}  "
                  f"max |dw| {r['max_weight_diff']:.2e}  (warm-up {r['warmup_s']} s)", flush=True)
    summary = {"benchmark": "step_options", "device": args.device, "torch": torch.__version__,
               "threads": args.threads, "batch": args.batch, "steps": args.steps, "variants": res}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
