"""Batched condensation against the sequential runner (issue 34): seconds and aten operations a FedDM and a
FedAF round.

Runners, both in this process (``workers = 1``): ``clients_in_parallel = 1``, the sequential runner (the
round's clients condense one after another), and ``clients_in_parallel = clients_per_round``, the batched
runner (the round's clients condense together, one batched matching step of all of them at a time,
:mod:`fedskew.components.batched_condensation`).

Scale: by default ``experiments/fedaf/fmnist_quick.toml`` (Fashion-MNIST 10%, 10 clients all in every
round, ConvNet-BN width 32, ipc 10, real batch 32 a class) with ``--steps`` condensation steps (default 10)
and ``--server-epochs`` (default 1: the server's training is the same for both runners), ``--rounds``
rounds (default 2: FedAF's CDC term starts in round 2). ``--paper``: ``experiments/fedaf/fmnist_paper.toml``
(all 60,000 images, width 128, ipc 50, 1000 steps, real batch 256, 500 server epochs), a GPU's job.

For each method and runner:

1. a timed run: seconds of each round, of which the clients' exchange (the condensation), and on a CPU this
   process's CPU seconds; the runners' final global models are compared (max abs difference; float32, so
   equal up to rounding and the 8-bit uploads);
2. a profiled run (``--profile-steps`` steps, default ``--steps``; one server epoch): the aten operations a
   round, all of them and those in the clients' jobs; each aten operation is one dispatch from Python and,
   on a GPU, about one kernel launch (CUDA kernels counted too on a GPU);
3. the aten operations of one matching step of the round-1 clients (outside the engine, the global model
   at its seeded start, FedAF with a CDC term): one after another (``distribution_matching``, 3 steps less
   1), batched (``condense_batched``, likewise), and of the batched step, the host-side draws alone (each
   client's seed, network and real batch indices, on CPU tensors: no kernel on a GPU).
4. with ``--kip``, the aten operations of one KIP step (HFLDD's: NTK kernel, 10 images a class) of the same
   clients, one after another and batched (:mod:`fedskew.components.batched_kip`), and the seconds of 10 steps
   (CPU seconds on a CPU).

The last line printed is one JSON object.

    FEDSKEW_DATA=../shared/datasets python benchmarks/batched_condensation.py                  # CPU, ~2-5 min
    python benchmarks/batched_condensation.py --paper --device cuda --rounds 1 --profile-steps 20 --methods FedDM
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from batched_clients import labelled_clients, round_counts
from condensation_round import PAPER, QUICK, run_specs


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def spec_for(args: argparse.Namespace, label: str, width: int, steps: int, profiled: bool = False) -> Any:
    """The run of ``label`` with ``clients_in_parallel = width`` and ``steps`` condensation steps; a profiled run
    trains the server one epoch (its training is the same for both runners, and long at paper scale)."""
    overrides: dict[str, Any] = {"rounds": args.rounds, "seeds": [0], "device": args.device, "checkpoint_every": 0,
                                 "workers": 1, "clients_in_parallel": width}
    if not args.paper or args.steps is not None or profiled:
        overrides["algorithm.condense_iterations"] = steps
    if not args.paper:
        overrides["eval_every"] = 1000  # the global model is evaluated after the last round only
    if profiled:
        overrides["algorithm.server.epochs"] = 1
    elif not args.paper or args.server_epochs is not None:
        overrides["algorithm.server.epochs"] = args.server_epochs if args.server_epochs is not None else 1
    [spec] = run_specs(PAPER if args.paper else QUICK, [label], overrides)
    return spec


def timed_run(spec: Any, args: argparse.Namespace) -> dict[str, Any]:
    from fedskew.engine.round_loop import RoundLoop

    clients: dict[int, float] = {}
    clients_cpu: dict[int, float] = {}
    cpu: list[float] = []

    class Timed(RoundLoop):
        def exchange(self, *a: Any, **kw: Any) -> Any:
            t0, c0 = time.perf_counter(), _cpu_seconds()
            try:
                return super().exchange(*a, **kw)
            finally:
                _sync(args.device)
                clients[self.round] = clients.get(self.round, 0.0) + time.perf_counter() - t0
                clients_cpu[self.round] = clients_cpu.get(self.round, 0.0) + _cpu_seconds() - c0

    with tempfile.TemporaryDirectory() as tmp:
        loop = Timed(spec.typed, Path(tmp), data_dir=args.data_dir, progress=False,
                     on_round=lambda rec: cpu.append(_cpu_seconds()))
        cpu.append(_cpu_seconds())
        result = loop.run()
        timing = [json.loads(line) for line in (Path(tmp) / "timing.jsonl").read_text().splitlines()]
    model = {k: v.detach().float().cpu().clone() for k, v in loop.server.model.state_dict().items()}
    return {
        "round_s": [round(t["seconds"], 3) for t in timing],
        "clients_s": [round(clients.get(int(t["round"]), 0.0), 3) for t in timing],
        "cpu_s": [round(b - a, 3) for a, b in itertools.pairwise(cpu)] if args.device == "cpu" else None,
        "clients_cpu_s": [round(clients_cpu.get(int(t["round"]), 0.0), 3) for t in timing]
        if args.device == "cpu" else None,
        "accuracy": result.records[-1].get("accuracy"),
        "_model": model,
    }


def profiled_run(spec: Any, args: argparse.Namespace) -> dict[str, float | None]:
    from torch.profiler import ProfilerActivity, profile

    from fedskew.engine.round_loop import RoundLoop

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tempfile.TemporaryDirectory() as tmp, labelled_clients(), profile(activities=activities) as prof:
        RoundLoop(spec.typed, Path(tmp), data_dir=args.data_dir, progress=False).run()
    counts: dict[str, float | None] = dict(round_counts(prof.events(), args.rounds))
    if not cuda:
        counts["cuda_kernels_per_round"] = None
    return counts


def step_ops(spec: Any, args: argparse.Namespace) -> dict[str, float]:
    """Aten operations of one matching step of every round-1 client: sequential, batched, the batched draws."""
    import copy

    import torch
    from torch.profiler import ProfilerActivity, profile

    from fedskew.components import batched_condensation as bc
    from fedskew.condense.distribution_matching import DMConfig, distribution_matching, prepare_dm
    from fedskew.condense.samplers import interpolated_model_sampler, perturbed_model_sampler
    from fedskew.condense.swd import ClassSWD
    from fedskew.config.schema import typed_config
    from fedskew.core.seeding import seeded_init
    from fedskew.engine.federation import build_federation

    config = typed_config(spec.config)
    fed = build_federation(config.dataset, config.partition, config.model, 0, args.data_dir)
    algo = spec.config["algorithm"]
    factory = fed.info.model.build
    start = seeded_init(factory, 0, "init").to(args.device)
    clients = list(range(int(algo["clients_per_round"])))
    feddm = algo["name"] == "feddm"

    def parts(iterations: int) -> list[tuple[Any, ...]]:
        cfg = DMConfig(iterations=iterations, ipc=int(algo["ipc"]), image_lr=float(algo["image_lr"]),
                       momentum=float(algo["image_momentum"]), real_batch=int(algo["real_batch"]), init="mean",
                       clip_norm=float(algo.get("clip_norm", 2.0)) if feddm else None)
        out = []
        for cid in clients:
            x, y = fed.client_data(cid)
            model = copy.deepcopy(start)
            if feddm:
                sampler, term = perturbed_model_sampler(model, factory, float(algo.get("rho", 5.0))), None
            else:
                n = fed.info.num_classes
                v = torch.randn((n, n), generator=torch.Generator().manual_seed(cid))
                term = ClassSWD({c: v[c : c + 1].to(args.device) for c in range(n)},
                                float(algo.get("lambda_loc", 1e-3)), int(algo.get("swd_projections", 128)), "samples",
                                torch.Generator().manual_seed(cid))
                sampler = interpolated_model_sampler(model, factory, float(algo.get("gamma", 0.9)))
            out.append((x.to(args.device), y.to(args.device), sampler, cfg, torch.Generator().manual_seed(cid), term))
        return out

    def count(fn: Any) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
            _sync(args.device)
        return sum(1 for e in prof.events() if e.name.startswith("aten::"))

    def sequential(iterations: int) -> int:
        made = parts(iterations)
        return count(lambda: [distribution_matching(x, y, s, c, g, None, t) for x, y, s, c, g, t in made])

    def batched(iterations: int) -> int:
        requests = [prepare_dm(x, y, s, c, g, None, t) for x, y, s, c, g, t in parts(iterations)]
        return count(lambda: bc.condense_batched(requests))

    sequential(1), batched(1)  # warm-up: first-call caches (the SWD's quantile grid) are not a step's work

    stacked = bc._StackedDM([prepare_dm(x, y, s, c, g, None, t) for x, y, s, c, g, t in parts(1)])
    stacked._draw(0)
    return {"sequential": (sequential(3) - sequential(1)) / 2, "batched": (batched(3) - batched(1)) / 2,
            "batched_draws": count(lambda: stacked._draw(1)), "clients": len(clients)}


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

    def seconds(together: bool, iterations: int = 10) -> float:
        cfg = KIPConfig(iterations=iterations, ipc=ipc, target_batch=256)
        n = fed.info.num_classes
        t0 = time.process_time() if args.device == "cpu" else time.perf_counter()
        if together:
            kip_batched([prepare_kip(x, y, n, cfg, torch.Generator().manual_seed(c), s)
                         for c, (x, y, s) in enumerate(data)])
        else:
            for c, (x, y, s) in enumerate(data):
                kip(x, y, n, cfg, torch.Generator().manual_seed(c), start=s)
        _sync(args.device)
        return round((time.process_time() if args.device == "cpu" else time.perf_counter()) - t0, 3)

    run(1, False), run(1, True)  # warm-up
    return {"sequential": (run(3, False) - run(1, False)) / 2, "batched": (run(3, True) - run(1, True)) / 2,
            "clients": len(clients), "seconds_10_steps": {"sequential": seconds(False), "batched": seconds(True)},
            "seconds_kind": "CPU" if args.device == "cpu" else "wall"}


def compare_runners(label: str, steps: int, profile_steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """Timed and profiled runs of ``label`` with each runner, and how they compare."""
    width = int(spec_for(args, label, 1, steps).config["algorithm"]["clients_per_round"])
    res: dict[str, Any] = {}
    for name, w in (("sequential", 1), ("batched", width)):
        r = timed_run(spec_for(args, label, w, steps), args)
        if not args.no_profile:
            r.update(profiled_run(spec_for(args, label, w, profile_steps, profiled=True), args))
        res[name] = r
        ops = (f"; {r['aten_ops_per_round']:.0f} aten ops a round ({r['client_aten_ops_per_round']:.0f} in the "
               f"clients' jobs, {profile_steps} steps)") if not args.no_profile else ""
        print(f"{label} {name} (clients_in_parallel={w}): s/round {r['round_s']}, clients {r['clients_s']}"
              + (f"; CPU s/round {r['cpu_s']}, clients {r['clients_cpu_s']}" if r["cpu_s"] else "") + ops,
              flush=True)
    seq, bat = res["sequential"], res["batched"]
    a, b = seq.pop("_model"), bat.pop("_model")
    res["max_model_diff"] = max(float((a[k] - b[k]).abs().max()) if a[k].numel() else 0.0 for k in a)
    res["clients_s_ratio"] = round(bat["clients_s"][-1] / seq["clients_s"][-1], 3)
    if seq["clients_cpu_s"]:
        res["clients_cpu_s_ratio"] = round(bat["clients_cpu_s"][-1] / seq["clients_cpu_s"][-1], 3)
    if not args.no_profile:
        res["aten_ratio"] = round(bat["aten_ops_per_round"] / seq["aten_ops_per_round"], 3)
        res["client_aten_ratio"] = round(bat["client_aten_ops_per_round"] / seq["client_aten_ops_per_round"], 3)
    print(f"{label}: batched/sequential clients' seconds (last round) {res['clients_s_ratio']}"
          + (f" (CPU {res['clients_cpu_s_ratio']})" if "clients_cpu_s_ratio" in res else "")
          + (f", aten ops {res['aten_ratio']} ({res['client_aten_ratio']} in the clients' jobs)"
             if not args.no_profile else "")
          + f"; final models differ by {res['max_model_diff']:.2e}", flush=True)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["FedDM", "FedAF"])
    ap.add_argument("--paper", action="store_true", help="experiments/fedaf/fmnist_paper.toml (a GPU's job)")
    ap.add_argument("--steps", type=int, default=None, help="condensation steps (default 10; --paper: 1000)")
    ap.add_argument("--profile-steps", type=int, default=None, help="steps of the profiled runs (default --steps)")
    ap.add_argument("--server-epochs", type=int, default=None, help="default 1 (--paper: the config's 500)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-step-ops", action="store_true", help="skip the aten operations of one matching step")
    ap.add_argument("--step-ops-only", action="store_true", help="only the aten operations of one matching step")
    ap.add_argument("--kip", action="store_true", help="also the aten operations of one KIP step (HFLDD's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    import torch

    steps = args.steps if args.steps is not None else (1000 if args.paper else 10)
    profile_steps = args.profile_steps if args.profile_steps is not None else steps
    out: dict[str, Any] = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda")
                           else None, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                           "scale": "paper" if args.paper else "quick", "steps": steps,
                           "profile_steps": profile_steps, "rounds": args.rounds,
                           "load_before": [round(v, 2) for v in os.getloadavg()], "methods": {}}
    for label in args.methods:
        res: dict[str, Any] = {}
        if not args.step_ops_only:
            res = compare_runners(label, steps, profile_steps, args)
        if not args.no_step_ops:
            res["step_ops"] = ops = step_ops(spec_for(args, label, 1, steps), args)
            print(f"{label}: aten ops of one matching step of {ops['clients']} clients: sequential "
                  f"{ops['sequential']:.0f}, batched {ops['batched']:.0f} (of them {ops['batched_draws']} host-side "
                  "draws)", flush=True)
        out["methods"][label] = res
    if args.kip:
        out["kip_step_ops"] = ops = kip_step_ops(spec_for(args, args.methods[0], 1, steps), args)
        print(f"KIP: aten ops of one step of {ops['clients']} clients: sequential {ops['sequential']:.0f}, "
              f"batched {ops['batched']:.0f}; 10 steps, {ops['seconds_kind']} s: {ops['seconds_10_steps']}", flush=True)
    out["load_after"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
