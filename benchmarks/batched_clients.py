"""Batched clients against the sequential runner on workload W (issue 34): aten operations and seconds a round.

Workload W as in benchmarks/simulation.py (Fashion-MNIST, 100 clients, Dirichlet alpha=0.1, FedAvg, 10
clients a round, 1 local epoch, batch 32, SGD lr 0.01, fedavg_cnn, test-set evaluation every round).
For each runner (``clients_in_parallel = 1``, the sequential runner, and ``= 10``, the round's clients
batched) this runs ``--rounds`` rounds under ``torch.profiler`` and counts the aten operations a round,
all of them and those of the clients' jobs alone (the evaluation is the same for both), then times
``--rounds`` more rounds without the profiler. Aten operations stand in for kernel launches where there
is no GPU: each is one dispatch from Python and, on a GPU, about one launch.
The last line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py               # CPU, 3 rounds each
    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_clients.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulation import BATCH, CLIENTS, LR, PER_ROUND


def w_config(rounds: int, width: int | str, device: str) -> dict[str, Any]:
    return {
        "name": "bench", "label": "fedskew", "rounds": rounds, "seed": 0, "workers": 1,
        "eval_every": 1, "checkpoint_every": 0, "target_accuracy": None, "at_rounds": [],
        "dataset": {"name": "fashion_mnist"},
        "partition": {"name": "dirichlet", "num_clients": CLIENTS, "alpha": 0.1, "seed": 0},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg", "clients_per_round": PER_ROUND, "local_epochs": 1,
                      "batch_size": BATCH, "lr": LR},
        "faults": {}, "device": device, "clients_in_parallel": width,
    }


def measure(width: int | str, rounds: int, device: str, data_dir: str | None, fed: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from fedskew.engine import round_loop

    make_runner = round_loop.make_runner

    def traced_runner(*args: Any, **kwargs: Any) -> Any:  # the clients' jobs in a labelled profiler range
        runner = make_runner(*args, **kwargs)
        run_clients = runner.run_clients

        def labelled(jobs: Any) -> Any:
            with record_function("fedskew_clients"):
                return run_clients(jobs)

        runner.run_clients = labelled
        return runner

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with tempfile.TemporaryDirectory() as tmp:
        round_loop.make_runner = traced_runner
        try:
            with profile(activities=activities) as prof:
                round_loop.RoundLoop(w_config(rounds, width, device), Path(tmp) / "p", data_dir=data_dir,
                                     progress=False, federation=fed).run()
        finally:
            round_loop.make_runner = make_runner
        events = prof.events()
        aten = [e for e in events if e.name.startswith("aten::")]

        def in_clients(e: Any) -> bool:
            while e is not None:
                if e.name == "fedskew_clients":
                    return True
                e = e.cpu_parent
            return False

        clients = sum(1 for e in aten if in_clients(e))
        kernels = sum(1 for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
        t0 = time.perf_counter()
        round_loop.RoundLoop(w_config(rounds, width, device), Path(tmp) / "t", data_dir=data_dir,
                             progress=False, federation=fed).run()
        elapsed = time.perf_counter() - t0
        timing = [json.loads(line)["seconds"] for line in (Path(tmp) / "t" / "timing.jsonl").read_text().splitlines()]
    return {
        "clients_in_parallel": width, "aten_ops_per_round": len(aten) / rounds,
        "client_aten_ops_per_round": clients / rounds,
        "cuda_kernels_per_round": kernels / rounds if kernels else None,
        "round_seconds_median": statistics.median(timing), "round_seconds": timing, "wall_seconds": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    from fedskew.engine.federation import build_federation

    cfg = w_config(args.rounds, 1, args.device)
    fed = build_federation(cfg["dataset"], cfg["partition"], cfg["model"], 0, args.data_dir)
    out = {"device": args.device, "rounds": args.rounds, "runners": []}
    for width in (1, PER_ROUND):
        res = measure(width, args.rounds, args.device, args.data_dir, fed)
        out["runners"].append(res)
        print(f"clients_in_parallel={width}: {res['aten_ops_per_round']:.0f} aten ops a round "
              f"({res['client_aten_ops_per_round']:.0f} in the clients' jobs), "
              f"{res['round_seconds_median']:.2f} s/round", flush=True)
    seq, bat = out["runners"]
    out["aten_ratio"] = bat["aten_ops_per_round"] / seq["aten_ops_per_round"]
    out["client_aten_ratio"] = bat["client_aten_ops_per_round"] / seq["client_aten_ops_per_round"]
    print(f"batched / sequential: {out['aten_ratio']:.3f} of the aten ops a round "
          f"({out['client_aten_ratio']:.3f} in the clients' jobs)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
