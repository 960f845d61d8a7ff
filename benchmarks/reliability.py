"""Figures for docs/reliability.md: runs under simulated dropout, stragglers and corrupted replies.

    python benchmarks/reliability.py

Digits, 10 clients (Dirichlet alpha=0.5), FedAvg with 5 clients per round, 30 rounds. Prints, per
fault setting, the rounds completed, clients failed or rejected, and best/final accuracy, against the
fault-free run; the last line is a JSON object.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedskew.config.schema import typed_config
from fedskew.engine.round_loop import RoundLoop

BASE: dict[str, Any] = {
    "name": "reliability", "label": "fedavg", "rounds": 30, "seed": 0, "workers": 1, "eval_every": 1,
    "checkpoint_every": 10, "target_accuracy": None, "at_rounds": [],
    "dataset": {"name": "digits"},
    "partition": {"name": "dirichlet", "num_clients": 10, "alpha": 0.5, "seed": 0},
    "model": {"name": "cnn"},
    "algorithm": {"name": "fedavg", "clients_per_round": 5, "local_epochs": 2, "batch_size": 32, "lr": 0.05,
                  "momentum": 0.5},
}
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("no faults", {}),
    ("30% dropout", {"dropout": 0.3}),
    ("30% dropout + 10% stragglers", {"dropout": 0.3, "straggler": 0.1}),
    *[(f"20% corrupt ({a})", {"corrupt": 0.2, "attack": a, "max_reply_mb": 5.0})
      for a in ("nan", "inf", "shape", "dtype", "missing", "extra", "oversized", "not_message")],
]


def main() -> None:
    out: dict[str, Any] = {}
    print("| setting | rounds completed | replies accepted | failed (dropout/straggler) | rejected | best acc "
          "| final acc | model finite |")
    print("|---|---|---|---|---|---|---|---|")
    for name, faults in SETTINGS:
        cfg = {**BASE, "faults": faults}
        with tempfile.TemporaryDirectory() as tmp:
            res = RoundLoop(typed_config(cfg), Path(tmp), progress=False).run()
            model = torch.load(Path(tmp) / "model.pt", weights_only=True)
        recs = res.records
        accepted = sum(len(r["clients"]) for r in recs)
        failed = sum(len(r["failed"]) for r in recs)
        rejected = sum(len(r["rejected"]) for r in recs)
        finite = all(bool(torch.isfinite(v).all()) for v in model.values() if v.is_floating_point())
        s = res.summary
        print(f"| {name} | {len(recs)}/{cfg['rounds']} | {accepted} | {failed} | {rejected} | "
              f"{100 * s['best_accuracy']:.1f}% | {100 * s['final_accuracy']:.1f}% | {finite} |", flush=True)
        out[name] = {"rounds": len(recs), "accepted": accepted, "failed": failed, "rejected": rejected,
                     "best_accuracy": s["best_accuracy"], "final_accuracy": s["final_accuracy"], "finite": finite}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
