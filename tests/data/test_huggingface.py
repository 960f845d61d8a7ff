"""The ``huggingface`` dataset source, on small image datasets written with ``datasets`` itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fedskew.config import dump
from fedskew.core.errors import ConfigError, DataError, FedskewError
from fedskew.data.sources import DATASETS, load_dataset
from tests.helpers.cli import environment, fedskew, one_error
from tests.helpers.configs import tiny_config

CLASSES = ["cat", "dog", "eel"]


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the user's data dir, array cache and Hugging Face cache."""
    monkeypatch.delenv("FEDSKEW_DATA", raising=False)
    monkeypatch.setenv("FEDSKEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # for `fedskew` run as a process
    return tmp_path


@pytest.fixture
def hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ``datasets`` package, its cache in ``tmp_path`` (it read ``$HF_DATASETS_CACHE`` on import)."""
    reason = "Hugging Face datasets is optional: pip install -e '.[huggingface]'"
    datasets = pytest.importorskip("datasets", reason=reason)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return datasets


def pictures(n: int, seed: int, size: int = 8) -> tuple[list[Image.Image], list[int]]:
    """``n`` RGB images, class ``i % 3`` each: a colour of its own per class plus noise, so all differ."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n):
        label = i % len(CLASSES)
        base = np.array([80 * label, 200 - 60 * label, 40 + 50 * label], dtype=np.int64)
        pixels = np.clip(base + rng.integers(0, 50, (size, size, 3)), 0, 255).astype(np.uint8)
        images.append(Image.fromarray(pixels))
        labels.append(label)
    return images, labels


def split(hf: Any, n: int, seed: int) -> Any:
    images, labels = pictures(n, seed)
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=CLASSES)})
    return hf.Dataset.from_dict({"image": images, "label": labels}, features=features)


def save_dict(hf: Any, folder: Path, n_train: int = 12, n_test: int = 6) -> Path:
    hf.DatasetDict(train=split(hf, n_train, 1), test=split(hf, n_test, 2)).save_to_disk(str(folder))
    return folder


def chw(image: Image.Image) -> np.ndarray:
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def test_a_saved_dataset_dict_becomes_uint8_arrays_with_its_class_names(hf: Any, tmp_path: Path) -> None:
    folder = save_dict(hf, tmp_path / "tiny")
    ds = load_dataset("huggingface", path=str(folder))
    assert (ds.name, ds.classes) == ("huggingface", CLASSES)
    assert ds.x_train.shape == (12, 3, 8, 8) and ds.x_test.shape == (6, 3, 8, 8) and ds.x_train.dtype == np.uint8
    train_images, train_labels = pictures(12, 1)
    test_images, test_labels = pictures(6, 2)
    assert ds.y_train.tolist() == train_labels and ds.y_test.tolist() == test_labels
    np.testing.assert_array_equal(ds.x_train, np.stack([chw(im) for im in train_images]))
    np.testing.assert_array_equal(ds.x_test, np.stack([chw(im) for im in test_images]))
    # A relative path is relative to the data dir, which is also the default.
    assert load_dataset("huggingface", tmp_path, path="tiny").classes == CLASSES
    np.testing.assert_array_equal(load_dataset("huggingface", folder).x_train, ds.x_train)


