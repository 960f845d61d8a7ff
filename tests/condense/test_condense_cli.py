"""``fedskew condense`` on the digits dataset, and the evaluation protocol behind it.

The command must write a set that reads back bit-exactly, score it, and reject bad values in one
line; the evaluation must actually train (a separable toy problem is learned) with hard or soft labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn

from fedskew.cli import main
from fedskew.cli.condensation import MethodSettings, condense_set, dsa_config, load_set
from fedskew.condense import SyntheticSet
from fedskew.condense.evaluate import EvalConfig, evaluate_synthetic
from fedskew.condense.kip import centered_one_hot
from fedskew.data import load_dataset

FAST = ["--ipc", "2", "--iterations", "2", "--eval-epochs", "3", "--net-width", "8", "--real-batch", "16",
        "--no-progress"]


def _run(tmp_path: Path, method: str, *extra: str) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / method
    assert main(["condense", "--dataset", "digits", "--method", method, "--out", str(out), *FAST, *extra]) == 0
    return out, json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("method", ["dc", "dm", "kip", "random"])
def test_writes_a_set_that_reads_back_exactly(tmp_path: Path, method: str) -> None:
    out, result = _run(tmp_path, method)
    assert result["method"] == method and result["ipc"] == 2 and result["dataset"] == "digits"
    assert result["iterations"] == (0 if method == "random" else 2)
    assert 0.0 <= float(result["test_accuracy"]) <= 1.0
    assert (result["seconds_per_step"] is None) == (method == "random")

    syn, stored, meta = load_set(out / "synthetic.safetensors")
    assert stored.images.dtype == torch.uint8 and stored.images.shape == (20, 1, 8, 8)
    assert stored.labels.tolist() == [c for c in range(10) for _ in range(2)]
    assert stored.soft_labels is None
    assert meta["method"] == method and len(meta["mean"]) == len(meta["std"]) == 1
    assert torch.equal(syn.to_uint8(meta["mean"], meta["std"]).images, stored.images)

    with Image.open(out / "grid.png") as grid:
        assert grid.size[1] > grid.size[0]  # ten rows of two images


def test_kip_learned_labels_are_saved_as_soft_labels(tmp_path: Path) -> None:
    out, result = _run(tmp_path, "kip", "--learn-labels")
    syn, stored, _ = load_set(out / "synthetic.safetensors")
    assert stored.soft_labels is not None and stored.soft_labels.shape == (20, 10)
    assert syn.soft_labels is not None and torch.equal(syn.soft_labels, stored.soft_labels)
    assert 0.0 <= float(result["test_accuracy"]) <= 1.0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--method", "gan"], "--method must be one of 'dc', 'dm', 'kip', 'random', got 'gan'"),
        (["--ipc", "0"], "--ipc must be an integer in [1, 10_000], got 0"),
        (["--iterations", "-1"], "--iterations must be an integer in [0, 1_000_000], got -1"),
        (["--image-lr", "0"], "--image-lr must be > 0"),
        (["--eval-epochs", "-3"], "--eval-epochs must be an integer in [0, 10_000], got -3"),
        (["--model", "gpt"], "unknown model 'gpt'"),
        (["--bn-statistics", "both"], "--bn-statistics must be one of 'separate', 'pooled', got 'both'"),
    ],
)
def test_bad_values_end_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                                    needle: str) -> None:
    code = main(["condense", "--dataset", "digits", "--out", str(tmp_path / "o"), "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fedskew: error:") and needle in err[0]


def test_every_method_starts_from_the_random_subset() -> None:
    """With zero iterations DC, DM and KIP return the random baseline's images: gains are the method's."""
    ds = load_dataset("digits")
    x, y = ds.to_tensors("train")
    settings = MethodSettings(iterations=0)

    def run(method: str) -> SyntheticSet:
        g = torch.Generator().manual_seed(7)
        return condense_set(method, x, y, 10, 3, lambda: nn.Linear(1, 1), settings, g, dsa_config("digits"))

    reference = run("random").images
    for method in ("dc", "dm", "kip"):
        assert torch.equal(run(method).images, reference)


@pytest.mark.parametrize("soft", [False, True])
def test_evaluation_learns_a_separable_problem(
    toy: tuple[torch.Tensor, torch.Tensor], factory: Callable[[], nn.Module], soft: bool
) -> None:
    x, y = toy
    syn = SyntheticSet(x, y, centered_one_hot(y, 2).float() if soft else None)
    cfg = EvalConfig(epochs=60, lr=0.05)
    accuracy = evaluate_synthetic(syn, x, y, factory, cfg, torch.Generator().manual_seed(0))
    assert accuracy > 0.9
    untrained = evaluate_synthetic(syn, x, y, factory, EvalConfig(epochs=0), torch.Generator().manual_seed(0))
    assert untrained < accuracy


def test_evaluation_is_seeded(toy: tuple[torch.Tensor, torch.Tensor], factory: Callable[[], nn.Module]) -> None:
    x, y = toy
    cfg = EvalConfig(epochs=5, dsa=dsa_config("digits"))
    runs = [evaluate_synthetic(SyntheticSet(x, y), x, y, factory, cfg, torch.Generator().manual_seed(3))
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_settings_file_and_overrides_equal_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flags are aliases of the keys: a TOML file plus overrides gives the flags' set, pixel for pixel."""
    flags, _ = _run(tmp_path, "dm")
    settings = tmp_path / "dm.toml"
    settings.write_text('dataset = "digits"\nmethod = "dm"\nipc = 2\niterations = 5\nreal_batch = 16\n'
                        '[model]\nnet_width = 8\n[eval]\nepochs = 3\n')
    out = tmp_path / "from_file"
    # iterations: the override beats the file; a flag beats both
    given = [str(settings), "iterations=7", "--iterations", "2"]
    assert main(["condense", *given, "--out", str(out), "--no-progress"]) == 0
    _, stored, meta = load_set(out / "synthetic.safetensors")
    _, expected, expected_meta = load_set(flags / "synthetic.safetensors")
    assert torch.equal(stored.images, expected.images) and meta == expected_meta
    result = json.loads((out / "result.json").read_text())
    assert result["iterations"] == 2 and result["model_options"] == {"net_width": 8} and result["eval"]["epochs"] == 3
    for bad, words in ((["ipcs=3"], "unknown condense setting 'ipcs'"),
                       (["ipc=two"], "ipc must be an integer, got 'two'"),
                       ([str(settings), str(settings)], "one settings file")):
        capsys.readouterr()
        assert main(["condense", *bad, "--out", str(tmp_path / "bad"), "--no-progress"]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0]


def test_the_grid_names_each_row_by_its_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """grid.png had no row labels (issue 36, point 1): each row now carries its class's name."""
    from matplotlib.figure import Figure

    from fedskew.condense import grids

    drawn: list[Figure] = []
    original = grids.labelled_grid_figure

    def spy(*args: Any, **kwargs: Any) -> Figure:
        drawn.append(original(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(grids, "labelled_grid_figure", spy)
    out, _ = _run(tmp_path, "random")
    (fig,) = drawn
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [str(c) for c in range(10)]  # digits' names
    assert (out / "grid.png").is_file()
