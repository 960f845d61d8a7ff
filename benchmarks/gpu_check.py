"""One GPU check, one call (issue 34, point 6): everything fedskew's GPU path promises, measured in one run of
under 8 minutes on a machine with only Python, torch + CUDA and the usual scientific stack (no network).

Parts, each in its own subprocess with its own time cap (a part that fails or runs out of time is recorded as
such in the JSON and the check goes on):

- ``suite``: ``pytest tests/gpu`` (passed, failed, skipped, the failed tests' names);
- ``w``: workload W (benchmarks/simulation.py: Fashion-MNIST, 100 clients, Dirichlet 0.1, FedAvg, 10 clients a
  round, McMahan et al.'s CNN) for the plain PyTorch loop and each fedskew runner the code has: sequential
  (``workers = 1``), ``workers_per_device`` and ``clients_in_parallel = "auto"`` (each only when RunSettings has
  the key; else recorded as absent). Per runner: seconds a round (median after the first), the first round,
  training images a second, accuracy, GPU busy % (one streaming nvidia-smi, a sample every 0.1 s, over the
  timed rounds) and, from torch.profiler over one more round, kernel launches, memory copies and aten
  operators a round (launches in worker processes are not seen: null for ``workers_per_device``);
- ``steps`` and ``compile``: benchmarks/step_options.py's variants on the device, those without and those with
  ``torch.compile`` (whose compiling takes tens of seconds: its own part, left out by ``--quick``);
- ``kip`` (not run unless named in ``--parts``): ``benchmarks/batched_kip.py`` on the device, HFLDD's KIP of ten
  clients one after another and batched (aten operations of a step, seconds of 10 steps), which decides whether
  the batched KIP stays (docs/performance.md, "Batched condensation");
- ``paper``: one real paper-scale round of FedDM and of FedAF (``experiments/fedaf/fmnist_paper.toml``:
  all 60,000 images, ConvNet width 128, ipc 50, 1000 condensation steps, 500 server epochs), with the best
  runner the code has; a round cut off by its cap reports how far it got;

``--device cpu --quick`` is a dry run of every part at tiny scale on the CPU (synthetic data, no nvidia-smi:
busy % is null); tests/test_gpu_check.py runs it. The last line printed is one JSON object (also written to
``--out``). How to run it on the device machine: docs/performance.md, "GPU check".

    python benchmarks/gpu_check.py --device cuda --out gpu_check.json        # FEDSKEW_DATA: fashion-mnist/
    python benchmarks/gpu_check.py --device cpu --quick                       # the dry run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

PARTS = ["suite", "w", "steps", "compile", "paper", "inner", "kip"]
"""The parts ``--parts`` may name."""
CAPS = {"suite": 135, "w.plain": 25, "w.sequential": 30, "w.workers_per_device": 35, "w.clients_in_parallel": 30,
        "steps": 25, "compile": 40, "paper.FedDM": 65, "paper.FedAF": 65, "inner": 90, "kip": 60}
"""Seconds each part may take on the GPU (the default parts' sum fits the 450 s budget; on an H200 on 2026-11-28
they took suite 128, W 17/21/24/15, steps 15, compile 33, and a paper round of 100 steps 49-59 s); --quick uses
--quick-cap for all."""
RUNNERS = {"sequential": {"workers": 1}, "workers_per_device": {"workers": 0, "workers_per_device": 4},
           "clients_in_parallel": {"workers": 1, "clients_in_parallel": "auto"}}
"""fedskew's runners and the settings that choose each (the keys past ``workers`` exist only in newer code)."""
QUICK_RUNNERS = {**RUNNERS, "workers_per_device": {"workers": 0, "workers_per_device": 1}}
"""--quick on a small CPU: one worker process per core, not four."""


# ------------------------------------------------------------------------------------------------- helpers
def run_settings_keys() -> set[str]:
    from fedskew.config.schema import RunSettings

    return {f.name for f in dataclasses.fields(RunSettings)}