def test_a_second_load_reads_the_cache_and_options_or_files_change_the_key(
    hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = save_dict(hf, tmp_path / "tiny")
    first = load_dataset("huggingface", path=str(folder))
    entries = sorted((tmp_path / "cache").glob("huggingface-*.npz"))
    assert len(entries) == 1
    assert sorted(p.name for p in folder.rglob("*")) == sorted(
        ["dataset_dict.json", "train", "test", *(["data-00000-of-00001.arrow", "dataset_info.json", "state.json"] * 2)]
    )  # reading wrote nothing into the saved folder, so its files still key the same entry

    def unused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cached dataset is read back, not opened with datasets")

    with monkeypatch.context() as patch:
        patch.setattr(hf, "load_from_disk", unused)
        again = load_dataset("huggingface", path=str(folder))
    np.testing.assert_array_equal(again.x_train, first.x_train)
    assert again.classes == CLASSES and again.mean == first.mean

    small = load_dataset("huggingface", path=str(folder), image_size=4)
    assert small.x_train.shape == (12, 3, 4, 4)
    assert len(list((tmp_path / "cache").glob("huggingface-*.npz"))) == 2

    hf.DatasetDict(train=split(hf, 9, 3), test=split(hf, 6, 2)).save_to_disk(str(folder))
    changed = load_dataset("huggingface", path=str(folder))
    assert len(changed.y_train) == 9
    assert len(list((tmp_path / "cache").glob("huggingface-*.npz"))) == 3


def test_grayscale_resizing_and_a_subset_of_classes(hf: Any, tmp_path: Path) -> None:
    folder = save_dict(hf, tmp_path / "tiny")
    ds = load_dataset("huggingface", path=str(folder), channels=1, image_size=4, classes=["eel", "cat"])
    assert ds.classes == ["eel", "cat"]
    train_images, train_labels = pictures(12, 1)
    kept = [i for i, label in enumerate(train_labels) if label != 1]
    assert ds.y_train.tolist() == [{2: 0, 0: 1}[train_labels[i]] for i in kept]
    expected = [chw(train_images[i].convert("L").resize((4, 4), Image.Resampling.BILINEAR)) for i in kept]
    np.testing.assert_array_equal(ds.x_train, np.stack(expected))
    assert ds.x_test.shape == (4, 1, 4, 4)


def test_a_single_saved_dataset_needs_test_fraction(hf: Any, tmp_path: Path) -> None:
    split(hf, 30, 1).save_to_disk(str(tmp_path / "single"))
    with pytest.raises(DataError, match=r"holds a single Dataset \(no splits\); set test_fraction"):
        load_dataset("huggingface", path=str(tmp_path / "single"))
    ds = load_dataset("huggingface", path=str(tmp_path / "single"), test_fraction=0.2)
    assert np.bincount(ds.y_test).tolist() == [2, 2, 2] and np.bincount(ds.y_train).tolist() == [8, 8, 8]
    again = load_dataset("huggingface", path=str(tmp_path / "single"), test_fraction=0.2, cache_dir=tmp_path / "c2")
    np.testing.assert_array_equal(again.x_test, ds.x_test)  # a fixed draw: the same test set every time
    # Images are in neither both splits nor lost.
    rows = {arr.tobytes() for arr in np.concatenate([ds.x_train, ds.x_test])}
    assert len(rows) == 30


def test_pixel_arrays_and_integer_labels_without_class_label(hf: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def part(labels: list[int]) -> Any:
        pixels = [rng.integers(0, 256, (6, 6), dtype=np.uint8) for _ in labels]
        return hf.Dataset.from_dict({"pixels": pixels, "y": labels})

    data = hf.DatasetDict(train=part([7, 3, 7, 3, 7]), test=part([3, 7]))
    data.save_to_disk(str(tmp_path / "arrays"))
    ds = load_dataset("huggingface", path=str(tmp_path / "arrays"), image_column="pixels", label_column="y")
    assert ds.classes == ["3", "7"] and ds.y_train.tolist() == [1, 0, 1, 0, 1] and ds.y_test.tolist() == [0, 1]
    assert ds.x_train.shape == (5, 1, 6, 6)
    np.testing.assert_array_equal(ds.x_train[:, 0], np.stack(data["train"]["pixels"][:]))
    rgb = load_dataset("huggingface", path=str(tmp_path / "arrays"), image_column="pixels", label_column="y",
                       channels=3)
    assert rgb.x_test.shape == (2, 3, 6, 6) and (rgb.x_test[:, 0] == rgb.x_test[:, 2]).all()

    hf.DatasetDict(train=part([3, 7]), test=part([5])).save_to_disk(str(tmp_path / "orphan"))
    with pytest.raises(DataError, match=r"test labels \[5\] have no train images"):
        load_dataset("huggingface", path=str(tmp_path / "orphan"), image_column="pixels", label_column="y")


def test_data_files_in_a_folder_and_a_dataset_in_the_local_cache_by_name(
    hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tmp_path / "files" / "fedskew_tiny"
    (files / "data").mkdir(parents=True)
    split(hf, 12, 1).to_parquet(str(files / "data" / "train-00000-of-00001.parquet"))
    split(hf, 6, 2).to_parquet(str(files / "data" / "test-00000-of-00001.parquet"))
    from_files = load_dataset("huggingface", path=str(files))  # load_dataset reads them, into the HF cache
    assert from_files.classes == CLASSES and from_files.x_train.shape == (12, 3, 8, 8)

    monkeypatch.chdir(tmp_path)  # no folder of that name here or in the data dir: the name is looked up
    by_name = load_dataset("huggingface", tmp_path / "empty", path="fedskew_tiny")
    np.testing.assert_array_equal(by_name.x_train, from_files.x_train)
    assert by_name.y_test.tolist() == from_files.y_test.tolist()
    assert load_dataset("huggingface", tmp_path / "empty", path="fedskew_tiny").classes == CLASSES  # cached

    with pytest.raises(DataError) as info:
        load_dataset("huggingface", tmp_path / "empty", path="someone/not_cached")
    message = str(info.value)
    assert "\n" not in message
    assert "'someone/not_cached' is neither a folder under the data dir nor a dataset in the local Hugging Face " \
           f"cache ({tmp_path / 'hf-cache'}), and fedskew never downloads from the Hub" in message
    assert "datasets.load_dataset('someone/not_cached') once where the Hub is reachable" in message


# ----------------------------------------------------------------------------------------------
# A federated run on it
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_two_round_run_with_a_dirichlet_partition(hf: Any, tmp_path: Path) -> None:
    folder = save_dict(hf, tmp_path / "tiny", n_train=60, n_test=30)
    cfg = tiny_config(
        rounds=2, algorithm={"clients_per_round": 2},
        partition={"name": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 5},
    )
    cfg.pop("label")
    cfg["dataset"] = {"name": "huggingface", "path": str(folder)}
    config = tmp_path / "hf.toml"
    config.write_text(dump(cfg))
    res = fedskew("run", str(config), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert res.code == 0, res.err
    run_dir = tmp_path / "runs" / "fedavg-seed0"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert all(0 <= r["accuracy"] <= 1 for r in records)
    assert 'name = "huggingface"' in (run_dir / "config.toml").read_text()

    cfg["dataset"]["label_column"] = "labels"
    bad = tmp_path / "bad.toml"
    bad.write_text(dump(cfg))
    line = one_error(fedskew("run", str(bad), "--out", str(tmp_path / "bad-runs"), cwd=tmp_path), after_start=True)
    assert "has no column label_column = 'labels'; allowed: image, label" in line


# ----------------------------------------------------------------------------------------------
# Bad values: one line naming the value and what is allowed
# ----------------------------------------------------------------------------------------------


def test_bad_columns_splits_labels_and_paths(hf: Any, tmp_path: Path) -> None:
    folder = save_dict(hf, tmp_path / "tiny")
    path = str(folder)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"image_column": "img"}, r"split 'train' has no column image_column = 'img'; allowed: image, label$"),
        ({"label_column": "class"}, r"split 'train' has no column label_column = 'class'; allowed: image, label$"),
        ({"train_split": "training"}, r"has no split train_split = 'training'; allowed: test, train$"),
        ({"test_split": "validation"}, r"has no split test_split = 'validation'; allowed: test, train \(or set "
                                       r"test_fraction"),
        ({"image_column": "label"}, r"image column 'label' holds class labels; allowed: an Image feature or arrays"),
        ({"classes": ["cat", "cow"]}, r"classes \['cow'\] are not label names; allowed: cat, dog, eel$"),
    ]
    for options, message in bad:
        with pytest.raises(DataError, match=message):
            load_dataset("huggingface", path=path, **options)

    words = hf.DatasetDict(train=split(hf, 3, 1).cast_column("label", hf.Value("string")), test=split(hf, 3, 2))
    words.save_to_disk(str(tmp_path / "words"))
    strings = r"label column 'label' holds string values; allowed: integer labels or a ClassLabel feature \(string "
    with pytest.raises(DataError, match=strings + r"labels: dataset\.class_encode_column\('label'\)\)"):
        load_dataset("huggingface", path=str(tmp_path / "words"))

    unlabelled = split(hf, 3, 2).cast_column("label", hf.Value("int64")).map(lambda row: {"label": -1})
    unlabelled = unlabelled.cast_column("label", hf.ClassLabel(names=CLASSES))
    hf.DatasetDict(train=split(hf, 3, 1), test=unlabelled).save_to_disk(str(tmp_path / "unlabelled"))
    with pytest.raises(DataError, match=r"split 'test': label -1 in column 'label'; allowed: labels in \[0, 3\)"):
        load_dataset("huggingface", path=str(tmp_path / "unlabelled"))

    with pytest.raises(DataError, match=rf"{tmp_path / 'nowhere'} not found; set option path to a folder written by "
                                        "save_to_disk"):
        load_dataset("huggingface", path=str(tmp_path / "nowhere"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.bin").write_bytes(b"\0")
    with pytest.raises(DataError, match=r"datasets\.load_dataset cannot open .*junk \(.*\); allowed: a folder written "
                                        "by save_to_disk"):
        load_dataset("huggingface", path=str(tmp_path / "junk"))


def test_options_are_checked_before_anything_is_read(hf: Any) -> None:
    assert DATASETS.keys("huggingface") == [
        "workers", "path", "image_column", "label_column", "train_split", "test_split", "test_fraction", "classes",
        "image_size", "channels", "data_dir", "train_fraction", "normalize",
    ]
    bad: list[tuple[dict[str, Any], str]] = [
        ({"test_fraction": 1.0}, r"dataset\.test_fraction must be a number in \(0, 1\), got 1\.0"),
        ({"image_column": ""}, r"dataset\.image_column must be a non-empty name, got ''"),
        ({"classes": []}, r"dataset\.classes must be a list of distinct names"),
        ({"channels": 4}, r"dataset\.channels must be 1 or 3, got 4"),
        ({"image_size": 0}, r"dataset\.image_size must be an integer in \[1, 1024\], got 0"),
        ({"split": "train"}, r"unknown key 'dataset\.split' for dataset 'huggingface'; allowed: workers, path"),
    ]
    for options, message in bad:
        with pytest.raises(ConfigError, match=message):
            DATASETS.build_params("huggingface", options, "dataset.")


def test_without_datasets_validating_or_loading_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # what Python does for a package that is not installed
    install = (r"^dataset 'huggingface' needs the datasets package: pip install -e '\.\[huggingface\]' "
               r"in fedskew's clone$")
    with pytest.raises(FedskewError, match=install):
        DATASETS.build_params("huggingface", {"path": "x"}, "dataset.")
    with pytest.raises(FedskewError, match=install):
        load_dataset("huggingface", path=str(tmp_path))


@pytest.mark.slow
def test_importing_fedskew_data_does_not_import_datasets() -> None:
    probe = "import sys, fedskew.data; print('huggingface' in fedskew.data.DATASETS, 'datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], env=environment(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
