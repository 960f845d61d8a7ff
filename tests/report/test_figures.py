"""Figures a paper can use (issue 36, point 1): every curve told apart, colour = method and line style = the
grouped setting, png/pdf/svg at a chosen dpi, nothing clipped, condensed-image grids named by class, and
runs in the config's order."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image
from safetensors.torch import save_file

from fedskew.cli import main
from fedskew.core.errors import FedskewError
from fedskew.report import find_runs, load_run, report, write_report
from fedskew.report.plots import line_styles, plot_curves, synthetic_grids
from tests.helpers.report_runs import experiment_run, write_run


def _relabel(folder: Path, label: str, **config: Any) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "label": label}))
    if config:
        text = (folder / "config.toml").read_text()
        for key, value in config.items():
            table, name = key.split(".")
            text = text.replace(f"[{table}]\n", f"[{table}]\n{name} = {json.dumps(value)}\n")
        (folder / "config.toml").write_text(text)


def test_identical_curves_are_both_visible(tmp_path: Path, figures: dict[str, Figure]) -> None:
    """FedAvg and FedProx at mu=0.01 drew one line: equal colours aside, the curves now differ in dashes and
    in where their markers sit."""
    acc = [min(0.9, 0.1 + 0.03 * r) for r in range(30)]
    for name in ("FedAvg", "FedProx", "SCAFFOLD"):
        write_run(tmp_path / name, "fedavg", 0, acc)
        _relabel(tmp_path / name, name)
    plot_curves([load_run(p) for p in find_runs([tmp_path])], tmp_path / "plots")
    lines = [line for line in figures["accuracy"].axes[0].get_lines() if line.get_label()[0] != "_"]
    assert len(lines) == 3
    assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == 3
    assert len({str(line.get_markevery()) for line in lines}) == 3  # markers at different rounds
    # issue 46: every curve equally wide with equal markers (a method plotted last was the least visible)
    assert len({(line.get_linewidth(), line.get_markersize()) for line in lines}) == 1
    styles = line_styles([f"label {i}" for i in range(12)])
    assert len({(s["color"], s["linestyle"], s["marker"]) for s in styles.values()}) == 12


def test_group_by_gives_colour_to_the_method_and_line_style_to_the_setting(tmp_path: Path,
                                                                           figures: dict[str, Figure]) -> None:
    for method in ("FedAvg", "FedProx"):
        for i, alpha in enumerate((0.1, 0.5)):
            folder = tmp_path / f"{method}-a{alpha}"
            experiment_run(folder, "digits", 0, [0.2 + i / 10, 0.4, 0.5])
            (folder / "config.toml").write_text((folder / "config.toml").read_text().replace(
                "alpha = 0.1", f"alpha = {alpha}"))
            _relabel(folder, method)
    write_report([tmp_path], group_by=["partition.alpha"])
    # one heat map per label: "alpha=0.1" and "alpha=0.5" are not cut at the dot into one file name
    assert len(list((tmp_path / "report").glob("per_class_*.png"))) == 4
    lines = {line.get_label(): line for line in figures["accuracy"].axes[0].get_lines()}
    a, b = lines["FedAvg (partition.alpha=0.1)"], lines["FedAvg (partition.alpha=0.5)"]
    c, d = lines["FedProx (partition.alpha=0.1)"], lines["FedProx (partition.alpha=0.5)"]
    assert a.get_color() == b.get_color() != c.get_color() == d.get_color()
    assert a.get_linestyle() == c.get_linestyle() != b.get_linestyle() == d.get_linestyle()


@pytest.mark.slow
def test_formats_and_dpi(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", "fedavg", 0, [0.1, 0.2, 0.3])
    page = write_report([tmp_path / "runs"], tmp_path / "svg", fmt="svg").read_text()
    assert (tmp_path / "svg" / "accuracy.svg").is_file() and not (tmp_path / "svg" / "accuracy.png").exists()
    assert "data:image/svg+xml;base64," in page
    report(tmp_path / "runs", tmp_path / "pdf", format="pdf")
    assert (tmp_path / "pdf" / "accuracy.pdf").read_bytes().startswith(b"%PDF")
    assert (tmp_path / "pdf" / "accuracy.png").is_file()  # what the page shows of it
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "lo"), "--dpi", "100"]) == 0
    assert main(["report", str(tmp_path / "runs"), "--dpi", "300", "--out", str(tmp_path / "hi")]) == 0
    with Image.open(tmp_path / "lo" / "accuracy.png") as lo, Image.open(tmp_path / "hi" / "accuracy.png") as hi:
        assert hi.size[0] == pytest.approx(3 * lo.size[0], rel=0.05)
        assert lo.info["dpi"][0] == pytest.approx(100, abs=1)
    with pytest.raises(FedskewError, match="figure format must be one of png, pdf, svg, got 'jpg'"):
        write_report([tmp_path / "runs"], tmp_path / "x", fmt="jpg")
    with pytest.raises(FedskewError, match=r"dpi must be an integer in \[50, 1200\], got 5"):
        report(tmp_path / "runs", tmp_path / "x", dpi=5)


def test_long_titles_are_wrapped_inside_the_figure(tmp_path: Path, figures: dict[str, Figure]) -> None:
    """The per-class heat map's title (label and experiment on one line) ran past both edges."""
    label = "FedAF, mean KL, lambda_glob=0.01, lambda_loc=0.02, server fine-tuning for ten epochs"
    experiment_run(tmp_path / "r", "fashion_mnist", 0, [0.2, 0.3, 0.4])
    _relabel(tmp_path / "r", label)
    plot_curves([load_run(tmp_path / "r")], tmp_path / "plots")
    (name,) = [n for n in figures if n.startswith("per_class_")]
    fig = figures[name]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    title = fig.axes[0].title
    box = title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)
    assert label in title.get_text().replace("\n", " ")


