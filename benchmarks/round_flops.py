"""The FLOPs of a paper-scale condensation round's two halves, counted on the CPU (issue 45, point 4).

One matching step of all the round's clients and one server epoch of ``experiments/fedaf/fmnist_paper.toml``
(seed 0's partition), each as the difference of two whole one-round runs under ``FlopCounterMode`` (2 and 1
matching steps with no server epoch; 1 and 0 server epochs): the round's set-up and evaluation cancel. Divide
by a device's seconds for a step or an epoch (``benchmarks/gpu_check.py``'s paper parts) to get the TFLOP/s it
achieves. About 3 minutes for FedDM and 6 for FedAF on one core here.

    FEDSKEW_DATA=../shared/datasets python benchmarks/round_flops.py FedDM FedAF
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from condensation_round import PAPER, run_specs

from fedskew.engine.round_loop import RoundLoop


def total_flops(label: str, iterations: int, epochs: int, data_dir: str | None) -> int:
    """FLOPs of one round of the paper config's ``label`` variant, sequential, on the CPU."""
    overrides = {"rounds": 1, "seeds": [0], "device": "cpu", "checkpoint_every": 0, "workers": 1,
                 "algorithm.condense_iterations": iterations, "algorithm.server.epochs": epochs}
    [run] = run_specs(PAPER, [label], overrides)
    with tempfile.TemporaryDirectory() as tmp:
        loop = RoundLoop(run.typed, Path(tmp), data_dir=data_dir, progress=False)
        with FlopCounterMode(display=False) as counter:
            loop.run()
        return int(counter.get_total_flops())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", nargs="*", default=["FedDM", "FedAF"], help="variants of the paper config")
    ap.add_argument("--data-dir", default=os.environ.get("FEDSKEW_DATA"))
    args = ap.parse_args(argv)
    for label in args.labels:
        t0 = time.perf_counter()
        base = total_flops(label, 1, 0, args.data_dir)
        step = total_flops(label, 2, 0, args.data_dir) - base
        epoch = total_flops(label, 1, 1, args.data_dir) - base
        print(f"{label}: one matching step of all clients {step / 1e9:.1f} GFLOP, one server epoch "
              f"{epoch / 1e9:.1f} GFLOP ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
