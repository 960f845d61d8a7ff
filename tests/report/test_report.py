"""Tests of the report on small, hand-checkable fake run folders (2 labels x 2 seeds, 5 rounds)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedskew.core.errors import FedskewError
from fedskew.report import (
    comparison_table,
    find_runs,
    format_table,
    load_run,
    write_report,
    write_table,
)
from fedskew.report.tables import table_cells
from tests.helpers.report_runs import experiment_run, write_run

CURVES = {
    ("fedavg", 0): [0.10, 0.30, 0.20, 0.45, 0.50],
    ("fedavg", 1): [0.10, 0.30, 0.25, 0.50, 0.54],
    ("feddc", 0): [0.20, 0.25, 0.30, 0.35, 0.40],
    ("feddc", 1): [0.20, 0.30, 0.30, 0.35, 0.40],
}


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    root = tmp_path / "exp"
    for (algorithm, seed), acc in CURVES.items():
        write_run(root / f"{algorithm}_s{seed}", algorithm, seed, acc)
    return root


def test_find_runs_recursive_and_sorted(experiment: Path) -> None:
    runs = find_runs([experiment])
    assert [p.name for p in runs] == ["fedavg_s0", "fedavg_s1", "feddc_s0", "feddc_s1"]
    assert find_runs([experiment / "feddc_s1", experiment]) == runs  # a run folder given directly


def test_find_runs_errors_name_the_paths(tmp_path: Path) -> None:
    with pytest.raises(FedskewError, match="empty"):
        find_runs([tmp_path / "empty"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedskewError, match="empty"):
        find_runs([tmp_path / "empty"])


def test_load_run_label_and_records(experiment: Path) -> None:
    run = load_run(experiment / "fedavg_s1")
    assert run.label == "fedavg"
    assert [r["round"] for r in run.records] == [1, 2, 3, 4, 5]
    assert run.config["data"]["alpha"] == 0.05
    summary = json.loads((experiment / "fedavg_s1" / "summary.json").read_text())
    del summary["label"]
    (experiment / "fedavg_s1" / "summary.json").write_text(json.dumps(summary))
    assert load_run(experiment / "fedavg_s1").label == "fedavg_s1"  # falls back to the folder name


def test_missing_or_corrupt_files_raise_naming_the_file(experiment: Path) -> None:
    (experiment / "fedavg_s0" / "summary.json").unlink()
    with pytest.raises(FedskewError, match=r"summary\.json"):
        load_run(experiment / "fedavg_s0")
    # an interrupted run (metrics, no summary) is not silently left out of a report
    with pytest.raises(FedskewError, match=r"summary\.json"):
        write_report([experiment])
    with (experiment / "feddc_s0" / "metrics.jsonl").open("a") as f:
        f.write('{"round": 6, "accur\n')
    with pytest.raises(FedskewError, match=r"metrics\.jsonl, line 6"):
        load_run(experiment / "feddc_s0")
    (experiment / "feddc_s1" / "summary.json").write_text('{"algorithm": "feddc"}')
    with pytest.raises(FedskewError, match="lacks rounds"):
        load_run(experiment / "feddc_s1")


def test_comparison_table_aggregates_seeds_by_hand(experiment: Path) -> None:
    rows = comparison_table([load_run(p) for p in find_runs([experiment])])
    assert [r["label"] for r in rows] == ["fedavg", "feddc"]
    fedavg, feddc = rows
    assert fedavg["n"] == feddc["n"] == 2
    assert fedavg["rounds"] == 5
    # final 50 and 54 %: mean 52, sample std sqrt((2^2 + 2^2) / 1) = 2.83
    assert fedavg["final_acc"] == 52.0 and fedavg["final_acc_std"] == 2.83
    assert fedavg["best_acc"] == 52.0
    assert feddc["final_acc"] == 40.0 and feddc["final_acc_std"] == 0.0
    # accuracy at round 3: 20 and 25 %
    assert fedavg["acc@3"] == 22.5 and fedavg["acc@3_std"] == 3.54
    # largest drops -10 and -5 points; fedavg rises: (20+25+5)/3 and (20+25+4)/3
    assert fedavg["max_drop"] == -7.5 and fedavg["max_drop_std"] == 3.54
    assert fedavg["mean_drop"] == -7.5 and fedavg["mean_drop_std"] == 3.54
    assert fedavg["mean_rise"] == pytest.approx((50 / 3 + 49 / 3) / 2, abs=0.005)
    assert feddc["max_drop"] == 0.0
    # 5 rounds x 1 MB down and 0.5 MB up, identical for every seed
    assert (fedavg["mb_server_to_client"], fedavg["mb_client_to_server"]) == (5.0, 2.5)
    # seeds reach 30 % at rounds 2 and 2 (fedavg) / 3 and 2 (feddc); 1.5 MB per round
    assert fedavg["rounds_to_target"] == 2.0 and fedavg["mb_to_target"] == 3.0
    assert feddc["rounds_to_target"] == 2.5 and feddc["mb_to_target"] == 3.75


def test_single_run_has_no_std(experiment: Path) -> None:
    (row,) = comparison_table([load_run(experiment / "feddc_s0")])
    assert row["n"] == 1 and row["final_acc"] == 40.0 and row["final_acc_std"] is None
    assert row["max_drop_std"] is None and row["class_var_std"] is None


def test_tables_written_and_formatted(experiment: Path, tmp_path: Path) -> None:
    rows = comparison_table([load_run(p) for p in find_runs([experiment])])
    text = format_table(rows)
    assert "52.00 ± 2.83" in text and "feddc" in text
    assert "-7.50 ± 3.54" in text  # the stability columns carry the seeds' std too
    lines = text.splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines[:2]}) == 1
    md, csv_path = write_table(rows, tmp_path / "out")
    assert md.read_text().startswith("| label |") and "52.00 ± 2.83" in md.read_text()
    with csv_path.open() as f:
        read = list(csv.DictReader(f))
    assert [r["n"] for r in read] == ["2", "2"]
    assert float(read[0]["final_acc_std"]) == 2.83


def test_write_report(experiment: Path) -> None:
    html_path = write_report([experiment])
    out = experiment / "report"
    assert html_path == out / "report.html"
    for name in ("accuracy", "class_variance", "bytes", "per_class_fedavg", "per_class_feddc"):
        png = out / f"{name}.png"
        assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 1000
    assert (out / "results.md").is_file() and (out / "results.csv").is_file()
    page = html_path.read_text()
    assert page.count("data:image/png;base64,") == 5
    assert "fedavg" in page and "feddc" in page
    assert "<th>lr</th><" in page and "<td>data.alpha</td>" in page  # differing and shared config values
    assert page.count("<th>seed</th>") == 1  # config keys shown from the summary are not repeated


# ---- runs of different experiments under one label -------------------------------------------------------
def test_one_label_over_two_datasets_is_refused_and_group_by_shows_them_apart(tmp_path: Path) -> None:
    from fedskew.report import separate_experiments

    experiment_run(tmp_path / "digits" / "s0", "digits", 0, [0.8, 0.9])
    experiment_run(tmp_path / "fmnist" / "s1", "fashion_mnist", 1, [0.1, 0.2])
    experiment_run(tmp_path / "fmnist" / "s2", "fashion_mnist", 2, [0.2, 0.3], tau=2.0)  # data_dir differs too
    runs = [load_run(p) for p in find_runs([tmp_path])]
    with pytest.raises(FedskewError, match=r"runs labelled 'fedavg' come from different experiments \(dataset.name: "
                       r"'digits' vs 'fashion_mnist'; .*--group-by dataset.name$"):
        write_report([tmp_path])
    assert not (tmp_path / "report").exists()
    rows = comparison_table(separate_experiments(runs, ["dataset.name"]))
    assert {r["label"]: r["n"] for r in rows} == {"fedavg (dataset.name=digits)": 1,
                                                  "fedavg (dataset.name=fashion_mnist)": 2}
    by_tau = separate_experiments(runs[1:], ["algorithm.tau"])  # one method's settings, side by side
    assert [r.label for r in by_tau] == ["fedavg (algorithm.tau=1.0)", "fedavg (algorithm.tau=2.0)"]
    assert write_report([tmp_path], group_by=["dataset.name"]).is_file()


def test_group_by_shows_an_unset_option_at_its_default_and_an_absent_one_as_a_dash(tmp_path: Path) -> None:
    from fedskew.report import separate_experiments

    experiment_run(tmp_path / "avg" / "s0", "digits", 0, [0.8, 0.9])
    write_run(tmp_path / "af" / "s0", "fedaf", 0, [0.5, 0.6])
    (tmp_path / "af" / "s0" / "config.toml").write_text(
        'seed = 0\n[dataset]\nname = "digits"\n[partition]\nname = "dirichlet"\nalpha = 0.1\n'
        '[model]\nname = "cnn"\n[algorithm]\nname = "fedaf"\nkl_reduction = "mean"\n')
    runs = separate_experiments([load_run(p) for p in find_runs([tmp_path])],
                                ["algorithm.kl_reduction", "algorithm.tau"])
    labels = sorted(r.label for r in runs)
    # FedAF's unset tau is its default 1.0; FedAvg has neither option
    assert labels == ["fedaf (algorithm.kl_reduction=mean, algorithm.tau=1.0)",
                      "fedavg (algorithm.kl_reduction=-, algorithm.tau=1.0)"]


@pytest.mark.slow
def test_report_label_template_relabels_runs_and_a_bad_key_is_one_line(tmp_path: Path) -> None:
    from fedskew.report import separate_experiments
    from tests.helpers.cli import fedskew, one_error

    experiment_run(tmp_path / "t1" / "s0", "digits", 0, [0.8, 0.9], tau=1.0)
    experiment_run(tmp_path / "t2" / "s0", "digits", 0, [0.1, 0.2], tau=2.0)
    rows = comparison_table(separate_experiments([load_run(p) for p in find_runs([tmp_path])],
                                                 label="{label} tau={algorithm.tau}"))
    assert {r["label"]: r["final_acc"] for r in rows} == {"fedavg tau=1.0": 90.0, "fedavg tau=2.0": 20.0}
    res = fedskew("report", "t1", "t2", "--label", "{label}, tau {algorithm.tau}", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "fedavg, tau 1.0" in res.out and "fedavg, tau 2.0" in res.out
    assert "fedavg, tau 2.0" in (tmp_path / "report" / "results.md").read_text()
    line = one_error(fedskew("report", "t1", "--label", "{algorithm.nope}", cwd=tmp_path))
    assert "{algorithm.nope} is not a key of the run's config" in line


@pytest.mark.slow
def test_the_mixed_report_is_one_line_on_the_command_line(tmp_path: Path) -> None:
    from tests.helpers.cli import fedskew, one_error

    experiment_run(tmp_path / "a" / "s0", "digits", 0, [0.8, 0.9])
    experiment_run(tmp_path / "b" / "s1", "fashion_mnist", 1, [0.1, 0.2])
    line = one_error(fedskew("report", "a", "b", cwd=tmp_path))
    assert "come from different experiments" in line and "--group-by dataset.name" in line
    res = fedskew("report", "a", "b", "--group-by", "dataset.name", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "fedavg (dataset.name=digits)" in res.out and "fedavg (dataset.name=fashion_mnist)" in res.out


# ---- what the page says about its figures and columns -----------------------------------------------------
def test_the_best_value_of_each_column_is_bold_and_figures_have_captions(experiment: Path) -> None:
    from fedskew.report.html import best_cells, caption

    rows = comparison_table([load_run(p) for p in find_runs([experiment])])
    keys = ["label", "final_acc", "max_drop", "class_var", "mb_server_to_client"]
    best = best_cells(rows, keys)
    final = [row["final_acc"] for row in rows]
    assert (final.index(max(final)), 1) in best and (final.index(min(final)), 1) not in best
    drops = [row["max_drop"] for row in rows]  # negative points: the best is the one closest to 0
    assert (drops.index(max(drops)), 2) in best
    variances = [row["class_var"] for row in rows]
    assert (variances.index(min(variances)), 3) in best
    assert not any(j in (0, 4) for _, j in best)  # labels and traffic have no "best"
    assert best_cells(rows[:1], keys) == set()
    assert caption("per_class_FedAvg").startswith("Per-class test accuracy") and caption("per_class_FedAvg").endswith(
        "(FedAvg)"
    )
    page = write_report([experiment]).read_text()
    assert "<td><b>" in page and "Test accuracy of the global model per evaluated round" in page
    assert 'href="../fedavg_s0/config.toml"' in page and 'href="../feddc_s1/metrics.jsonl"' in page


def test_a_partition_title_names_what_the_partition_is_not_how_it_is_drawn() -> None:
    from fedskew.core.figures import partition_title

    options = {"classes": 2, "assignment": "niid_bench", "min_size": 10}
    assert partition_title("classes_per_client", 10, options) == "classes per client #C=2, 10 clients"
    assert partition_title("dirichlet", None, {"alpha": 0.5, "min_size": 10}) == "Dirichlet α=0.5"


def test_plot_titles_name_the_experiment_and_centralised_is_a_reference_line(tmp_path: Path) -> None:
    from fedskew.report.plots import experiment_title, plot_curves

    experiment_run(tmp_path / "a", "fashion_mnist", 0, [0.3, 0.4])
    experiment_run(tmp_path / "b", "fashion_mnist", 1, [0.5, 0.6])
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    (tmp_path / "b" / "summary.json").write_text(json.dumps({**summary, "algorithm": "centralized", "label": "C"}))
    runs = [load_run(p) for p in find_runs([tmp_path])]
    assert experiment_title(runs) == "Fashion-MNIST, Dirichlet α=0.1"  # built-in datasets by their title
    experiment_run(tmp_path / "p", "my_plugin_data", 0, [0.3, 0.4])
    assert experiment_title([load_run(tmp_path / "p")]) == "my_plugin_data, Dirichlet α=0.1"
    experiment_run(tmp_path / "c", "digits", 0, [0.3, 0.4])
    assert experiment_title([load_run(p) for p in find_runs([tmp_path])]).startswith("several datasets")

    import matplotlib.axes

    lines: list[float] = []
    original = matplotlib.axes.Axes.axhline

    def spy(self: matplotlib.axes.Axes, y: float = 0, *args: object, **kwargs: object) -> object:
        lines.append(y)
        return original(self, y, *args, **kwargs)

    matplotlib.axes.Axes.axhline = spy  # type: ignore[method-assign]
    try:
        plot_curves(runs, tmp_path / "plots")
    finally:
        matplotlib.axes.Axes.axhline = original  # type: ignore[method-assign]
    assert lines == [pytest.approx(60.0)]  # the centralised run's best, drawn once as a horizontal line


def test_client_plots_and_columns_come_with_a_per_client_evaluation(experiment: Path, tmp_path: Path) -> None:
    from fedskew.report.client_plots import plot_clients

    runs = [load_run(p) for p in find_runs([experiment])]
    assert plot_clients(runs, tmp_path / "none") == []  # no per-client evaluation: no plot
    for run in runs:
        for i, rec in enumerate(run.records):
            vec = [rec["accuracy"] - 0.1 * k for k in range(3)]
            rec.update(personal_accuracy=vec, personal_accuracy_mean=sum(vec) / 3, personal_accuracy_worst10=min(vec))
            if i == len(run.records) - 1:
                run.summary.update(personal_mean_final=sum(vec) / 3, personal_worst10_final=min(vec))
    written = plot_clients(runs, tmp_path / "plots")
    assert [p.name for p in written] == ["client_accuracy.png", "client_curves.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    rows = comparison_table(runs)
    fedavg = next(r for r in rows if r["label"] == "fedavg")
    assert fedavg["personal_worst10"] == pytest.approx(100 * (0.52 - 0.2), abs=0.01)  # mean of seeds' last
    assert fedavg["client_mean"] is None  # no global-model vector in these runs


def test_the_terminal_table_fits_120_columns_and_counts_print_as_integers(experiment: Path) -> None:
    rows = comparison_table([load_run(p) for p in find_runs([experiment])])
    for row in rows:
        row["label"] = "a label far longer than any terminal column should be, " + row["label"]
    full = format_table(rows)
    assert max(len(line) for line in full.splitlines()) > 120  # what a terminal got before
    text = format_table(rows, max_width=120)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert lines[-1].endswith("more columns in results.md and results.csv)")
    # shortened in the middle (issue 46): the ends, which say the method or a --group-by setting, stay apart
    labels = [line[:40].rstrip() for line in lines[2:4]]
    assert all(label.startswith("a label far") and "..." in label and len(label) == 40 for label in labels)
    assert {label.rsplit(" ", 1)[-1] for label in labels} == {"fedavg", "feddc"}
    single = comparison_table([load_run(experiment / "feddc_s0")])
    single[0]["rounds_to_target"] = 5.0
    headers, cells = table_cells(single)
    assert cells[0][headers.index("rounds to target")] == "5"
    single[0]["rounds_to_target"], single[0]["rounds_to_target_std"] = 2.5, 0.71
    headers, cells = table_cells(single)
    assert cells[0][headers.index("rounds to target")] == "2.5 ± 0.7"
