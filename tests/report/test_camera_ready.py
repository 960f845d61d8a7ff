"""Issue 46: camera-ready figures (TrueType fonts, size, font size, titles and paper presets from the command
line, the config's ``[report]`` table and Python; titles without internal keys; equal line widths; class 0 on
top; one style for the report, the partition plot and the condensed grids), one report per experiment
(``report``, ``audit`` and ``--resume`` update ``EXP/report/``), and a line naming the keys on which the runs of
a report differ."""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from fedskew.cli import main
from fedskew.config import dump
from fedskew.core.errors import FedskewError
from fedskew.report import FigureStyle, find_runs, load_run, report, write_report
from fedskew.report.plots import experiment_title, plot_curves
from fedskew.report.tables import differing_settings
from fedskew.runs import report_folder
from tests.helpers.configs import tiny_config
from tests.helpers.report_runs import experiment_run, write_run


@pytest.mark.slow
def test_pdf_figures_embed_truetype_fonts_not_type3(tmp_path: Path) -> None:
    """Submission checks refuse Type 3 fonts, matplotlib's default in a PDF."""
    experiment_run(tmp_path / "exp" / "a", "fashion_mnist", 0, [0.2, 0.3, 0.4])
    report(tmp_path / "exp", tmp_path / "pdf", format="pdf")
    pdfs = sorted((tmp_path / "pdf").glob("*.pdf"))
    assert {p.stem for p in pdfs} >= {"accuracy", "bytes", "class_variance", "per_class_fedavg"}
    for pdf in pdfs:
        data = pdf.read_bytes()
        assert b"/Subtype /Type3" not in data, pdf.name
        assert b"/FontFile2" in data, pdf.name  # the TrueType font program, embedded
    import matplotlib

    assert matplotlib.rcParams["pdf.fonttype"] == 3  # the style applies to fedskew's figures only, then goes


def test_partition_plot_and_condensed_grids_share_the_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedskew.condense.grids import labelled_grid_figure
    from fedskew.core.figures import DEFAULT_STYLE
    from fedskew.data.partition_plot import bubble_plot, heatmap_plot

    counts = np.array([[5, 0, 3], [0, 7, 1]])
    for draw in (bubble_plot, heatmap_plot):
        pdf = draw(counts, tmp_path / f"{draw.__name__}.pdf", "digits, Dirichlet α=0.1").read_bytes()
        assert b"/Subtype /Type3" not in pdf and b"/FontFile2" in pdf
    drawn: list[Figure] = []
    original = Figure.savefig

    def spy(self: Figure, *args: object, **kwargs: object) -> None:
        drawn.append(self)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", spy)
    bubble_plot(counts, tmp_path / "b.png")
    heatmap_plot(counts, tmp_path / "h.png")
    for fig in drawn:  # class 0 on top, as in the report's per-class heat maps
        assert fig.axes[0].yaxis_inverted()
    with Image.open(tmp_path / "b.png") as png:
        assert png.info["dpi"][0] == pytest.approx(DEFAULT_STYLE.dpi, abs=1)  # the report's dpi, not 100
    with DEFAULT_STYLE.context():
        grid = labelled_grid_figure(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.tensor([0, 1]), title="t")
        grid.savefig(tmp_path / "grid.pdf")
    assert b"/Subtype /Type3" not in (tmp_path / "grid.pdf").read_bytes()


def test_size_font_titles_and_presets_from_the_command_line(tmp_path: Path, figures: dict[str, Figure]) -> None:
    experiment_run(tmp_path / "exp" / "a", "fashion_mnist", 0, [0.2, 0.3, 0.4])
    assert main(["report", str(tmp_path / "exp"), "--preset", "single", "--no-titles", "--no-progress"]) == 0
    acc = figures["accuracy"]
    assert acc.get_size_inches() == pytest.approx((3.3, 4.5 * 3.3 / 7))
    assert acc.axes[0].get_title() == "" and not acc.axes[0].xaxis.label.get_fontsize() > 8
    assert acc.axes[0].xaxis.label.get_fontsize() == pytest.approx(8)  # the preset's 8 pt
    assert all(not fig.axes[0].get_title() for fig in figures.values())
    figures.clear()
    assert main(["report", str(tmp_path / "exp"), "--width", "5", "--height", "2.5", "--font-size", "12",
                 "--preset", "double", "--no-progress"]) == 0
    acc = figures["accuracy"]
    assert acc.get_size_inches() == pytest.approx((5, 2.5))  # width and height win over the preset
    assert acc.axes[0].xaxis.label.get_fontsize() == pytest.approx(12)
    assert acc.axes[0].get_title() == "Fashion-MNIST, Dirichlet α=0.1"
    assert main(["report", str(tmp_path / "exp"), "--width", "0.1"]) == 2  # one line, as every bad input


