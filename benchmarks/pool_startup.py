"""Worker-pool start-up: what the first round of each run costs against its later rounds, in a grid.

An experiment of workload W (Fashion-MNIST, 100 clients, Dirichlet alpha=0.1 with the partition seed pinned
to 0, FedAvg, 10 clients a round, batch 32, McMahan et al.'s CNN) with two variants (lr 0.01 and 0.02) and
two seeds, ``--rounds`` rounds each, run by ``fedskew run`` in a subprocess (so ``PYTHONPATH`` picks the code
measured). Per run it prints round 1's seconds, the median of the later rounds and their difference
(from the run's ``timing.jsonl``), then the experiment's wall time and the part of it outside the rounds
(data, pool start-up, files), and each run's ``metrics.jsonl`` SHA-256, to compare two versions' results.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="workers (0 = auto)")
    ap.add_argument("--extra", nargs="*", default=[], help="more KEY=VALUE overrides for fedskew run")
    ap.add_argument("--threads-check", action="store_true", help="only the 1-vs-2-threads bit check")
    args = ap.parse_args()
    if args.threads_check:
        print(json.dumps(threads_check()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "w.toml"
        cfg.write_text(CONFIG.format(rounds=args.rounds, workers=args.workers))
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "fedskew.cli", "run", str(cfg), "--out", str(out), "--no-progress", *args.extra]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=os.environ.copy())
        wall = time.perf_counter() - t0
        runs = {}
        for run in sorted(p for p in out.iterdir() if (p / "timing.jsonl").is_file()):
            secs = [json.loads(line)["seconds"] for line in (run / "timing.jsonl").read_text().splitlines()]
            later = statistics.median(secs[1:]) if len(secs) > 1 else float("nan")
            runs[run.name] = {
                "round1_s": round(secs[0], 2), "later_s": round(later, 2),
                "first_minus_later_s": round(secs[0] - later, 2),
                "metrics_sha256": hashlib.sha256((run / "metrics.jsonl").read_bytes()).hexdigest()[:16],
                "round_s": [round(s, 2) for s in secs],
            }
            r = runs[run.name]
            print(f"{run.name:16s} round 1 {r['round1_s']:6.2f} s  later (median) {r['later_s']:6.2f} s  "
                  f"first - later {r['first_minus_later_s']:+6.2f} s  metrics {r['metrics_sha256']}", flush=True)
        in_rounds = sum(sum(r["round_s"]) for r in runs.values())
        print(f"experiment wall {wall:.1f} s, of which outside the rounds {wall - in_rounds:.1f} s")
        print(json.dumps({"wall_s": round(wall, 2), "outside_rounds_s": round(wall - in_rounds, 2), "runs": runs,
                          "workers": args.workers, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
