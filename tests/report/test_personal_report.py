"""Issue 37, points 2 and 5: the per-client report of personalised methods.

One figure shows every method's client-accuracy distribution (global and own model), one row per method,
readable with 12 methods, each row saying what the method evaluates as a client's own model and how many
clients never trained; the table has the fraction of clients a method makes worse than ``local``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fedskew.report import comparison_table, load_run
from fedskew.report.client_plots import _own_label, plot_clients
from fedskew.runs import RunData
from tests.helpers.report_runs import write_run


def _runs(tmp_path: Path, methods: dict[str, list[list[float | None]]]) -> list[RunData]:
    """Fake runs of the given algorithms, each seed's last round holding the own-model vector given."""
    runs = []
    for name, vectors in methods.items():
        for seed, vec in enumerate(vectors):
            folder = tmp_path / f"{name}-seed{seed}"
            write_run(folder, name, seed, [0.3, 0.5])
            run = load_run(folder)
            for rec in run.records:
                rec.update(personal_accuracy=vec, untrained_clients=1 if name == "ditto" else 0)
            runs.append(run)
    return runs


def test_the_table_counts_the_clients_a_method_makes_worse_than_local(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {
        "local": [[0.5, 0.6, 0.7, None], [0.4, 0.4, 0.4, 0.4]],
        "ditto": [[0.6, 0.5, 0.7, 0.9], [0.3, 0.5, 0.5, 0.5]],  # worse: client 1 of seed 0, client 0 of seed 1
        "fedavg": [[0.1, 0.1, 0.1, 0.1]],  # seed 0 only: all 3 comparable clients worse
    })
    rows = {r["label"]: r for r in comparison_table(runs)}
    assert rows["ditto"]["worse_than_local"] == pytest.approx(100 * 2 / 7, abs=0.05)  # 3 + 4 clients compared
    assert rows["fedavg"]["worse_than_local"] == 100.0
    assert rows["local"]["worse_than_local"] is None  # local is the reference
    assert rows["ditto"]["untrained"] == 1 and rows["fedavg"]["untrained"] == 0
    without_local = comparison_table([r for r in runs if r.summary["algorithm"] != "local"])
    assert all(r["worse_than_local"] is None for r in without_local)


def test_one_figure_shows_a_dozen_methods_a_row_each(tmp_path: Path) -> None:
    names = ["local", "fedavg", "fedprox", "fedbn", "fedper", "fedrep", "fedbabu", "ditto", "apfl", "pfedme",
             "perfedavg", "fedala"]
    runs = _runs(tmp_path, {name: [[0.1 * k, 0.5, 0.9]] for k, name in enumerate(names)})
    for run in runs[1:]:
        for rec in run.records:
            rec["client_accuracy"] = [0.4, 0.5, 0.6]
    written = plot_clients(runs, tmp_path / "plots")
    assert written[0].name == "client_accuracy.png"
    from PIL import Image

    with Image.open(written[0]) as im:
        width, height = im.size
    assert height > width  # a row per method grows the figure downwards, not into unreadable columns
    ditto = _own_label([r for r in runs if r.summary["algorithm"] == "ditto"])
    assert "own: the personal model v_k" in ditto and "1 client never trained" in ditto
    fedavg = [r for r in runs if r.summary["algorithm"] == "fedavg"]
    assert "own: the global model" in _own_label(fedavg) and "never trained" not in _own_label(fedavg)
    tuned = [dataclasses.replace(fedavg[0], config={**fedavg[0].config, "eval": {"personalized_epochs": 2}})]
    assert "the global model, fine-tuned 2 epochs" in _own_label(tuned).replace("\n", " ")