@pytest.mark.slow
def test_the_config_table_and_python_set_the_look(tmp_path: Path, figures: dict[str, Figure]) -> None:
    run = tmp_path / "exp" / "a"
    experiment_run(run, "digits", 0, [0.2, 0.3, 0.4])
    with (run / "config.toml").open("a") as f:  # what a run of a config with a [report] table records
        f.write('[report]\npreset = "double"\ntitles = false\nformat = "pdf"\n')
    write_report([tmp_path / "exp"])
    assert (tmp_path / "exp" / "report" / "accuracy.pdf").is_file()
    assert figures["accuracy"].get_size_inches()[0] == pytest.approx(6.9)
    assert figures["accuracy"].axes[0].get_title() == ""
    figures.clear()
    report(tmp_path / "exp", tmp_path / "py", width=4, titles=True, format="svg")  # the table, changed
    assert figures["accuracy"].get_size_inches()[0] == pytest.approx(4)
    assert figures["accuracy"].axes[0].get_title() != "" and (tmp_path / "py" / "accuracy.svg").is_file()
    style = FigureStyle(preset="single").updated(font_size=7)
    assert style.font == 7 and style.size(7, 3.5) == pytest.approx((3.3, 1.65))
    with pytest.raises(FedskewError, match="preset must be one of"):
        FigureStyle(preset="poster")  # type: ignore[arg-type]


def test_a_config_report_table_is_checked_and_recorded_only_when_set(tmp_path: Path) -> None:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.config.schema import full_config

    spec = resolve(read_config("default"), parse_overrides(["report.preset=single", "report.titles=false"]),
                   where="default")[0]
    assert spec.typed.report == FigureStyle(preset="single", titles=False)
    assert full_config(spec.config)["report"] == {"preset": "single", "titles": False}
    assert "report" not in full_config(resolve(read_config("default"), {}, where="default")[0].config)
    for bad, needle in (("report.widht=3", "unknown key 'report.widht'"), ("report.format=jpg", "report.format"),
                        ("report.font_size=1", "report.font_size must be points in [4, 40]")):
        with pytest.raises(FedskewError, match=re.escape(needle)):
            _ = resolve(read_config("default"), parse_overrides([bad]), where="default")[0].typed


def test_titles_name_the_partition_without_internal_keys(tmp_path: Path) -> None:
    experiment_run(tmp_path / "a", "fashion_mnist", 0, [0.2, 0.3])
    text = (tmp_path / "a" / "config.toml").read_text()
    (tmp_path / "a" / "config.toml").write_text(text.replace(
        "alpha = 0.1\n", "alpha = 0.1\nmin_size = 10\nmax_retries = 1000\nnum_clients = 100\nseed = 3\n"))
    title = experiment_title([load_run(tmp_path / "a")])
    assert title == "Fashion-MNIST, Dirichlet α=0.1, 100 clients"


def test_long_labels_put_the_legend_below_and_heat_maps_show_class_0_on_top(tmp_path: Path,
                                                                           figures: dict[str, Figure]) -> None:
    """A legend beside the axes squeezed them to half the figure's width."""
    for i, name in enumerate(("FedAvg (partition.alpha=0.1, algorithm.lr=0.05)",
                              "FedProx (partition.alpha=0.1, algorithm.lr=0.05)")):
        write_run(tmp_path / str(i), "fedavg", 0, [0.1, 0.2, 0.3])
        summary = json.loads((tmp_path / str(i) / "summary.json").read_text())
        (tmp_path / str(i) / "summary.json").write_text(json.dumps({**summary, "label": name}))
    plot_curves([load_run(p) for p in find_runs([tmp_path])], tmp_path / "plots")
    fig = figures["accuracy"]
    FigureCanvasAgg(fig).draw()
    assert fig.legends and not fig.axes[0].get_legend()  # the figure's legend, below the axes
    assert fig.axes[0].get_position().width > 0.75  # the axes keep (nearly) the figure's width
    heat = next(f for name, f in figures.items() if name.startswith("per_class_"))
    assert heat.axes[0].yaxis_inverted()  # class 0 on top


