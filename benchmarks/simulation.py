"""Simulator speed: fedskew against a plain PyTorch loop and Flower's own simulation (issue 9).

Workload W: Fashion-MNIST, 100 clients, Dirichlet alpha=0.1 (partition seed 0), FedAvg, 10 clients per
round, 1 local epoch, batch 32, SGD lr 0.01, McMahan et al.'s CNN (conv 32-64, FC 512), test-set
evaluation after every round, 20 rounds.

Each engine runs in its own subprocess (so peak memory is its own: the parent samples the memory of
the whole process tree, workers and Ray daemons included, as the sum of RSS, which counts a shared
page once per process, and as the sum of PSS, which counts it once). Per engine: seconds per round
(median over the rounds of all repetitions), training images per second, final accuracy, peak memory.
The last line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/simulation.py            # all three engines
    FEDSKEW_DATA=../shared/datasets python benchmarks/simulation.py --skip-flower
    FEDSKEW_DATA=../shared/datasets python benchmarks/simulation.py --device cuda   # all three on a GPU

With ``--device cuda`` the plain loop keeps the data and model on the GPU, fedskew runs with
``device = "cuda"`` (one worker process per GPU), and Flower's clients ask Ray for a GPU share each
(``--flower-gpus-per-client``, default 0.1: ten clients at a time on one GPU).

Flower needs ``pip install "flwr[simulation]" psutil`` (Ray); psutil is needed for memory figures.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUNDS = 20
CLIENTS = 100
PER_ROUND = 10
BATCH = 32
LR = 0.01


# ---------------------------------------------------------------------------------------------------
# shared data
# ---------------------------------------------------------------------------------------------------
def load_federation(data_dir: str | None) -> tuple[Any, Any, list[Any], Any, Any]:
    """Normalised tensors: (x_train, y_train, client index arrays, x_test, y_test)."""
    import torch

    from fedskew.data import load_dataset
    from fedskew.data.partition import partition

    ds = load_dataset("fashion_mnist", data_dir)
    part = partition("dirichlet", ds.y_train, CLIENTS, 0, alpha=0.1)
    x, y = ds.to_tensors("train")
    xt, yt = ds.to_tensors("test")
    return x, y, [torch.from_numpy(ix) for ix in part.indices], xt, yt


def plain_model() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10),
    )


def plain_epoch(model: Any, cx: Any, cy: Any) -> None:
    """One epoch of plain SGD (lr 0.01, batch 32), as a researcher's loop and Flower's client run it."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    perm = torch.randperm(len(cy), device=cy.device)
    for s in range(0, len(cy), BATCH):
        b = perm[s : s + BATCH]
        loss = F.cross_entropy(model(cx[b]), cy[b])
        opt.zero_grad()
        loss.backward()
        opt.step()


# ---------------------------------------------------------------------------------------------------
# engines (each run in a subprocess by main())
# ---------------------------------------------------------------------------------------------------
def run_plain(data_dir: str | None, rounds: int, device: str = "cpu") -> dict[str, Any]:
    """A plain sequential loop, written the way a researcher would: default threads, no tricks."""
    import torch

    from fedskew.components.selection import uniform_sample
    from fedskew.core.seeding import numpy_rng

    x, y, parts, xt, yt = (t.to(device) if hasattr(t, "to") else [i.to(device) for i in t]
                           for t in load_federation(data_dir))
    torch.manual_seed(0)
    glob = plain_model().to(device)
    local = plain_model().to(device)
    times, images = [], []
    acc = 0.0
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        # The same clients fedskew samples in this round, so both train on the same images.
        chosen = uniform_sample(CLIENTS, PER_ROUND, numpy_rng(0, "server", rnd, "select"))
        states, weights, n_img = [], [], 0
        for c in chosen:
            idx = parts[int(c)]
            cx, cy = x[idx], y[idx]
            local.load_state_dict(glob.state_dict())
            plain_epoch(local, cx, cy)
            states.append({k: v.detach().clone() for k, v in local.state_dict().items()})
            weights.append(len(idx))
            n_img += len(idx)
        total = sum(weights)
        pairs = list(zip(states, weights, strict=True))
        glob.load_state_dict({k: sum(w / total * s[k] for s, w in pairs) for k in states[0]})
        correct = 0
        with torch.no_grad():
            glob.eval()
            for s in range(0, len(yt), 1000):
                correct += int((glob(xt[s:s + 1000]).argmax(1) == yt[s:s + 1000]).sum())
            glob.train()
        acc = correct / len(yt)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        images.append(n_img)
    return {"round_seconds": times, "images": images, "accuracy": acc}


