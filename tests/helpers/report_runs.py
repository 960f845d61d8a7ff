"""Run folders written by hand, shaped like the engine's, for the report's tests."""

from __future__ import annotations

import json
from pathlib import Path

from fedskew.metrics import class_variance, summarize_run


def write_run(folder: Path, algorithm: str, seed: int, acc: list[float]) -> None:
    """A run folder shaped like the engine's: config.toml, metrics.jsonl, summary.json."""
    folder.mkdir(parents=True)
    records = []
    for r, a in enumerate(acc, start=1):
        per_class = [min(1.0, a + 0.1), max(0.0, a - 0.1), a if r > 1 else None]
        records.append(
            {
                "round": r,
                "accuracy": a,
                "loss": 2.0 - a,
                "per_class_accuracy": per_class,
                "class_variance": class_variance(per_class),
                "bytes_server_to_client": 1_000_000,
                "bytes_client_to_server": 500_000,
                "bytes_client_to_client": 0,
                "clients": [0, 3],
                "samples": 128,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in records))
    summary = summarize_run(records, target=0.3, at_rounds=[3])
    summary.update(algorithm=algorithm, label=algorithm, seed=seed)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.toml").write_text(
        f'algorithm = "{algorithm}"\nseed = {seed}\nrounds = 5\nlr = {0.01 if algorithm == "fedavg" else 0.05}\n'
        "\n[data]\nalpha = 0.05\nclients = 50\n"
    )


def experiment_run(folder: Path, dataset: str, seed: int, acc: list[float], tau: float = 1.0) -> None:
    """:func:`write_run` of FedAvg, its config a full experiment's on ``dataset`` (runs of different experiments
    under one label)."""
    write_run(folder, "fedavg", seed, acc)
    (folder / "config.toml").write_text(
        f'seed = {seed}\n[dataset]\nname = "{dataset}"\ndata_dir = "/data/{seed}"\n'
        '[partition]\nname = "dirichlet"\nalpha = 0.1\n[model]\nname = "cnn"\n'
        f'[algorithm]\nname = "fedavg"\ntau = {tau}\n'
    )