def test_a_report_says_in_one_line_which_keys_its_experiments_differ_in(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    experiment_run(tmp_path / "big" / "cnn", "digits", 0, [0.5, 0.6])
    experiment_run(tmp_path / "small" / "convnet", "fashion_mnist", 0, [0.7, 0.8])
    for folder, label, model, rounds in (("big/cnn", "CNN", "cnn", 5), ("small/convnet", "ConvNet", "convnet", 2)):
        path = tmp_path / folder
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps({**summary, "label": label, "rounds": rounds}))
        (path / "config.toml").write_text((path / "config.toml").read_text().replace('"cnn"', f'"{model}"'))
    runs = [load_run(p) for p in find_runs([tmp_path])]
    assert differing_settings(runs) == ["dataset.name", "model.name", "rounds"]  # data_dir is not the experiment
    assert main(["report", str(tmp_path / "big"), str(tmp_path / "small"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "different experiments" in line]
    assert len(lines) == 1 and "dataset.name, model.name, rounds" in lines[0]
    page = (tmp_path / "report" / "report.html").read_text()
    assert "they differ in dataset.name, model.name, rounds" in page
    assert "<td><b>" not in page  # no best value marked across experiments
    experiment_run(tmp_path / "same" / "s1", "digits", 1, [0.5, 0.7])
    experiment_run(tmp_path / "same" / "s2", "digits", 2, [0.5, 0.8])  # seeds: one experiment
    assert differing_settings([load_run(p) for p in find_runs([tmp_path / "same"])]) == []


def test_a_one_run_experiment_has_one_report_folder(tmp_path: Path) -> None:
    """``fedskew report EXP`` of a one-run experiment updates EXP/report/ (the one ``fedskew run`` printed), not
    EXP/<run>/report/; a report of one run of several stays in the run's folder (the experiment's is kept)."""
    exp = tmp_path / "exp"
    experiment_run(exp / "FedAvg-seed0", "digits", 0, [0.2, 0.3])
    assert main(["report", str(exp), "--no-progress"]) == 0
    assert (exp / "report" / "report.html").is_file() and not (exp / "FedAvg-seed0" / "report").exists()
    page = (exp / "report" / "report.html").read_text()
    assert f"1 run(s) under <code>{exp.resolve()}</code>" in page and "<td>FedAvg-seed0</td>" in page
    assert report_folder([exp / "FedAvg-seed0"]) == (exp / "report").resolve()
    experiment_run(exp / "FedAvg-seed1", "digits", 1, [0.2, 0.4])
    assert report_folder([exp / "FedAvg-seed1"]) == (exp / "FedAvg-seed1" / "report").resolve()
    assert report_folder(find_runs([exp])) == (exp / "report").resolve()


@pytest.mark.slow
def test_resume_and_audit_update_the_experiment_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedskew run --resume RUN`` of a one-run experiment brought EXP/RUN/report/ into being and left EXP/report/
    stale; the audit's table went to the same wrong place."""
    cfg = tiny_config(rounds=1)
    cfg_file = tmp_path / "tiny.toml"
    cfg_file.write_text(dump(cfg))
    exp = tmp_path / "exp"
    assert main(["run", str(cfg_file), "--out", str(exp), "--no-progress"]) == 0
    run_dir = exp / "tiny-seed0"
    def rounds() -> str:
        with (exp / "report" / "results.csv").open() as f:
            return next(csv.DictReader(f))["rounds"]

    assert rounds() == "1"
    assert main(["run", "--resume", str(run_dir), "rounds=2", "report.format=svg", "--no-progress"]) == 0
    assert not (run_dir / "report").exists()
    assert rounds() == "2"  # the experiment's report has the resumed run's rounds
    assert (exp / "report" / "accuracy.svg").is_file()  # and the look the resume asked for, recorded:
    assert tomllib.loads((run_dir / "config.toml").read_text())["report"] == {"format": "svg"}

    from fedskew.cli import audit as audit_command

    monkeypatch.setattr("fedskew.audit.audit", lambda *a, **k: [])  # the audit itself is tests/test_audit's
    monkeypatch.setattr("fedskew.audit.format_audit", lambda results: "")
    written: list[Path | None] = []
    original = audit_command.experiment_report

    def spy(run_dirs: list[Path]) -> tuple[list[Path], Path | None]:
        runs, folder = original(run_dirs)
        written.append(folder)
        return runs, folder

    monkeypatch.setattr(audit_command, "experiment_report", spy)
    assert main(["audit", str(run_dir), "--no-progress"]) == 0
    assert written == [exp.resolve() / "report"] and not (run_dir / "report").exists()


def test_fedskew_partition_names_the_data_as_the_report_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The partition plot's title had the raw names and every key (``min_size=5``); it is a PDF where asked."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(dump(tiny_config(rounds=1)))
    titles: list[str] = []
    original = Figure.savefig

    def spy(self: Figure, *args: object, **kwargs: object) -> None:
        titles.append(self.axes[0].get_title())
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", spy)
    assert main(["partition", str(cfg), "--out", str(tmp_path / "p.pdf")]) == 0
    assert titles == ["synthetic data, Dirichlet α=0.5, 6 clients"]
    assert b"/Subtype /Type3" not in (tmp_path / "p.pdf").read_bytes()