def absent_keys(settings: dict[str, Any]) -> list[str]:
    """The keys of ``settings`` this code's RunSettings lacks."""
    return sorted(set(settings) - run_settings_keys())


def parse_sample(line: str, arrived: float) -> tuple[float, float]:
    """One ``timestamp, utilization.gpu`` line of nvidia-smi as (wall time, percent). The time is nvidia-smi's own
    (local time, ``2026/11/28 03:45:07.123``), so that lines a pipe delivers in bursts keep the moment each was
    taken; a line whose time does not parse keeps the moment it ``arrived``."""
    stamp, _, value = line.rpartition(",")
    when = arrived
    with contextlib.suppress(ValueError):
        when = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
    return when, float(value.strip())


class BusySampler(threading.Thread):
    """GPU utilisation from one streaming ``nvidia-smi -lms`` process, a sample every ``period`` seconds, as
    (wall time the line arrived, percent). One process for the whole check: spawning nvidia-smi every 0.5 s
    left the batched runner's 0.6 s of timed rounds on an H200 with fewer than two samples (2026-11-28)."""

    def __init__(self, index: int, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.index, self.period = index, period
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None

    def run(self) -> None:
        if not self.available:
            return
        cmd = ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu", "--format=csv,noheader,nounits",
               "-i", str(self.index), "-lms", str(max(int(self.period * 1000), 50))]
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        threading.Thread(target=lambda: (self.stop.wait(), proc.terminate()), daemon=True).start()
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(ValueError):  # a "[N/A]" or a partial line
                self.samples.append(parse_sample(line, time.time()))
        proc.wait()

    def busy(self, start: float | None, end: float | None) -> float | None:
        """Mean utilisation over [start, end]; None without nvidia-smi or with fewer than two samples there."""
        if start is None or end is None:
            return None
        inside = [u for t, u in self.samples if start <= t <= end]
        return round(statistics.mean(inside), 1) if len(inside) >= 2 else None


def run_child(spec: dict[str, Any], cap: float) -> dict[str, Any]:
    """Run ``gpu_check.py --child SPEC`` with a time cap: its JSON result, or a status saying what went wrong."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--child-out", str(out)]
    t0 = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = round(time.perf_counter() - t0, 1)
    text = log.read_text(errors="replace")
    log.unlink()
    result: dict[str, Any] = json.loads(out.read_text()) if out.stat().st_size else {}
    out.unlink()
    if proc.returncode == 0 and result:
        return {"status": "ok", **result, "seconds": seconds, "cap_s": round(cap)}
    progress = [json.loads(m) for m in re.findall(r"^PROGRESS (.*)$", text, re.M)]
    status = "timeout" if proc.returncode == -signal.SIGKILL else f"error (exit {proc.returncode})"
    return {"status": status, "seconds": seconds, "cap_s": round(cap), "progress": progress,
            "tail": text[-1500:] if "timeout" not in status else text[-400:]}


def progress(**event: Any) -> None:
    print("PROGRESS " + json.dumps(event), flush=True)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Profiled:
    """torch.profiler around one round: aten operators, kernel launches and memory copies in it."""

    def __init__(self, device: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        cuda = device.startswith("cuda")
        self.cuda = cuda
        self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))

    def __enter__(self) -> Profiled:
        self.prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.prof.__exit__(*exc)

    def counts(self) -> dict[str, float | None]:
        from step_options import count_events

        c = count_events(self.prof.events(), 1)
        return {"aten_ops_per_round": c["aten_ops"], "kernel_launches_per_round": c["kernel_launches"] if self.cuda
                else None, "memcpy_per_round": c["memcpy_calls"] if self.cuda else None}


# ------------------------------------------------------------------------------------------------- workload W
def w_config(quick: bool, device: str, rounds: int) -> dict[str, Any]:
    """Workload W as fedskew's config (``quick``: a synthetic stand-in of the same shapes, 20 clients, 4 a round)."""
    dataset = ({"name": "synthetic", "num_train": 1600, "num_test": 300, "num_classes": 10, "image_size": 28,
                "channels": 1} if quick else {"name": "fashion_mnist"})
    return {
        "name": "gpu_check_w", "label": "W", "rounds": rounds, "seed": 0, "workers": 1, "eval_every": 1,
        "checkpoint_every": 0, "target_accuracy": None, "at_rounds": [], "device": device, "dataset": dataset,
        "partition": {"name": "dirichlet", "num_clients": 20 if quick else 100, "alpha": 0.1, "seed": 0},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg", "clients_per_round": 4 if quick else 10, "local_epochs": 1, "batch_size": 32,
                      "lr": 0.01},
        "faults": {},
    }


