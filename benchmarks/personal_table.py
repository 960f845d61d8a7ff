"""Per-client accuracy of finished runs, mean +- std over seeds: the peer-table rows of docs/results.md.

    FEDSKEW_DATA=../shared/datasets python benchmarks/personal_table.py RUN_FOLDER...

Groups the run folders by label and prints one Markdown row per label: the number of seeds, then, in the
last evaluated round, the clients' own models' accuracy two ways, the mean over clients (fedskew's
``personal_accuracy_mean``) and the pooled accuracy (correct predictions over all clients' test samples,
what PFLlib and so the FedALA paper report), the worst 10% of clients, and the global model's test
accuracy where the method has one. The pooled figure weights each client by its test split, whose sizes
come from rebuilding the run's federation (its config.toml; loads the dataset once per partition).
"""

from __future__ import annotations

import json
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedskew.config.schema import component
from fedskew.engine.federation import build_federation


def _stat(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}"


def _last_with(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get(key) is not None), None)


def main(folders: list[str]) -> None:
    sizes_of: dict[str, list[int]] = {}
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for folder in map(Path, folders):
        if not (folder / "summary.json").is_file():
            continue  # unfinished
        cfg = tomllib.loads((folder / "config.toml").read_text())
        tables = [cfg[s] for s in ("dataset", "partition", "model")]  # the config.toml's own tables
        key = json.dumps([*tables, cfg["seed"]], sort_keys=True)
        if key not in sizes_of:
            names = ("dataset", "partition", "model")
            dataset, partition, model = (component(s, t) for s, t in zip(names, tables, strict=True))
            sizes_of[key] = build_federation(dataset, partition, model, int(cfg["seed"])).client_test_sizes()
        sizes = sizes_of[key]
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
        rec = _last_with(records, "personal_accuracy_mean")
        if rec is None:
            continue
        acc = rec["personal_accuracy"]
        pairs = [(a, n) for a, n in zip(acc, sizes, strict=True) if a is not None and n > 0]
        row = rows[str(cfg["label"])]
        row["mean"].append(100 * rec["personal_accuracy_mean"])
        row["pooled"].append(100 * sum(a * n for a, n in pairs) / sum(n for _, n in pairs))
        row["worst10"].append(100 * rec["personal_accuracy_worst10"])
        glob_rec = _last_with(records, "accuracy")
        if glob_rec is not None:
            row["global"].append(100 * glob_rec["accuracy"])
    print("| method | seeds | own model, pooled % | own model, mean over clients % | worst 10% of clients % "
          "| global model % |")
    print("|---|---|---|---|---|---|")
    for label, row in rows.items():
        n = len(row["mean"])
        print(f"| {label} | {n} | {_stat(row['pooled'])} | {_stat(row['mean'])} | {_stat(row['worst10'])} | "
              f"{_stat(row['global'])} |")


if __name__ == "__main__":
    main(sys.argv[1:])