def w_config(rounds: int, device: str, workers: int, **run: Any) -> dict[str, Any]:
    """Workload W as fedskew's config; ``run``: more top-level keys (``workers_per_device``, ...)."""
    return {
        "name": "bench", "label": "fedskew", "rounds": rounds, "seed": 0, "workers": workers,
        "eval_every": 1, "checkpoint_every": 0, "target_accuracy": None, "at_rounds": [],
        "dataset": {"name": "fashion_mnist"},
        "partition": {"name": "dirichlet", "num_clients": CLIENTS, "alpha": 0.1, "seed": 0},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg", "clients_per_round": PER_ROUND, "local_epochs": 1,
                      "batch_size": BATCH, "lr": LR},
        "faults": {}, "device": device, **run,
    }


def run_fedskew(
    data_dir: str | None, rounds: int, workers: int, device: str = "cpu", per_device: int = 1
) -> dict[str, Any]:
    from fedskew.config.schema import typed_config
    from fedskew.engine.round_loop import RoundLoop

    cfg = w_config(rounds, device, workers, workers_per_device=per_device)
    with tempfile.TemporaryDirectory() as tmp:
        res = RoundLoop(typed_config(cfg), Path(tmp), data_dir=data_dir, progress=False).run()
        timing = [json.loads(line)["seconds"] for line in (Path(tmp) / "timing.jsonl").read_text().splitlines()]
    return {
        "round_seconds": timing,
        "images": [r["samples"] for r in res.records],
        "accuracy": res.summary["final_accuracy"],
    }


def run_flower(data_dir: str | None, rounds: int, device: str = "cpu", gpus_per_client: float = 0.1) -> dict[str, Any]:
    """Flower's own simulation (Ray backend), FedAvg strategy, same model, data and evaluation."""
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    x, y, parts, xt, yt = load_federation(data_dir)
    marks: list[float] = []
    accs: list[float] = []
    sizes = [len(p) for p in parts]

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        model = plain_model().to(device)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        idx = parts[cid]
        plain_epoch(model, x[idx].to(device), y[idx].to(device))
        content = RecordDict({"arrays": ArrayRecord({k: v.cpu() for k, v in model.state_dict().items()}),
                              "metrics": MetricRecord({"num-examples": len(idx)})})
        return Message(content=content, reply_to=msg)

    server = ServerApp()

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        model = plain_model().to(device)
        model.load_state_dict(arrays.to_torch_state_dict())
        correct = 0
        with torch.no_grad():
            model.eval()
            for s in range(0, len(yt), 1000):
                xb, yb = xt[s:s + 1000].to(device), yt[s:s + 1000].to(device)
                correct += int((model(xb).argmax(1) == yb).sum())
        accs.append(correct / len(yt))
        marks.append(time.perf_counter())
        return MetricRecord({"accuracy": correct / len(yt)})

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(0)
        strategy = FedAvg(fraction_train=PER_ROUND / CLIENTS, fraction_evaluate=0.0,
                          min_train_nodes=PER_ROUND, min_available_nodes=CLIENTS)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(plain_model().state_dict()),
                       num_rounds=rounds, evaluate_fn=evaluate)

    run_simulation(server_app=server, client_app=client, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {
                       "num_cpus": 1, "num_gpus": gpus_per_client if device.startswith("cuda") else 0.0}})
    times = [b - a for a, b in itertools.pairwise(marks)]
    mean_images = PER_ROUND * sum(sizes) / CLIENTS  # Flower samples clients itself: expected images per round
    return {"round_seconds": times, "images": [mean_images] * len(times), "accuracy": accs[-1]}


# ---------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------
def _tree_memory(pid: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) over the process and its descendants, in bytes.

    The RSS sum counts a shared page once per process that maps it (the dataset in shared memory,
    the torch libraries), so it overstates a multi-process tree; PSS splits each shared page among
    the processes that map it, so its sum is the tree's real footprint. Both are reported.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = pss = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return rss, pss