def w_summary(seconds: list[float], images: list[int], ends: list[float]) -> dict[str, Any]:
    """Round figures: the first round apart, the rest timed (median s/round, images/s, their wall window)."""
    timed = slice(1, None) if len(seconds) > 1 else slice(0, None)
    return {"first_round_s": round(seconds[0], 4), "s_round": round(statistics.median(seconds[timed]), 4),
            "images_per_s": round(sum(images[timed]) / sum(seconds[timed]), 1), "rounds_timed": len(seconds[timed]),
            "window": [ends[0] if len(ends) > 1 else ends[0] - seconds[0], ends[-1]]}


def child_w_plain(spec: dict[str, Any]) -> dict[str, Any]:
    """The plain sequential loop (benchmarks/simulation.py's) on fedskew's federation, R rounds plus one profiled."""
    import torch
    from simulation import plain_epoch, plain_model

    from fedskew.components.selection import uniform_sample
    from fedskew.config.schema import typed_config
    from fedskew.core.seeding import numpy_rng
    from fedskew.engine.federation import build_federation

    device, rounds = spec["device"], spec["rounds"]
    cfg = w_config(spec["quick"], device, rounds)
    typed = typed_config(cfg)
    fed = build_federation(typed.dataset, typed.partition, typed.model, 0, spec.get("data_dir"))
    x, y, xt, yt = fed.x.to(device), fed.y.to(device), fed.x_test.to(device), fed.y_test.to(device)
    n, per_round = cfg["partition"]["num_clients"], cfg["algorithm"]["clients_per_round"]
    torch.manual_seed(0)
    glob, local = plain_model().to(device), plain_model().to(device)
    seconds, images, ends, acc, counts = [], [], [], 0.0, {}
    for rnd in range(1, rounds + 2):
        profiler = Profiled(device) if rnd == rounds + 1 else None
        if profiler:
            profiler.__enter__()
        t0 = time.perf_counter()
        states, weights = [], []
        for c in uniform_sample(n, per_round, numpy_rng(0, "server", rnd, "select")):
            s, e = fed.offsets[int(c)], fed.offsets[int(c) + 1]
            local.load_state_dict(glob.state_dict())
            plain_epoch(local, x[s:e], y[s:e])
            states.append({k: v.detach().clone() for k, v in local.state_dict().items()})
            weights.append(e - s)
        total = sum(weights)
        glob.load_state_dict({k: sum(w / total * st[k] for st, w in zip(states, weights, strict=True))
                              for k in states[0]})
        with torch.no_grad():
            glob.eval()
            correct = sum(int((glob(xt[i : i + 1000]).argmax(1) == yt[i : i + 1000]).sum())
                          for i in range(0, len(yt), 1000))
            glob.train()
        acc = correct / len(yt)
        sync(device)
        if profiler:
            profiler.__exit__(None, None, None)
            counts = profiler.counts()
            break
        seconds.append(time.perf_counter() - t0)
        images.append(total)
        ends.append(time.time())
        progress(round=rnd, seconds=round(seconds[-1], 3))
    return {**w_summary(seconds, images, ends), **counts, "accuracy": round(acc, 4)}


