"""Batched clients against the sequential runner on workload W (issue 34): aten operations and seconds a round.

Workload W as in benchmarks/simulation.py (Fashion-MNIST, 100 clients, Dirichlet alpha=0.1, FedAvg, 10
clients a round, 1 local epoch, batch 32, SGD lr 0.01, fedavg_cnn, test-set evaluation every round).
Runners: ``clients_in_parallel = 1`` (the sequential runner, ``workers`` processes) and ``= 10`` (the
round's clients batched, in this process); on a CPU also ``= 10`` with the layout the batched step uses
on a GPU (NCHW; on a CPU it feeds channels-last models channels-last batches, which is faster there).

1. Launch cost: each runner runs ``--profile-rounds`` rounds under ``torch.profiler``; the aten
   operations a round are counted, all of them and those of the clients' jobs alone (evaluation,
   aggregation and the reply checks are the rest). Each aten operation is one dispatch from Python and,
   on a GPU, about one kernel launch (counted too with ``--device cuda``).
2. Training alone: round 1's ten clients of W (their data, their batch orders), trained one after another
   with ``train_local`` and together with ``train_batched`` (both layouts of the layered forward, and
   ``torch.func.vmap`` over ``functional_call``, the forward of models the layered one does not know), one
   thread, CPU seconds, best of ``--reps`` (at least 3); also its aten operations (``--training-only`` stops here).
3. Speed: ``--reps`` runs of ``--rounds`` rounds per runner, the runners interleaved (A B A B), without
   the profiler: median seconds a round, and the final accuracy (the runners agree up to float rounding).

The last line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py               # CPU
    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py --workers 2   # sequential on 2 processes
    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py --training-only  # part 2 alone, ~30 s
    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulation import BATCH, CLIENTS, LR, PER_ROUND
from simulation import w_config as simulation_w_config


def w_config(rounds: int, width: int, device: str, workers: int) -> dict[str, Any]:
    """W with ``clients_in_parallel = width`` (its own process: one worker)."""
    return simulation_w_config(rounds, device, workers if width == 1 else 1, clients_in_parallel=width)


@contextlib.contextmanager
def layout(gpu_layout: bool) -> Iterator[None]:
    """The batched step's layout: the GPU's (NCHW) on every device, or as shipped."""
    from fedskew.components import batched

    before = set(batched.CHANNELS_LAST_DEVICES)
    if gpu_layout:
        batched.CHANNELS_LAST_DEVICES.clear()
    try:
        yield
    finally:
        batched.CHANNELS_LAST_DEVICES.clear()
        batched.CHANNELS_LAST_DEVICES.update(before)


@contextlib.contextmanager
def labelled_clients() -> Iterator[None]:
    """The clients' jobs of every runner inside a profiler range named ``fedskew_clients``."""
    from torch.profiler import record_function

    from fedskew.engine import round_loop

    make_runner = round_loop.make_runner

    def traced(*args: Any, **kwargs: Any) -> Any:
        runner = make_runner(*args, **kwargs)
        run_clients = runner.run_clients

        def labelled(jobs: Any) -> Any:
            with record_function("fedskew_clients"):
                return run_clients(jobs)

        runner.run_clients = labelled
        return runner

    round_loop.make_runner = traced
    try:
        yield
    finally:
        round_loop.make_runner = make_runner


def count_ops(runner: dict[str, Any], rounds: int, args: argparse.Namespace, fed: Any) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    from fedskew.config.schema import typed_config
    from fedskew.engine.round_loop import RoundLoop

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    cfg = w_config(rounds, runner["width"], args.device, args.workers)
    with (tempfile.TemporaryDirectory() as tmp, layout(runner["gpu_layout"]), labelled_clients(),
          profile(activities=activities) as prof):
        RoundLoop(typed_config(cfg), Path(tmp), data_dir=args.data_dir, progress=False, federation=fed).run()
    return round_counts(prof.events(), rounds)