def run_engine(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one engine in a subprocess, sampling the process tree's memory."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--child", engine, "--rounds", str(args.rounds), "--workers",
           str(args.workers), "--workers-per-device", str(args.workers_per_device), "--child-out", str(out),
           "--device", args.device,
           "--flower-gpus-per-client", str(args.flower_gpus_per_client)]
    proc = subprocess.Popen(cmd)
    peak = peak_pss = 0
    try:
        import psutil  # noqa: F401

        sample = True
    except ImportError:
        sample = False
    while proc.poll() is None:
        if sample:
            rss, pss = _tree_memory(proc.pid)
            peak, peak_pss = max(peak, rss), max(peak_pss, pss)
        time.sleep(0.2)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} failed with exit code {proc.returncode}")
    res: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    res["peak_mb"] = peak / 2**20 if sample else None
    res["peak_pss_mb"] = peak_pss / 2**20 if sample else None
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each engine")
    ap.add_argument("--workers", type=int, default=0, help="fedskew workers (0 = auto)")
    ap.add_argument("--workers-per-device", type=int, default=1, help="fedskew processes per GPU with --workers 0")
    ap.add_argument("--skip-flower", action="store_true", help="leave Flower out (quick checks)")
    ap.add_argument("--engines", nargs="+", default=None, help="subset of: plain fedskew flower")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (every engine computes there)")
    ap.add_argument("--flower-gpus-per-client", type=float, default=0.1, help="Flower clients' GPU share (Ray)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    data_dir = os.environ.get("FEDSKEW_DATA")

    if args.child:
        if args.child == "plain":
            res = run_plain(data_dir, args.rounds, args.device)
        elif args.child == "fedskew":
            res = run_fedskew(data_dir, args.rounds, args.workers, args.device, args.workers_per_device)
        else:
            res = run_flower(data_dir, args.rounds, args.device, args.flower_gpus_per_client)
        Path(args.child_out).write_text(json.dumps(res))
        return

    engines = args.engines or ["plain", "fedskew", *([] if args.skip_flower else ["flower"])]
    results: dict[str, dict[str, Any]] = {}
    for engine in engines:
        runs = [run_engine(engine, args) for _ in range(args.reps)]
        secs = [s for r in runs for s in r["round_seconds"]]
        imgs = [i for r in runs for i in r["images"]]
        results[engine] = {
            "s_round": statistics.median(secs),
            "first_round_s": statistics.median(r["round_seconds"][0] for r in runs),  # worker start-up shows here
            "images_per_s": sum(imgs) / sum(secs),
            "accuracy": statistics.mean(r["accuracy"] for r in runs),
            "peak_mb": max((r["peak_mb"] or 0.0) for r in runs),
            "peak_pss_mb": max((r["peak_pss_mb"] or 0.0) for r in runs),
        }
        print(f"{engine:8s} {results[engine]['s_round']:6.2f} s/round  {results[engine]['images_per_s']:7.0f} img/s  "
              f"acc {100 * results[engine]['accuracy']:5.2f}%  peak RSS {results[engine]['peak_mb']:6.0f} MB  "
              f"PSS {results[engine]['peak_pss_mb']:6.0f} MB", flush=True)

    print()
    print("| engine | s / round (median) | images / s | final accuracy | peak RSS sum (MB) | peak PSS sum (MB) |")
    print("|---|---|---|---|---|---|")
    for e, r in results.items():
        print(f"| {e} | {r['s_round']:.2f} | {r['images_per_s']:.0f} | {100 * r['accuracy']:.2f}% "
              f"| {r['peak_mb']:.0f} | {r['peak_pss_mb']:.0f} |")
    summary: dict[str, Any] = {}
    for e, r in results.items():
        summary[f"{e}_s_round"] = round(r["s_round"], 4)
        summary[f"{e}_first_round_s"] = round(r["first_round_s"], 4)
        summary[f"{e}_accuracy"] = round(r["accuracy"], 4)
        summary[f"{e}_peak_mb"] = round(r["peak_mb"], 1)
        summary[f"{e}_peak_pss_mb"] = round(r["peak_pss_mb"], 1)
        summary[f"{e}_images_per_s"] = round(r["images_per_s"], 1)
    if "plain" in results and "fedskew" in results:
        summary["fedskew_vs_plain"] = round(results["fedskew"]["s_round"] / results["plain"]["s_round"], 3)
    if "flower" in results and "fedskew" in results:
        summary["fedskew_vs_flower"] = round(results["fedskew"]["s_round"] / results["flower"]["s_round"], 3)
    summary["device"] = args.device
    print()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
