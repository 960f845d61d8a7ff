"""Worker-pool start-up: what the first round of each run costs against its later rounds, in a grid.

An experiment of workload W (Fashion-MNIST, 100 clients, Dirichlet alpha=0.1 with the partition seed pinned
to 0, FedAvg, 10 clients a round, batch 32, McMahan et al.'s CNN) with two variants (lr 0.01 and 0.02) and
two seeds, ``--rounds`` rounds each, run by ``fedskew run`` in a child process (so ``PYTHONPATH`` picks the
code measured). The child times every round (the round loop's ``_one_round``: the clients, aggregation and
evaluation) in wall-clock seconds and in CPU seconds of the whole process tree (the run's process and its
workers, from /proc; other users' load on a shared machine changes wall-clock times much more than CPU
times). Per run it prints round 1 and the median of the later rounds, both ways, then the experiment's wall
time and each run's ``metrics.jsonl`` SHA-256, to compare two versions' results.

    FEDSKEW_DATA=../shared/datasets python benchmarks/pool_startup.py --workers 2 --rounds 3
    PYTHONPATH=../before/src FEDSKEW_DATA=../shared/datasets python benchmarks/pool_startup.py   # another version

``--threads-check`` instead trains W's CNN for 10 SGD steps (batch 32, a fixed draw) on 1 and on 2 intra-op
threads and prints whether the weights are bit-equal: why a worker never gets spare cores as threads.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """
name = "pool_startup"
rounds = {rounds}
seeds = [0, 1]
workers = {workers}
eval_every = 1
checkpoint_every = 0

[dataset]
name = "fashion_mnist"

[partition]
name = "dirichlet"
num_clients = 100
alpha = 0.1
seed = 0

[model]
name = "fedavg_cnn"

[algorithm]
name = "fedavg"
clients_per_round = 10
local_epochs = 1
batch_size = 32
lr = 0.01

[[variants]]
label = "lr0.01"

[[variants]]
label = "lr0.02"
"algorithm.lr" = 0.02
"""


def threads_check() -> dict[str, object]:
    """W's CNN after 10 SGD steps on 1, 2 and again 1 intra-op threads: are the weights bit-equal?"""
    import torch

    from fedskew.algorithms.base import ModelSpec

    def train(threads: int) -> dict[str, torch.Tensor]:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = ModelSpec(name="fedavg_cnn", in_channels=1, num_classes=10, image_size=28, options=()).build()
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(320, 1, 28, 28, generator=g), torch.randint(0, 10, (320,), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(10):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i * 32:(i + 1) * 32]), y[i * 32:(i + 1) * 32]).backward()
            opt.step()
        return {k: v.clone() for k, v in model.state_dict().items()}

    one, two, again = train(1), train(2), train(1)
    return {
        "one_thread_repeats": all(torch.equal(one[k], again[k]) for k in one),
        "two_threads_equal_one": all(torch.equal(one[k], two[k]) for k in one),
        "max_abs_diff": max(float((one[k] - two[k]).abs().max()) for k in one),
    }


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live descendant, plus its reaped children's (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            stats[int(entry.name)] = text[text.rindex(")") + 2:].split()  # fields from the state on
    parents = {pid: int(f[1]) for pid, f in stats.items()}
    total = 0.0
    for pid, fields in stats.items():
        p = pid
        while p not in (root, 0, 1) and p in parents:
            p = parents[p]
        if p == root:
            utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
            total += utime + stime + (cutime + cstime if pid == root else 0)
    return total / tick


def child(cfg: str, out: str, result: str, extra: list[str]) -> None:
    """Run the experiment here, timing each round (wall and process-tree CPU) into ``result``."""
    from fedskew.cli import main as fedskew_main
    from fedskew.engine.round_loop import RoundLoop

    rows: list[dict[str, object]] = []
    one_round = RoundLoop._one_round

    def timed(self: RoundLoop) -> object:
        wall, cpu = time.perf_counter(), tree_cpu_seconds(os.getpid())
        done = one_round(self)
        rows.append({"run": self.run_dir.name, "round": self.round, "wall": time.perf_counter() - wall,
                     "cpu": tree_cpu_seconds(os.getpid()) - cpu})
        return done

    RoundLoop._one_round = timed
    code = fedskew_main(["run", cfg, "--out", out, "--no-progress", *extra])
    Path(result).write_text(json.dumps(rows))
    raise SystemExit(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="workers (0 = auto)")
    ap.add_argument("--extra", nargs="*", default=[], help="more KEY=VALUE overrides for fedskew run")
    ap.add_argument("--threads-check", action="store_true", help="only the 1-vs-2-threads bit check")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        cfg_file, out_dir, result_file = args.child
        child(cfg_file, out_dir, result_file, args.extra)
    if args.threads_check:
        print(json.dumps(threads_check()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "w.toml"
        cfg.write_text(CONFIG.format(rounds=args.rounds, workers=args.workers))
        out, result = Path(tmp) / "out", Path(tmp) / "rounds.json"
        cmd = [sys.executable, __file__, "--child", str(cfg), str(out), str(result), "--extra", *args.extra]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=os.environ.copy())
        wall = time.perf_counter() - t0
        rows = json.loads(result.read_text())
        runs: dict[str, dict[str, object]] = {}
        for name in dict.fromkeys(str(r["run"]) for r in rows):  # in the order they ran
            mine = sorted((r for r in rows if r["run"] == name), key=lambda r: r["round"])
            figures: dict[str, object] = {"ran": len(runs) + 1}
            for what in ("wall", "cpu"):
                secs = [r[what] for r in mine]
                later = statistics.median(secs[1:]) if len(secs) > 1 else float("nan")
                figures[f"{what}_round1_s"] = round(secs[0], 2)
                figures[f"{what}_later_s"] = round(later, 2)
                figures[f"{what}_first_minus_later_s"] = round(secs[0] - later, 2)
            figures["metrics_sha256"] = hashlib.sha256((out / name / "metrics.jsonl").read_bytes()).hexdigest()[:16]
            runs[name] = figures
            print(f"{name:14s} wall: round 1 {figures['wall_round1_s']:6.2f} s, later {figures['wall_later_s']:6.2f} s "
                  f"({figures['wall_first_minus_later_s']:+6.2f})   CPU: round 1 {figures['cpu_round1_s']:6.2f} s, "
                  f"later {figures['cpu_later_s']:6.2f} s ({figures['cpu_first_minus_later_s']:+6.2f})   "
                  f"metrics {figures['metrics_sha256']}", flush=True)
        in_rounds = sum(float(r["wall"]) for r in rows)
        print(f"experiment wall {wall:.1f} s, of which outside the rounds {wall - in_rounds:.1f} s")
        print(json.dumps({"wall_s": round(wall, 2), "outside_rounds_s": round(wall - in_rounds, 2), "runs": runs,
                          "workers": args.workers, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