def child_w_fedskew(spec: dict[str, Any]) -> dict[str, Any]:
    """fedskew's RoundLoop under one runner's settings: R rounds timed (timing.jsonl), one more profiled."""
    from fedskew.config.schema import typed_config
    from fedskew.engine.round_loop import RoundLoop

    rounds, device = spec["rounds"], spec["device"]
    settings = (QUICK_RUNNERS if spec["quick"] else RUNNERS)[spec["runner"]]
    cfg = {**w_config(spec["quick"], device, rounds + 1), **settings}
    ends: dict[int, float] = {}
    holder: list[Profiled] = []

    def on_round(rec: dict[str, Any]) -> None:
        ends[int(rec["round"])] = time.time()
        progress(round=int(rec["round"]))
        if rec["round"] == rounds:
            sync(device)
            holder.append(Profiled(device).__enter__())
        elif rec["round"] == rounds + 1:
            sync(device)
            holder[0].__exit__(None, None, None)

    with tempfile.TemporaryDirectory() as tmp:
        res = RoundLoop(typed_config(cfg), Path(tmp), data_dir=spec.get("data_dir"), progress=False,
                        on_round=on_round).run()
        timing = [json.loads(line) for line in (Path(tmp) / "timing.jsonl").read_text().splitlines()][:rounds]
    records = res.records[:rounds]
    counts = holder[0].counts() if holder else {}
    if spec["runner"] == "workers_per_device":  # kernels launch in the worker processes, unseen here
        counts = {**counts, "kernel_launches_per_round": None, "memcpy_per_round": None,
                  "note": "launches and copies happen in worker processes, which the profiler does not see"}
    summary = w_summary([t["seconds"] for t in timing], [int(r["samples"]) for r in records],
                        [ends[r] for r in range(1, rounds + 1)])
    return {**summary, **counts, "accuracy": records[-1]["accuracy"], "settings": settings}


# ------------------------------------------------------------------------------------------------- paper round
PAPER_STEPS = 50
"""Condensation steps of the paper parts' round by default. With the paper's 1000, neither FedDM's nor FedAF's
clients finished within 55 s on an H200 (2026-11-28); 100 took 9.5-10.9 s of clients' time there."""
PAPER_ITERATIONS = 1000
"""experiments/fedaf/fmnist_paper.toml's condense_iterations: what the paper parts extrapolate to."""
PAPER_QUICK = {"dataset.name": "synthetic", "dataset.num_train": 400, "dataset.num_test": 100, "dataset.image_size": 28,
               "partition.num_clients": 3, "algorithm.clients_per_round": 3, "model.net_width": 8,
               "algorithm.condense_iterations": 2, "algorithm.ipc": 2, "algorithm.real_batch": 16,
               "algorithm.server.epochs": 2}


