"""Speed of a FedDM and a FedAF round (issue "Accelerators and scale-out", points 1 and 7).

Quick scale (default): ``experiments/fedaf/fmnist_quick.toml`` (Fashion-MNIST 10%, 10 clients, all in
every round, ConvNet-BN width 32, ipc 10, 50 condensation steps with 32 real images per class, 50
server epochs), one seed, ``--rounds`` rounds (default 2: round 1 includes starting the worker pool,
and FedAF's CDC term only starts in round 2) of each method, each run through the real ``RoundLoop``.
Per round: wall seconds, of which the clients' exchange, the server's part (its training on the
condensed sets) and the evaluation; with ``workers = 1`` also the process's CPU seconds. The
``metrics.jsonl`` of each run is hashed (sha256), so two code versions can be checked for identical
results while being timed.

``--clients-only`` times just the clients' half, the part the condensation code decides: every
client's step at the configured number of steps, inline on one thread (as each worker runs a job),
wall and CPU seconds; FedAF's clients get global class logits, so their CDC term is on. This is the
figure least disturbed by other jobs on a shared machine (the server's training runs with torch's
default threads and slows down badly when the cores are oversubscribed).

Paper scale (``--paper``): ``experiments/fedaf/fmnist_paper.toml`` (all 60,000 images, width 128, ipc
50, 1000 steps with 256 real images per class, 500 server epochs). A CPU cannot run that round in a
benchmark, so by default it is estimated from a few steps: for every client, one client step with 0
and one with ``--steps`` condensation steps (the difference is the per-step cost, the rest the fixed
cost: FedAF's logits pass, the initialisation, the 8-bit upload), and ``--server-epochs`` epochs of
the server's training on a set of the round's size; the round's estimate is the clients' fixed costs
plus 1000 steps each, plus 500 server epochs (clients one after another, as ``workers = 1`` runs
them). FedAF's clients are timed with the CDC term on (as from round 2). ``--paper-full`` runs real
paper-scale rounds instead (a GPU's job).

    FEDSKEW_DATA=../shared/datasets python benchmarks/condensation_round.py
    FEDSKEW_DATA=../shared/datasets python benchmarks/condensation_round.py --only FedDM --rounds 1
    FEDSKEW_DATA=../shared/datasets python benchmarks/condensation_round.py --clients-only
    FEDSKEW_DATA=../shared/datasets python benchmarks/condensation_round.py --only FedDM --workers 1 --server-threads 1
    python benchmarks/condensation_round.py --paper --device cuda             # estimate on a GPU
    python benchmarks/condensation_round.py --paper --paper-full --device cuda --rounds 1

To compare two code versions on a shared machine, run them interleaved (A, B, A, B), e.g. with a
worktree of the old commit: ``PYTHONPATH=/tmp/old/src python benchmarks/condensation_round.py``.
The last line printed is one JSON object (device, load averages, per-run figures, hashes).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import resource
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "fedaf" / "fmnist_quick.toml"
PAPER = ROOT / "experiments" / "fedaf" / "fmnist_paper.toml"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_specs(config: Path, labels: list[str], overrides: dict[str, Any]) -> list[Any]:
    """The configured runs of ``labels`` (one seed), with ``overrides`` applied."""
    from fedskew.config import read_config, resolve

    runs = [r for r in resolve(read_config(config), overrides) if r.config.get("label") in labels]
    missing = set(labels) - {r.config["label"] for r in runs}
    if missing:
        raise SystemExit(f"no variant labelled {sorted(missing)} in {config}")
    return runs


def time_rounds(spec: Any, data_dir: str | None, keep: Path | None) -> dict[str, Any]:
    """Run one spec through ``RoundLoop`` and time each round (clients, server, evaluation)."""
    from fedskew.engine.round_loop import RoundLoop

    clients: dict[int, float] = defaultdict(float)
    cpu: dict[int, float] = {}

    class TimedLoop(RoundLoop):
        def exchange(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super().exchange(*args, **kwargs)
            finally:
                clients[self.round] += time.perf_counter() - t0

    def on_round(rec: dict[str, Any]) -> None:
        cpu[int(rec["round"])] = _cpu_seconds()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = (keep or Path(tmp)) / spec.folder_name
        load_before = os.getloadavg()
        t_start, cpu_start = time.perf_counter(), _cpu_seconds()
        loop = TimedLoop(spec.typed, run_dir, data_dir=data_dir, progress=False, on_round=on_round)
        t_built = time.perf_counter()
        result = loop.run()
        total = time.perf_counter() - t_start
        timing = [json.loads(line) for line in (run_dir / "timing.jsonl").read_text().splitlines()]
        metrics = (run_dir / "metrics.jsonl").read_bytes()
    workers = int(spec.config.get("workers", 1))
    rounds, previous_cpu = [], cpu_start
    for t in timing:
        r = int(t["round"])
        c = clients.get(r, 0.0)
        rounds.append({
            "round": r, "seconds": round(t["seconds"], 3), "clients": round(c, 3),
            "server": round(t["seconds"] - c - t["eval_seconds"], 3), "eval": round(t["eval_seconds"], 3),
            # CPU of this process only: with worker processes the clients' CPU is theirs.
            "cpu_seconds": round(cpu[r] - previous_cpu, 3) if workers == 1 and r in cpu else None,
        })
        previous_cpu = cpu.get(r, previous_cpu)
    return {
        "label": spec.config["label"], "workers": workers, "device": str(getattr(loop, "device", "cpu")),
        "amp": spec.config.get("amp", "off"), "setup_seconds": round(t_built - t_start, 3),
        "total_seconds": round(total, 3), "rounds": rounds,
        "metrics_sha256": hashlib.sha256(metrics).hexdigest(),
        "accuracy": result.records[-1].get("accuracy"), "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


class ClientBench:
    """One method's client half outside the engine: every client's step, inline, on one thread, timed.

    The message is the global model at its seeded initialisation; for FedAF it also carries global
    class logits, so the CDC term is on (as from round 2).
    """

    def __init__(self, spec: Any, data_dir: str | None) -> None:
        import torch

        from fedskew.algorithms.base import make_algorithm
        from fedskew.algorithms.condensation.wire import MODEL
        from fedskew.algorithms.fedaf import GLOBAL_LABELS, GLOBAL_LOGITS
        from fedskew.core.device import Compute, resolve_device
        from fedskew.core.message import Message, state_to_arrays
        from fedskew.engine.federation import federation_for

        self.cfg = cfg = spec.config
        self.device = resolve_device(str(cfg.get("device", "cpu")))
        self.compute = Compute(str(self.device), str(cfg.get("amp", "off")))
        self.fed = federation_for(spec.typed, data_dir)
        method = spec.typed.algorithm
        self.params = method.params
        self.model = make_algorithm(method.name, method.params, self.fed.info).init_model().to(self.device)
        arrays = state_to_arrays(self.model.state_dict(), MODEL)
        if cfg["algorithm"]["name"] == "fedaf":
            num = self.fed.info.num_classes
            arrays[GLOBAL_LABELS] = torch.arange(num)
            arrays[GLOBAL_LOGITS] = torch.zeros((num, num))
        self.msg = Message(arrays={k: v.to(self.device) for k, v in arrays.items()})
        self.cache: dict[Any, Any] = {}
        self.clients = [c for c in range(self.fed.info.num_clients) if self.fed.offsets[c + 1] > self.fed.offsets[c]]

    def algorithm(self, iterations: int | None = None) -> Any:
        from fedskew.algorithms.base import make_algorithm
        from fedskew.config.schema import component

        table = dict(self.cfg["algorithm"])
        if iterations is not None:
            table["condense_iterations"] = iterations
        method = component("algorithm", table)
        return make_algorithm(method.name, method.params, self.fed.info)

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def client_seconds(self, algo: Any, cid: int) -> tuple[float, float]:
        """Wall and CPU seconds of one client step (inline, one intra-op thread)."""
        from fedskew.algorithms.base import ClientContext
        from fedskew.core.device import use_compute
        from fedskew.core.threads import num_threads

        x, y = self.fed.client_data(cid)
        ctx = ClientContext(cid=cid, round=2, x=x.to(self.device), y=y.to(self.device), fed=self.fed.info,
                            model_cache=self.cache, device=self.device)
        with use_compute(self.compute), num_threads(1):
            self.sync()
            t0, c0 = time.perf_counter(), _cpu_seconds()
            algo.client_step("train", self.msg, ctx)
            self.sync()
            return time.perf_counter() - t0, _cpu_seconds() - c0


def time_clients(spec: Any, data_dir: str | None) -> dict[str, Any]:
    """Every client's step at the configured number of condensation steps, one after another."""
    from fedskew.core.allocator import keep_freed_memory

    keep_freed_memory()  # as the engine's processes do
    bench = ClientBench(spec, data_dir)
    algo = bench.algorithm()
    bench.client_seconds(bench.algorithm(1), bench.clients[0])  # warm-up: kernels, allocator, model cache
    load_before = os.getloadavg()
    per_client = []
    for cid in bench.clients:
        wall, cpu = bench.client_seconds(algo, cid)
        per_client.append({"client": cid, "classes": int((bench.fed.counts[cid] > 0).sum()),
                           "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)})
    return {
        "label": spec.config["label"], "device": str(bench.device), "amp": bench.compute.amp, "clients_only": True,
        "iterations": bench.params.condense_iterations, "clients": per_client,
        "seconds": round(sum(c["seconds"] for c in per_client), 3),
        "cpu_seconds": round(sum(c["cpu_seconds"] for c in per_client), 3),
        "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def estimate_paper(spec: Any, data_dir: str | None, steps: int, server_epochs: int) -> dict[str, Any]:
    """Estimate one paper-scale round from ``steps`` condensation steps per client (see the module text)."""
    import torch

    from fedskew.algorithms.condensation.knowledge import knowledge_matching_term
    from fedskew.algorithms.condensation.server import train_global_on_synthetic
    from fedskew.condense import SyntheticSet
    from fedskew.core.allocator import keep_freed_memory
    from fedskew.core.device import use_compute

    keep_freed_memory()
    bench = ClientBench(spec, data_dir)
    info, device, p = bench.fed.info, bench.device, bench.params
    zero, some = bench.algorithm(0), bench.algorithm(steps)
    bench.client_seconds(bench.algorithm(1), bench.clients[0])  # warm-up
    per_client = []
    for cid in bench.clients:
        fixed = bench.client_seconds(zero, cid)[0]
        step = max(bench.client_seconds(some, cid)[0] - fixed, 0.0) / steps
        per_client.append({"client": cid, "classes": int((bench.fed.counts[cid] > 0).sum()),
                           "fixed_seconds": round(fixed, 3), "step_seconds": round(step, 4)})
    # The server's training (main process, default threads) on a set of the round's size: every
    # client's ipc images per held class.
    n = sum(c["classes"] for c in per_client) * p.ipc
    gen = torch.Generator().manual_seed(0)
    images = torch.randn((n, *info.image_shape), generator=gen).to(device)
    labels = torch.randint(0, info.num_classes, (n,), generator=gen).to(device)
    server_cfg = dataclasses.replace(p.server, epochs=server_epochs)
    terms = []
    if spec.config["algorithm"]["name"] == "fedaf" and p.use_lgkm:
        soft = torch.softmax(torch.randn((info.num_classes, info.num_classes), generator=gen), 1).to(device)
        known = torch.ones(info.num_classes, dtype=torch.bool, device=device)
        terms = [knowledge_matching_term(soft, known, p.tau, p.lambda_glob)]
    with use_compute(bench.compute):
        train_global_on_synthetic(bench.model, SyntheticSet(images, labels), server_cfg, gen, terms)  # warm-up
        bench.sync()
        t0 = time.perf_counter()
        train_global_on_synthetic(bench.model, SyntheticSet(images, labels), server_cfg, gen, terms)
        bench.sync()
        server_epoch = (time.perf_counter() - t0) / server_epochs
    clients_total = sum(c["fixed_seconds"] + p.condense_iterations * c["step_seconds"] for c in per_client)
    return {
        "label": spec.config["label"], "device": str(device), "amp": bench.compute.amp, "estimate": True,
        "steps_timed": steps, "iterations": p.condense_iterations, "clients": per_client,
        "server_epoch_seconds": round(server_epoch, 4), "server_epochs": p.server.epochs, "synthetic_images": n,
        "round_seconds_estimate": round(clients_total + p.server.epochs * server_epoch, 1),
        "clients_seconds_estimate": round(clients_total, 1),
        "server_seconds_estimate": round(p.server.epochs * server_epoch, 1),
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", default=["FedDM", "FedAF"], help="variant labels (default FedDM FedAF)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per run (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="worker processes (default: the config's, 0 = one per core)")
    p.add_argument("--server-threads", type=int,
                   help="the run's server_threads (default: the config's, 0 = PyTorch's threads)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.add_argument("--amp", default="off", help="off, bf16 or fp16 (default off)")
    p.add_argument("--paper", action="store_true", help="paper scale (experiments/fedaf/fmnist_paper.toml)")
    p.add_argument("--paper-full", action="store_true", help="with --paper: run real rounds, not an estimate")
    p.add_argument("--clients-only", action="store_true",
                   help="time only every client's step (inline, one thread), wall and CPU seconds")
    p.add_argument("--steps", type=int, default=2, help="paper estimate: condensation steps timed per client")
    p.add_argument("--server-epochs", type=int, default=2, help="paper estimate: server epochs timed")
    p.add_argument("--config", type=Path, help="another config file (default: the quick or paper one)")
    p.add_argument("--data-dir", help="dataset folder (default $FEDSKEW_DATA)")
    p.add_argument("--keep", type=Path, help="keep the run folders under this folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    config = args.config or (PAPER if args.paper else QUICK)
    overrides: dict[str, Any] = {"rounds": args.rounds, "seeds": [args.seed], "device": args.device,
                                 "amp": args.amp, "checkpoint_every": 0}
    if args.workers is not None:
        overrides["workers"] = args.workers
    if args.server_threads is not None:
        overrides["server_threads"] = args.server_threads
    specs = run_specs(config, args.only, overrides)
    results = []
    for spec in specs:
        if args.clients_only:
            res = time_clients(spec, args.data_dir)
            print(f"{res['label']:8s} clients: {res['seconds']:.1f} s ({res['cpu_seconds']:.1f} s CPU) for "
                  f"{len(res['clients'])} clients, load {res['load_before'][0]}", flush=True)
        elif args.paper and not args.paper_full:
            res = estimate_paper(spec, args.data_dir, args.steps, args.server_epochs)
            print(f"{res['label']:8s} paper-scale estimate on {res['device']}: {res['round_seconds_estimate']:.0f} s a "
                  f"round (clients {res['clients_seconds_estimate']:.0f} s one after another, server "
                  f"{res['server_seconds_estimate']:.0f} s)", flush=True)
        else:
            res = time_rounds(spec, args.data_dir, args.keep)
            for r in res["rounds"]:
                cpu = "" if r["cpu_seconds"] is None else f", {r['cpu_seconds']:.1f} s CPU"
                print(f"{res['label']:8s} round {r['round']}: {r['seconds']:.1f} s (clients {r['clients']:.1f}, "
                      f"server {r['server']:.1f}, evaluation {r['eval']:.1f}{cpu}), load {res['load_before'][0]}",
                      flush=True)
        results.append(res)
    print(json.dumps({
        "benchmark": "condensation_round", "config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT)
                                                         else config),
        "scale": "paper" if args.paper else "quick", "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "runs": results,
    }))


if __name__ == "__main__":
    main()