def _synthetic_run(folder: Path, classes: list[int], names: list[str]) -> None:
    write_run(folder, "feddc", 0, [0.1, 0.2])
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "class_names": names}))
    syn = folder / "artifacts" / "synthetic"
    syn.mkdir(parents=True)
    labels = torch.tensor([c for c in classes for _ in range(3)])
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (len(labels), 1, 8, 8), dtype=torch.uint8, generator=g)
    save_file({"images": images, "labels": labels}, str(syn / "round_0002.safetensors"))


def test_condensed_image_grids_name_each_row_by_its_class(tmp_path: Path, figures: dict[str, Figure]) -> None:
    """8 rows for 10 classes: the rows say which 8."""
    names = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Boot"]
    classes = [0, 1, 2, 4, 5, 6, 8, 9]
    _synthetic_run(tmp_path / "run", classes, names)
    (path,) = synthetic_grids([load_run(tmp_path / "run")], tmp_path / "out")
    assert path.name == "synthetic_feddc.png"
    ax = figures["synthetic_feddc"].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [names[c] for c in classes]
    assert "round 2" in ax.get_title()


def test_runs_are_reported_in_the_config_order(tmp_path: Path) -> None:
    """Rows, curves and the printed table follow the order the runs were started in (the config's), not
    the alphabet: Zeta ran first."""
    for i, name in enumerate(("Zeta", "Alpha", "Mid")):
        folder = tmp_path / name
        write_run(folder, "fedavg", 0, [0.1 * (i + 1), 0.5])
        _relabel(folder, name)
        os.utime(folder / "config.toml", ns=(1_000_000_000 * (i + 1), 1_000_000_000 * (i + 1)))
    write_report([tmp_path], tmp_path / "report")
    rows = [line.split("|")[1].strip() for line in (tmp_path / "report" / "results.md").read_text().splitlines()[2:]]
    assert rows == ["Zeta", "Alpha", "Mid"]
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.index(">Zeta<") < page.index(">Alpha<") < page.index(">Mid<")


def test_fedskew_report_shows_its_progress_in_plain_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, point 8: stderr is no terminal here, so one plain line when the figures are done."""
    monkeypatch.delenv("FEDSKEW_PROGRESS", raising=False)
    write_run(tmp_path / "runs" / "a", "fedavg", 0, [0.1, 0.2, 0.3])
    assert main(["report", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("report of 1 run(s): 3/3 step, image grids (") and "\r" not in err
    assert main(["report", str(tmp_path / "runs"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