def child_paper(spec: dict[str, Any]) -> dict[str, Any]:
    """One real round of the paper-scale config's ``label`` variant (clients, server and evaluation seconds)."""
    from condensation_round import PAPER, run_specs

    from fedskew.engine.round_loop import RoundLoop

    overrides = {"rounds": 1, "seeds": [0], "device": spec["device"], "checkpoint_every": 0, **spec["runner"],
                 **(PAPER_QUICK if spec["quick"] else {}),
                 **{k: tomllib.loads(f"v = {v}")["v"] for k, v in spec.get("paper_set", [])}}
    [run] = run_specs(PAPER, [spec["label"]], overrides)
    clients: list[float] = []

    class Timed(RoundLoop):
        def exchange(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super().exchange(*args, **kwargs)
            finally:
                sync(spec["device"])
                clients.append(time.perf_counter() - t0)
                progress(exchange=len(clients), seconds=round(clients[-1], 2))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        loop = Timed(run.typed, Path(tmp), data_dir=spec.get("data_dir"), progress=False)
        setup = time.perf_counter() - t0
        progress(setup=round(setup, 2))
        res = loop.run()
        [timing] = [json.loads(line) for line in (Path(tmp) / "timing.jsonl").read_text().splitlines()]
    scale = {k: getattr(run.typed.algorithm.params, k) for k in ("condense_iterations", "ipc", "real_batch")}
    out = {"round_s": round(timing["seconds"], 2), "clients_s": round(sum(clients), 2),
           "server_s": round(timing["seconds"] - sum(clients) - timing["eval_seconds"], 2),
           "eval_s": round(timing["eval_seconds"], 2), "setup_s": round(setup, 2),
           "accuracy": res.records[-1]["accuracy"], "runner": spec["runner"], "scale": scale}
    full = spec.get("paper_iterations")
    if full and scale["condense_iterations"] < full:
        out["extrapolated"] = extrapolate(out, scale["condense_iterations"], full)
    return out


def extrapolate(measured: dict[str, Any], steps: int, full: int) -> dict[str, Any]:
    """A round of ``full`` condensation steps from one of ``steps``: the clients' half scaled linearly (an
    estimate on the high side: it scales their set-up too), the server's epochs and the evaluation as measured."""
    clients = measured["clients_s"] * full / steps
    return {"condense_iterations": full, "clients_s": round(clients, 1),
            "round_s": round(clients + measured["server_s"] + measured["eval_s"], 1)}


def child_steps(spec: dict[str, Any]) -> dict[str, Any]:
    from step_options import CPU_VARIANTS, CUDA_VARIANTS, measure

    variants = CUDA_VARIANTS if spec["device"].startswith("cuda") else CPU_VARIANTS
    variants = {k: v for k, v in variants.items() if ("compile" in v) == spec["compiled"]}
    if spec["compiled"]:
        variants = {"plain": {}, **variants}  # the reference the weights are compared with
    return {"variants": measure(spec["device"], variants, spec["steps"], 2, 32)}


def child_main(spec: dict[str, Any], out: str) -> None:
    import torch

    torch.set_num_threads(1 if spec["device"] == "cpu" else torch.get_num_threads())
    kind = spec["kind"]
    if kind == "w":
        result = child_w_plain(spec) if spec["runner"] == "plain" else child_w_fedskew(spec)
    elif kind == "paper":
        result = child_paper(spec)
    else:
        result = child_steps(spec)
    Path(out).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------- parts
def run_suite(cap: float) -> dict[str, Any]:
    """``pytest tests/gpu -v`` in a subprocess: counts from its per-test lines (also when cut off)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider", "-o", "addopts="]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cap)
        text = proc.stdout + proc.stderr
        status = "ok" if proc.returncode in (0, 1) else f"error (exit {proc.returncode})"  # 1: some tests failed
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or b""
        text, status = partial.decode(errors="replace") if isinstance(partial, bytes) else partial, "timeout"
    outcome = re.findall(r"^(tests/gpu/\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", text, re.M)
    count = {k: sum(1 for _, o in outcome if o == k.upper()) for k in ("passed", "failed", "skipped", "error")}
    return {"status": status, **count, "failed_tests": [t for t, o in outcome if o in ("FAILED", "ERROR")],
            "seconds": round(time.perf_counter() - t0, 1), "cap_s": round(cap),
            **({"tail": text[-1500:]} if status != "ok" or not outcome else {})}


def run_inner(device: str, quick: bool, cap: float) -> dict[str, Any]:
    """``benchmarks/inner_loops.py`` on the device (issue 45, point 4: each inner loop's FLOPs, seconds and
    fraction of the device's matrix-product peak) in a subprocess: its JSON line. --quick: W's SGD step only."""
    return run_script("inner_loops.py", ["--device", device, "--steps", "1" if quick else "2",
                                         *(["--loops", "sgd"] if quick else [])], cap)


def run_kip(device: str, quick: bool, data_dir: str | None, cap: float) -> dict[str, Any]:
    """``benchmarks/batched_kip.py`` on the device in a subprocess: its JSON line. --quick: its synthetic stand-in."""
    return run_script("batched_kip.py", ["--device", device, *(["--quick"] if quick else []),
                                         *(["--data-dir", data_dir] if data_dir else [])], cap)


def run_script(script: str, script_args: list[str], cap: float) -> dict[str, Any]:
    """A benchmark of this folder in a subprocess, cut off after ``cap`` seconds: its last line's JSON."""
    t0 = time.perf_counter()
    cmd = [sys.executable, str(HERE / script), *script_args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or b""
        text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        return {"status": "timeout", "seconds": round(time.perf_counter() - t0, 1), "cap_s": round(cap),
                "tail": text[-1500:]}
    seconds = round(time.perf_counter() - t0, 1)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"status": f"error (exit {proc.returncode})", "seconds": seconds, "cap_s": round(cap),
                "tail": (proc.stdout + proc.stderr)[-1500:]}
    return {"status": "ok", **result, "seconds": seconds, "cap_s": round(cap)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--quick", action="store_true", help="every part at tiny scale (the CPU dry run)")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all parts together (default 450)")
    ap.add_argument("--quick-cap", type=float, default=60.0, help="--quick: seconds each part may take")
    ap.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS",
                    help=f"another cap for a part (repeatable; parts: {', '.join(CAPS)})")
    ap.add_argument("--rounds", type=int, help="timed rounds of W (default 5; --quick 2)")
    ap.add_argument("--paper-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for the paper parts' config, e.g. algorithm.condense_iterations=1000 "
                         "(repeatable; a TOML value)")
    ap.add_argument("--paper-steps", type=int, default=PAPER_STEPS,
                    help=f"condensation steps of the paper parts' round (default {PAPER_STEPS}; the paper's "
                         "1000 do not fit a cap on an H200), the round also given extrapolated to 1000; "
                         "--quick keeps its own 2 steps")
    ap.add_argument("--parts", nargs="+", default=["suite", "w", "steps", "compile", "paper"], choices=PARTS,
                    help="parts to run (default: suite w steps compile paper; also inner, kip)")
    ap.add_argument("--data-dir", default=os.environ.get("FEDSKEW_DATA"), help="datasets folder ($FEDSKEW_DATA)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child), args.child_out)
        return {}
    for item in args.paper_set:  # refused here in one line, not inside each paper part's child
        key, eq, value = item.partition("=")
        try:
            if not key or not eq:
                raise ValueError("no KEY=")
            tomllib.loads(f"v = {value}")
        except (ValueError, tomllib.TOMLDecodeError):
            ap.error(f"--paper-set {item!r}: expected KEY=VALUE with a TOML value (a string in quotes), "
                     "e.g. algorithm.condense_iterations=100")
    if args.paper_steps < 1:
        ap.error(f"--paper-steps {args.paper_steps}: expected a positive number of condensation steps")

    import torch

    for item in args.cap:  # refused in one line before anything runs
        key, eq, value = item.partition("=")
        try:
            if key not in CAPS or not eq or float(value) <= 0:
                raise ValueError(key)
        except ValueError:
            ap.error(f"--cap {item!r}: expected PART=SECONDS with PART one of {', '.join(CAPS)} and SECONDS > 0")
    caps = {**CAPS, **{k: float(v) for k, _, v in (c.partition("=") for c in args.cap)}}
    cuda = args.device.startswith("cuda")
    start, deadline = time.time(), time.perf_counter() + args.budget
    sampler = BusySampler(torch.device(args.device).index or 0 if cuda else 0)
    sampler.available = sampler.available and cuda
    sampler.start()
    base = {"device": args.device, "quick": args.quick, "data_dir": args.data_dir,
            "paper_set": [*([] if args.quick else [("algorithm.condense_iterations", str(args.paper_steps))]),
                          *(s.partition("=")[::2] for s in args.paper_set)],
            "paper_iterations": None if args.quick else PAPER_ITERATIONS}
    keys = run_settings_keys()
    plan: list[tuple[str, dict[str, Any] | None]] = []
    if "suite" in args.parts:
        plan.append(("suite", None))
    if "w" in args.parts:
        rounds = args.rounds or (2 if args.quick else 5)
        plan += [(f"w.{r}", {**base, "kind": "w", "runner": r, "rounds": rounds}) for r in ("plain", *RUNNERS)]
    if "steps" in args.parts:
        plan.append(("steps", {**base, "kind": "steps", "steps": 10 if args.quick else 60, "compiled": False}))
    if "compile" in args.parts:
        plan.append(("compile", {**base, "kind": "steps", "steps": 10 if args.quick else 60, "compiled": True}))
    # The paper part's clients run in several processes sharing the GPU (the batched distribution matching was
    # no faster on an H200, 2026-11-28, and was removed).
    best = RUNNERS["sequential"] if absent_keys(RUNNERS["workers_per_device"]) else RUNNERS["workers_per_device"]
    if "paper" in args.parts:
        plan += [(f"paper.{m}", {**base, "kind": "paper", "label": m, "runner": best}) for m in ("FedDM", "FedAF")]
    if "inner" in args.parts:
        plan.append(("inner", {"kind": "inner"}))
    if "kip" in args.parts:
        plan.append(("kip", {"kind": "kip"}))
    results: dict[str, Any] = {}
    for i, (name, spec) in enumerate(plan):
        runner_keys = absent_keys(RUNNERS.get(name.split(".", 1)[-1], {})) if name.startswith("w.") else []
        left = deadline - time.perf_counter() - 5 * (len(plan) - i - 1)  # 5 s kept for each part after this one
        cap = min(args.quick_cap if args.quick else caps[name], left)
        if runner_keys:
            res: dict[str, Any] = {"status": "absent", "note": f"RunSettings has no {', '.join(runner_keys)} here"}
        elif cap < 5:
            res = {"status": "skipped", "note": "no time left in the budget"}
        elif name == "compile" and args.quick:
            res = {"status": "skipped", "note": "--quick: compiling takes about 40 s on a small CPU"}
        elif spec is None:
            res = run_suite(cap)
        elif spec["kind"] == "inner":
            res = run_inner(args.device, args.quick, cap)
        elif spec["kind"] == "kip":
            res = run_kip(args.device, args.quick, args.data_dir, cap)
        else:
            res = run_child(spec, cap)
            if name.startswith("w.") and res["status"] == "ok":
                res["gpu_busy_pct"] = sampler.busy(*res.pop("window"))
        print(f"{name:24s} {res['status']:10s} {json.dumps({k: v for k, v in res.items() if k != 'tail'})[:300]}",
              flush=True)
        section, _, key = name.partition(".")
        if key:
            results.setdefault(section, {})[key] = res
        else:
            results[section] = res
    sampler.stop.set()
    sampler.join(timeout=2)  # its nvidia-smi terminated, not left to a broken pipe
    w = results.get("w", {})
    plain = w.get("plain", {}).get("s_round")
    report = {
        "check": "gpu_check", "device": args.device, "quick": args.quick,
        "gpu": torch.cuda.get_device_name(torch.device(args.device)) if cuda else None,
        "torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
        "runner_keys": sorted(k for k in ("workers_per_device", "clients_in_parallel") if k in keys),
        "nvidia_smi": sampler.available, "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)),
        "seconds": round(time.time() - start, 1), "budget_s": args.budget, **results,
        "w_vs_plain": {k: round(v["s_round"] / plain, 3) for k, v in w.items() if plain and v.get("s_round")},
    }
    line = json.dumps(report)
    if args.out:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    return report


if __name__ == "__main__":
    main()