def round_counts(events: Any, rounds: int) -> dict[str, float]:
    """Aten operations a round (all, and those inside ``labelled_clients``'s range) and CUDA kernels a round."""
    import torch

    aten = [e for e in events if e.name.startswith("aten::")]

    def in_clients(e: Any) -> bool:
        while e is not None:
            if e.name == "fedskew_clients":
                return True
            e = e.cpu_parent
        return False

    cuda = torch.autograd.DeviceType.CUDA
    kernels = sum(1 for e in events if getattr(e, "device_type", None) == cuda)
    return {"aten_ops_per_round": len(aten) / rounds,
            "client_aten_ops_per_round": sum(1 for e in aten if in_clients(e)) / rounds,
            "cuda_kernels_per_round": kernels / rounds}


def time_rounds(runner: dict[str, Any], args: argparse.Namespace, fed: Any) -> tuple[list[float], list[float], float]:
    """Wall seconds a round (timing.jsonl), this process's CPU seconds a round (workers=1 only), accuracy."""
    from fedskew.config.schema import typed_config
    from fedskew.engine.round_loop import RoundLoop

    cfg = w_config(args.rounds, runner["width"], args.device, args.workers)
    marks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, layout(runner["gpu_layout"]):
        loop = RoundLoop(typed_config(cfg), Path(tmp), data_dir=args.data_dir, progress=False, federation=fed,
                         on_round=lambda record: marks.append(time.process_time()))
        marks.append(time.process_time())
        result = loop.run()
        seconds = [json.loads(line)["seconds"] for line in (Path(tmp) / "timing.jsonl").read_text().splitlines()]
    cpu = [b - a for a, b in itertools.pairwise(marks)]
    return seconds, cpu, float(result.records[-1]["accuracy"])


def train_only(fed: Any, device: str, reps: int) -> dict[str, dict[str, float]]:
    """CPU seconds to train round 1's clients of W: sequential, batched, batched in the GPU layout."""
    import torch

    from fedskew.components import batched
    from fedskew.components.batching import BatchRequest, draw_batches
    from fedskew.components.selection import uniform_sample
    from fedskew.components.trainer import LocalConfig, train_local
    from fedskew.core.seeding import numpy_rng, seeded_init, torch_generator
    from fedskew.core.threads import num_threads
    from fedskew.models.layout import use_channels_last

    cfg = LocalConfig(epochs=1, batch_size=BATCH, lr=LR)
    chosen = [int(c) for c in uniform_sample(CLIENTS, PER_ROUND, numpy_rng(0, "server", 1, "select"))]
    data = [tuple(t.to(device) for t in fed.client_data(c)) for c in chosen]
    start = use_channels_last(seeded_init(fed.info.model.build, 0, "init").to(device)).state_dict()

    def models() -> list[Any]:
        out = []
        for _ in chosen:
            m = use_channels_last(fed.info.model.build().to(device))
            m.load_state_dict(start)
            out.append(m)
        return out

    def sequential() -> None:
        for m, c, (x, y) in zip(models(), chosen, data, strict=True):
            train_local(m, x, y, cfg, torch_generator(0, "client", c, 1, "train"))

    def together(gpu_layout: bool, layered: bool = True) -> None:
        reqs = []
        for m, c, (x, y) in zip(models(), chosen, data, strict=True):
            batches = draw_batches(len(y), cfg, torch_generator(0, "client", c, 1, "train"))
            reqs.append(BatchRequest(m, x, y, cfg, batches, [], []))
        was, batched.USE_LAYERED = batched.USE_LAYERED, layered
        try:
            with layout(gpu_layout):
                batched.train_batched(reqs)
        finally:
            batched.USE_LAYERED = was
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    out = {}
    with num_threads(1):
        for name, run in (("sequential", sequential), ("batched", lambda: together(False)),
                          ("batched_gpu_layout", lambda: together(True)),
                          ("batched_vmap", lambda: together(True, layered=False))):
            run()  # warm-up
            with Counted() as counted:
                run()
            times = []
            for _ in range(reps):
                t0 = time.process_time() if device == "cpu" else time.perf_counter()
                run()
                times.append((time.process_time() if device == "cpu" else time.perf_counter()) - t0)
            out[name] = {"seconds": min(times), "aten_ops": counted.ops}
    return out


