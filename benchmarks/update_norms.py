"""Update norms of honest FedAvg clients, per round: what ``[algorithm.aggregation]``'s bounds face.

Runs the first rounds of a config (default: experiments/fmnist_fedavg.toml, 6 rounds, inline) and
prints, per round, the smallest, median and largest update norm (client model minus global model)
and the largest over the median, then a JSON line with the largest ratio seen.

    FEDSKEW_DATA=../shared/datasets python benchmarks/update_norms.py [CONFIG] [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import fedskew.algorithms.fedavg as fedavg_module
from fedskew.components.aggregate import robust_average, update_norms
from fedskew.config import read_config, resolve
from fedskew.engine.round_loop import RoundLoop


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else "experiments/fmnist_fedavg.toml"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    ratios: list[float] = []

    def observed(items: Any, weights: Any, reference: Any, cfg: Any) -> Any:
        norms = update_norms(items, reference)
        median = statistics.median(norms)
        ratios.append(max(norms) / median)
        print(f"round {len(ratios)}: min {min(norms):.3f}  median {median:.3f}  max {max(norms):.3f}  "
              f"max/median {ratios[-1]:.2f}", flush=True)
        return robust_average(items, weights, reference, cfg)

    fedavg_module.robust_average = observed  # type: ignore[assignment]
    typed = resolve(read_config(config), {"rounds": rounds, "workers": 1})[0].typed
    with tempfile.TemporaryDirectory() as tmp:
        RoundLoop(typed, Path(tmp), progress=False).run()
    print(json.dumps({"config": config, "rounds": rounds, "max_ratio": round(max(ratios), 3)}))


if __name__ == "__main__":
    main()