class Counted:
    """Counts the aten operations dispatched inside the block (each one dispatch, on a GPU about one launch)."""

    def __enter__(self) -> Counted:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                counter.ops += 1
                return func(*args, **(kwargs or {}))

        self.ops = 0
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each timed run")
    ap.add_argument("--reps", type=int, default=2, help="timed runs per runner, interleaved")
    ap.add_argument("--profile-rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="worker processes of the sequential runner")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--training-only", action="store_true", help="only part 2: round 1's clients trained alone")
    args = ap.parse_args()
    from fedskew.config.schema import typed_config
    from fedskew.engine.federation import federation_for

    cfg = w_config(1, 1, args.device, 1)
    fed = federation_for(typed_config(cfg), args.data_dir)
    runners = [{"name": f"sequential (workers={args.workers})", "width": 1, "gpu_layout": False},
               {"name": f"batched ({PER_ROUND})", "width": PER_ROUND, "gpu_layout": False}]
    if args.device == "cpu":
        runners.append({"name": f"batched ({PER_ROUND}), NCHW as on a GPU", "width": PER_ROUND, "gpu_layout": True})
    counted = args.workers == 1 and not args.training_only  # the profiler sees this process only
    for r in runners:
        r["round_seconds"], r["round_cpu_seconds"], r["accuracy"] = [], [], []
        if not counted:
            continue
        r.update(count_ops(r, args.profile_rounds, args, fed))
        print(f"{r['name']}: {r['aten_ops_per_round']:.0f} aten ops a round "
              f"({r['client_aten_ops_per_round']:.0f} in the clients' jobs)", flush=True)
    training = train_only(fed, args.device, max(args.reps, 3))
    print("training round 1's clients alone, best of 3 (" + ("CPU" if args.device == "cpu" else "wall") + " s): "
          + ", ".join(f"{k} {v['seconds']:.2f}" for k, v in training.items()), flush=True)
    print("training round 1's clients alone, aten ops: "
          + ", ".join(f"{k} {v['aten_ops']}" for k, v in training.items()), flush=True)
    if args.training_only:
        print(json.dumps({"device": args.device, "training_only": training}))
        return
    for _ in range(args.reps):
        for r in runners:
            seconds, cpu, accuracy = time_rounds(r, args, fed)
            r["round_seconds"] += seconds
            r["round_cpu_seconds"] += cpu
            r["accuracy"].append(accuracy)
    base = runners[0]
    for r in runners:
        r["round_seconds_median"] = statistics.median(r["round_seconds"])
        r["round_cpu_seconds_median"] = statistics.median(r["round_cpu_seconds"])
        line = (f"{r['name']}: {r['round_seconds_median']:.2f} s/round (median of {len(r['round_seconds'])}; "
                f"this process's CPU {r['round_cpu_seconds_median']:.2f} s/round), accuracy {r['accuracy'][-1]:.4f}")
        if counted:
            r["aten_ratio"] = r["aten_ops_per_round"] / base["aten_ops_per_round"]
            r["client_aten_ratio"] = r["client_aten_ops_per_round"] / base["client_aten_ops_per_round"]
            line += (f"; aten ops {r['aten_ratio']:.3f} of the sequential runner's "
                     f"({r['client_aten_ratio']:.3f} in the clients' jobs)")
        print(line, flush=True)
    print(json.dumps({"device": args.device, "rounds": args.rounds, "runners": runners, "training_only": training}))


if __name__ == "__main__":
    main()
