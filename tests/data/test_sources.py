"""Tests of dataset sources, downloads and the array cache, on small files written in the official formats."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
import urllib.error
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fedskew.core.errors import ConfigError, DataError
from fedskew.data import cache as cache_mod
from fedskew.data import download as download_mod
from fedskew.data import sources
from fedskew.data.download import RemoteFile, fetch
from fedskew.data.sources import DATASETS, ArrayDataset, DatasetParams, load_dataset, read_idx, resolve_data_dir
from fedskew.data.sources import images as image_sources
from fedskew.engine.federation import ENGINE_KEYS
from tests.helpers.datasets import idx_bytes, write_idx_release

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the user's real data dir and cache."""
    monkeypatch.delenv("FEDSKEW_DATA", raising=False)
    monkeypatch.setenv("FEDSKEW_CACHE", str(tmp_path / "cache"))
    return tmp_path


# ----------------------------------------------------------------------------------------------
# Writers of the official formats
# ----------------------------------------------------------------------------------------------


def write_tar(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def cifar_batch(n: int, seed: int, label_keys: dict[bytes, int]) -> dict[bytes, Any]:
    """A batch like the official ones: dict with b"data" (N x 3072 uint8) and label lists."""
    rng = np.random.default_rng(seed)
    batch: dict[bytes, Any] = {
        b"batch_label": b"batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }
    for key, num_classes in label_keys.items():
        batch[key] = [int(v) for v in rng.integers(0, num_classes, n)]
    return batch


def cifar10_files(per_batch: int = 3) -> dict[str, dict[bytes, Any]]:
    files = {f"data_batch_{i}": cifar_batch(per_batch, i, {b"labels": 10}) for i in range(1, 6)}
    files["test_batch"] = cifar_batch(per_batch, 9, {b"labels": 10})
    names = [n.encode() for n in sources.CIFAR10_CLASSES]
    files["batches.meta"] = {b"label_names": names, b"num_cases_per_batch": per_batch}
    return files


def write_cifar_tar(path: Path, folder: str, files: dict[str, dict[bytes, Any]]) -> None:
    write_tar(path, {f"{folder}/{name}": pickle.dumps(obj, protocol=2) for name, obj in files.items()})


def png_bytes(color: tuple[int, int, int], size: tuple[int, int] = (6, 6), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color if mode == "RGB" else color[0]).save(buf, format="PNG")
    return buf.getvalue()


def jpeg_bytes(color: tuple[int, int, int], size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, format="JPEG")
    return buf.getvalue()


def image_folder_files() -> dict[str, bytes]:
    """Two classes, 3 train + 1 test images each; every image a distinct solid colour."""
    files = {}
    for c, cls in enumerate(["zebra", "apple"]):
        for split, count in (("train", 3), ("test", 1)):
            for i in range(count):
                files[f"data/{split}/{cls}/{i:02d}.png"] = png_bytes(
                    (c * 100 + i, 10 * i, 200 if split == "test" else 50)
                )
    return files


def write_domain_tree(root: Path, counts: dict[str, int] | None = None) -> None:
    """3 domains x 2 classes of 8x8 PNGs whose colour encodes domain and class."""
    counts = counts or {"cat": 5, "dog": 5}
    for d, domain in enumerate(["photo", "art", "sketch"]):
        for c, (cls, n) in enumerate(counts.items()):
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i}.png").write_bytes(png_bytes((d * 80, c * 120, i * 20), size=(8, 8)))


# ----------------------------------------------------------------------------------------------
# Built-in datasets and the container
# ----------------------------------------------------------------------------------------------


def test_registered_names() -> None:
    expected = {"digits", "synthetic", "mnist", "fashion_mnist", "cifar10", "cifar10_jpeg", "cifar100"}
    expected |= {"image_folder", "domain_folder", "tiny_imagenet", "domainnet", "huggingface"}
    assert set(DATASETS.names()) == expected


def test_digits_shapes_split_and_determinism() -> None:
    ds = load_dataset("digits")
    assert ds.x_train.shape == (1437, 1, 8, 8) and ds.x_test.shape == (360, 1, 8, 8)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0
    assert (ds.num_classes, ds.in_channels, ds.image_size) == (10, 1, 8)
    assert np.bincount(ds.y_test, minlength=10).min() >= 35  # stratified: ~36 per class
    again = load_dataset("digits")
    assert np.array_equal(ds.x_train, again.x_train) and np.array_equal(ds.y_test, again.y_test)
    assert np.allclose(ds.mean, [ds.x_train.mean() / 255])


def test_synthetic_is_deterministic_balanced_and_learnable() -> None:
    opts: dict[str, Any] = {
        "num_train": 200,
        "num_test": 100,
        "num_classes": 4,
        "image_size": 8,
        "channels": 3,
        "seed": 3,
    }
    ds = load_dataset("synthetic", **opts)
    assert ds.x_train.shape == (200, 3, 8, 8) and ds.x_test.shape == (100, 3, 8, 8)
    assert np.bincount(ds.y_train).tolist() == [50] * 4
    assert ds.domains_train is None
    assert np.array_equal(ds.x_test, load_dataset("synthetic", **opts).x_test)
    assert not np.array_equal(ds.x_test, load_dataset("synthetic", **{**opts, "seed": 4}).x_test)
    # Nearest class mean classifies well above chance (0.25): the classes are learnable.
    x_train = ds.x_train.reshape(200, -1).astype(float)
    centroids = np.stack([x_train[ds.y_train == c].mean(0) for c in range(4)])
    x_test = ds.x_test.reshape(100, -1).astype(float)
    predicted = np.argmin(((x_test[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predicted == ds.y_test).mean() > 0.8


def test_synthetic_domains() -> None:
    ds = load_dataset("synthetic", num_train=60, num_test=30, num_domains=3)
    assert ds.domain_names == ["domain_0", "domain_1", "domain_2"]
    assert ds.domains_train is not None and ds.domains_train.shape == (60,)
    assert ds.domains_test is not None and set(ds.domains_test.tolist()) <= {0, 1, 2}


def test_to_tensors_normalises_with_train_statistics() -> None:
    ds = load_dataset("synthetic", num_train=100, num_test=20, channels=3)
    x, y = ds.to_tensors("train")
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (100, 3, 16, 16)
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(x.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-3)
    x[0] = 0  # a copy: the uint8 arrays are untouched
    assert ds.x_train[0].any()
    with pytest.raises(ConfigError, match="unknown split"):
        ds.to_tensors("val")


def test_to_tensors_with_an_index_equals_indexing_the_full_conversion() -> None:
    ds = load_dataset("synthetic", num_train=100, num_test=20, channels=3)
    order = np.random.default_rng(0).permutation(100)[:70]
    x_all, y_all = ds.to_tensors("train")
    x, y = ds.to_tensors("train", order)
    assert torch.equal(x, x_all[torch.from_numpy(order)]) and torch.equal(y, y_all[torch.from_numpy(order)])


def test_array_dataset_rejects_wrong_arrays() -> None:
    x = np.zeros((4, 1, 2, 2), np.uint8)
    y = np.zeros(4, np.int64)
    with pytest.raises(DataError, match="y_train must be int64"):
        ArrayDataset("bad", x, y.astype(np.int32), x, y, ["a"], (0.0,), (1.0,))
    with pytest.raises(DataError, match="labels outside"):
        ArrayDataset("bad", x, y + 1, x, y, ["a"], (0.0,), (1.0,))
    with pytest.raises(DataError, match="go together"):
        ArrayDataset("bad", x, y, x, y, ["a"], (0.0,), (1.0,), domains_train=y)
    assert "train=4" in repr(ArrayDataset.from_arrays("ok", x, y, x, y, ["a"]))


def test_unknown_dataset_and_option_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"allowed: .*digits"):
        load_dataset("imagenet-1k")
    with pytest.raises(ConfigError, match=r"key 'dataset\.num_trian' for dataset 'synthetic'; allowed: num_train"):
        load_dataset("synthetic", num_trian=5)
    with pytest.raises(ConfigError, match="channels must be 1 or 3"):
        load_dataset("synthetic", channels=2)


def test_every_dataset_declares_its_options() -> None:
    for name in DATASETS.names():
        params = DATASETS.params_of(name)
        assert params is not None and issubclass(params, DatasetParams), name
        assert DATASETS.keys(name)[-3:] == list(ENGINE_KEYS)  # the keys the engine applies come last
        DATASETS.build_params(name, {})  # every option has a default


def test_a_whole_dataset_table_validates_in_one_call() -> None:
    table = {"name": "synthetic", "data_dir": "/data", "train_fraction": 0.5, "num_train": 10.0, "channels": 3}
    params = DATASETS.build_params("synthetic", table, "dataset.")
    assert (params.data_dir, params.train_fraction, params.num_train, params.channels) == ("/data", 0.5, 10, 3)
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("digits", {"train_fraction": 0}, r"dataset\.train_fraction must be > 0, got 0"),
        ("digits", {"train_fraction": 1.5}, r"dataset\.train_fraction must be <= 1, got 1\.5"),
        ("synthetic", {"num_train": "many"}, r"dataset\.num_train must be an integer, got 'many'"),
        ("synthetic", {"num_classes": 1}, r"dataset\.num_classes must be an integer >= 2, got 1"),
        ("cifar100", {"labels": "super"}, r"dataset\.labels must be 'fine' or 'coarse', got 'super'"),
        ("mnist", {"download": "yes"}, r"dataset\.download must be true or false"),
        ("image_folder", {"classes": ["a", "a"]}, r"dataset\.classes must be a list of distinct names"),
        ("image_folder", {"path": 3}, r"dataset\.path must be a path"),
        ("domain_folder", {"classes": 0}, r"dataset\.classes must be an integer >= 1, got 0"),
        ("domainnet", {"image_size": None}, r"dataset\.image_size must be an integer in \[1, 1024\], got None"),
        ("synthetic", {"image_size": 10_000_000}, r"dataset\.image_size must be an integer in \[2, 1024\]"),
        ("image_folder", {"image_size": 4096}, r"dataset\.image_size must be an integer in \[1, 1024\]"),
        ("tiny_imagenet", {"image_size": 0}, r"dataset\.image_size must be an integer in \[1, 1024\]"),
        ("synthetic", {"num_train": 10**9}, r"dataset\.num_train \+ num_test must be such that"),
        ("synthetic", {"noise": float("nan")}, r"dataset\.noise must be a finite number, got nan"),
        ("tiny_imagenet", {"workers": 0}, r"dataset\.workers must be an integer >= 1, got 0"),
        ("mnist", {"verfiy": False}, r"unknown key 'dataset\.verfiy' for dataset 'mnist'; allowed: download, verify, "),
    ]
    for name, options, message in bad:
        with pytest.raises(ConfigError, match=message):
            DATASETS.build_params(name, options, "dataset.")


def test_load_dataset_leaves_train_fraction_to_the_caller() -> None:
    with pytest.raises(ConfigError, match=r"dataset\.train_fraction is not an option of load_dataset"):
        load_dataset("digits", train_fraction=0.5)
    with pytest.raises(ConfigError, match=r"dataset\.normalize is not an option of load_dataset"):
        load_dataset("digits", normalize=False)


def test_resolve_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_data_dir(None) == Path.home() / ".cache" / "fedskew" / "data"
    monkeypatch.setenv("FEDSKEW_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir("~/x") == Path.home() / "x"


def test_resolve_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_mod.resolve_cache_dir(None) == tmp_path / "cache"  # set by the autouse fixture
    assert cache_mod.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("FEDSKEW_CACHE")
    assert cache_mod.resolve_cache_dir(None) == Path.home() / ".cache" / "fedskew" / "arrays"


# ----------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)
# ----------------------------------------------------------------------------------------------


def test_read_idx_raw_and_gz(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    data = idx_bytes(images)
    assert int.from_bytes(data[:4], "big") == 2051
    assert int.from_bytes(idx_bytes(np.zeros(5, np.uint8))[:4], "big") == 2049
    (tmp_path / "raw").write_bytes(data)
    (tmp_path / "packed.gz").write_bytes(gzip.compress(data))
    assert np.array_equal(read_idx(tmp_path / "raw"), images)
    assert np.array_equal(read_idx(tmp_path / "packed.gz", content_md5=hashlib.md5(data).hexdigest()), images)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x00\x08\x03" + (2).to_bytes(4, "big"), "truncated IDX header"),
        (b"\x12\x34\x08\x01" + (3).to_bytes(4, "big") + b"abc", "bad magic number 12340801"),
        (b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"abc", "truncated or corrupt"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
    ],
)
def test_read_idx_rejects_corrupt_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        read_idx(path)
    assert str(path) in str(err.value)


def test_mnist_from_gz_and_raw_idx_files(tmp_path: Path) -> None:
    arrays = write_idx_release(tmp_path / "mnist", 30, 10, gz_train=True, gz_test=False)
    ds = load_dataset("mnist", tmp_path, verify=False)
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
    assert np.array_equal(ds.x_train[:, 0], arrays["train-images-idx3-ubyte"])
    assert ds.y_test.tolist() == list(range(10)) and ds.classes[3] == "3"
    # With verification on, the home-made .gz files fail the official MD5.
    with pytest.raises(DataError, match="checksum mismatch"):
        load_dataset("mnist", tmp_path, cache_dir=tmp_path / "other-cache")


def test_fashion_mnist_verifies_decompressed_content(tmp_path: Path) -> None:
    write_idx_release(tmp_path / "fashion-mnist", 20, 10, gz_train=False, gz_test=True)
    with pytest.raises(DataError, match=r"checksum mismatch .*decompressed") as err:
        load_dataset("fashion_mnist", tmp_path)
    assert "train-images-idx3-ubyte" in str(err.value)
    ds = load_dataset("fashion_mnist", tmp_path, verify=False)
    assert ds.classes[0] == "T-shirt/top" and len(ds.y_train) == 20


def test_idx_label_count_mismatch(tmp_path: Path) -> None:
    write_idx_release(tmp_path / "mnist", 20, 10, gz_train=False, gz_test=False)
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(7, np.uint8)))
    with pytest.raises(DataError, match="expected 10 labels"):
        load_dataset("mnist", tmp_path, verify=False)


def test_real_fashion_mnist(shared_datasets: Path) -> None:
    ds = load_dataset("fashion_mnist", shared_datasets)
    assert ds.x_test.shape == (10_000, 1, 28, 28) and ds.x_train.shape == (60_000, 1, 28, 28)
    assert np.bincount(ds.y_test).tolist() == [1000] * 10


# ----------------------------------------------------------------------------------------------
# CIFAR pickles
# ----------------------------------------------------------------------------------------------


def test_cifar10_tarball_and_extracted_folder(tmp_path: Path) -> None:
    files = cifar10_files()
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    ds = load_dataset("cifar10", tmp_path, verify=False)
    assert ds.x_train.shape == (15, 3, 32, 32) and ds.x_test.shape == (3, 3, 32, 32)
    assert ds.classes == list(sources.CIFAR10_CLASSES)
    first = files["data_batch_1"]
    assert np.array_equal(ds.x_train[0, 1], first[b"data"][0, 1024:2048].reshape(32, 32))  # green plane
    assert ds.y_train[:3].tolist() == first[b"labels"]
    with pytest.raises(DataError, match="checksum mismatch") as err:
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "c2")
    assert "cifar-10-python.tar.gz" in str(err.value)

    extracted = tmp_path / "extracted"
    (extracted / "cifar-10-batches-py").mkdir(parents=True)
    for name, obj in files.items():
        (extracted / "cifar-10-batches-py" / name).write_bytes(pickle.dumps(obj, protocol=2))
    from_folder = load_dataset("cifar10", extracted)  # no checksum for an extracted folder
    assert np.array_equal(from_folder.x_train, ds.x_train) and np.array_equal(from_folder.y_test, ds.y_test)


def test_cifar100_fine_and_coarse_labels(tmp_path: Path) -> None:
    keys = {b"fine_labels": 100, b"coarse_labels": 20}
    files = {"train": cifar_batch(8, 1, keys), "test": cifar_batch(4, 2, keys)}
    files["meta"] = {
        b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    }
    write_cifar_tar(tmp_path / "cifar-100-python.tar.gz", "cifar-100-python", files)
    fine = load_dataset("cifar100", tmp_path, verify=False)
    assert fine.num_classes == 100 and fine.y_train.tolist() == files["train"][b"fine_labels"]
    coarse = load_dataset("cifar100", tmp_path, verify=False, labels="coarse")
    assert coarse.num_classes == 20 and coarse.y_test.tolist() == files["test"][b"coarse_labels"]
    with pytest.raises(ConfigError, match="fine' or 'coarse"):
        load_dataset("cifar100", tmp_path, labels="super")


class _Sneaky:
    def __reduce__(self) -> tuple[Callable[..., Any], tuple[()]]:
        return (os.getcwd, ())


def test_cifar_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    files = cifar10_files()
    files["data_batch_2"][b"labels"] = _Sneaky()
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"data_batch_2: not a valid CIFAR pickle .*refusing to load \w+\.getcwd"):
        load_dataset("cifar10", tmp_path, verify=False)


def test_corrupt_and_incomplete_archives(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    write_cifar_tar(good, "cifar-10-batches-py", cifar10_files())
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(good.read_bytes()[:300])
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz: corrupt or unreadable"):
        load_dataset("cifar10", tmp_path, verify=False)
    files = cifar10_files()
    del files["test_batch"]
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    with pytest.raises(DataError, match="missing cifar-10-batches-py/test_batch"):
        load_dataset("cifar10", tmp_path, verify=False)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not an archive at all")
    with pytest.raises(DataError, match="not a folder, tar or zip archive"):
        load_dataset("cifar10", tmp_path, verify=False)


# ----------------------------------------------------------------------------------------------
# Image folders and domain folders
# ----------------------------------------------------------------------------------------------


def test_image_folder_tar_gz(tmp_path: Path) -> None:
    files = image_folder_files()
    write_tar(tmp_path / "pics.tar.gz", files)
    ds = load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    assert ds.classes == ["apple", "zebra"]  # sorted by default
    assert ds.x_train.shape == (6, 3, 6, 6) and ds.x_test.shape == (2, 3, 6, 6)
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1] and ds.y_test.tolist() == [0, 1]
    assert ds.x_train[4, :, 0, 0].tolist() == [1, 10, 50]  # zebra/01.png, exact (PNG is lossless)
    ordered = load_dataset("image_folder", tmp_path, path="pics.tar.gz", classes=["zebra", "apple"], channels=1)
    assert ordered.classes == ["zebra", "apple"] and ordered.in_channels == 1 and ordered.y_test.tolist() == [0, 1]
    resized = load_dataset("image_folder", tmp_path, path=tmp_path / "pics.tar.gz", image_size=3)
    assert resized.image_size == 3


def test_image_folder_directory_mixed_sizes_and_missing_classes(tmp_path: Path) -> None:
    for name, data in image_folder_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / "data/train/apple/big.png").write_bytes(png_bytes((1, 2, 3), size=(9, 7)))
    with pytest.raises(DataError, match=r"big\.png: image is 9x7 .*set option image_size"):
        load_dataset("image_folder", tmp_path, path="data")
    assert load_dataset("image_folder", tmp_path, path="data", image_size=4).x_train.shape == (7, 3, 4, 4)
    with pytest.raises(DataError, match=r"classes \['pear'\] have no train images"):
        load_dataset("image_folder", tmp_path, path="data", classes=["pear"])
    with pytest.raises(DataError, match="no images under train"):
        load_dataset("image_folder", tmp_path, path="data/train")


def test_image_folder_decodes_identically_in_a_process_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tar(tmp_path / "pics.tar.gz", image_folder_files())
    serial = load_dataset("image_folder", tmp_path, path="pics.tar.gz", workers=1)
    monkeypatch.setattr(image_sources, "_POOL_MIN_IMAGES", 1)
    monkeypatch.setattr(image_sources, "_CHUNK", 3)
    pooled = load_dataset("image_folder", tmp_path, path="pics.tar.gz", workers=2, cache_dir=tmp_path / "c2")
    assert np.array_equal(serial.x_train, pooled.x_train) and np.array_equal(serial.x_test, pooled.x_test)


def test_domain_folder(tmp_path: Path) -> None:
    write_domain_tree(tmp_path / "tree")
    ds = load_dataset("domain_folder", tmp_path, path="tree", image_size=4, test_fraction=0.2)
    assert ds.domain_names == ["art", "photo", "sketch"] and ds.classes == ["cat", "dog"]
    assert ds.x_train.shape == (24, 3, 4, 4) and ds.x_test.shape == (6, 3, 4, 4)  # 1 of 5 per group to test
    assert ds.domains_train is not None and ds.domains_test is not None
    assert np.bincount(ds.domains_train).tolist() == [8, 8, 8]
    assert sorted(zip(ds.domains_test.tolist(), ds.y_test.tolist(), strict=True)) == [
        (d, c) for d in range(3) for c in range(2)
    ]
    again = load_dataset("domain_folder", tmp_path, path="tree", image_size=4, cache_dir=tmp_path / "c2")
    assert np.array_equal(ds.x_test, again.x_test)
    two = load_dataset("domain_folder", tmp_path, path="tree", domains=["sketch", "photo"], image_size=4)
    assert two.domain_names == ["sketch", "photo"] and len(two.y_train) == 16
    # The split of a (domain, class) group does not depend on which other domains are selected.
    assert np.array_equal(two.x_test[two.domains_test == 0], ds.x_test[ds.domains_test == 2])


def test_domain_folder_top_k_classes_and_caps(tmp_path: Path) -> None:
    write_domain_tree(tmp_path / "tree", {"cat": 2, "dog": 6, "eel": 4})
    ds = load_dataset("domain_folder", tmp_path, path="tree", classes=2, image_size=None, max_per_class=3)
    assert ds.classes == ["dog", "eel"] and ds.image_size == 8
    assert len(ds.y_train) + len(ds.y_test) == 3 * 3 * 2
    with pytest.raises(DataError, match=r"domains \['paint'\] not found"):
        load_dataset("domain_folder", tmp_path, path="tree", domains=["paint"])
    with pytest.raises(ConfigError, match="test_fraction must be in"):
        load_dataset("domain_folder", tmp_path, path="tree", test_fraction=1.0)


def test_domainnet_from_zip_and_extracted_folder(tmp_path: Path) -> None:
    folder = tmp_path / "domainnet"
    folder.mkdir()
    with zipfile.ZipFile(folder / "clipart.zip", "w") as zf:
        for cls in ("ant", "bee"):
            for i in range(3):
                zf.writestr(f"clipart/{cls}/{cls}_{i}.jpg", jpeg_bytes((40 * i, 90, 10)))
    for cls in ("ant", "bee"):
        (folder / "real" / cls).mkdir(parents=True)
        for i in range(3):
            (folder / "real" / cls / f"{i}.jpg").write_bytes(jpeg_bytes((200, 40 * i, 10), size=12))
    ds = load_dataset("domainnet", tmp_path, domains=["real", "clipart"], classes=None, image_size=8)
    assert ds.domain_names == ["real", "clipart"] and ds.classes == ["ant", "bee"]
    assert ds.x_train.shape == (8, 3, 8, 8) and ds.x_test.shape == (4, 3, 8, 8)
    with pytest.raises(ConfigError, match=r"domains must be a list of DomainNet domains \(clipart, .*\['cartoon'\]"):
        load_dataset("domainnet", tmp_path, domains=["cartoon"])


def test_tiny_imagenet_zip(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "tiny-imagenet-200.zip", "w") as zf:
        zf.writestr("tiny-imagenet-200/wnids.txt", "n02\nn01\n")
        for wnid in ("n01", "n02"):
            zf.writestr(f"tiny-imagenet-200/train/{wnid}/{wnid}_boxes.txt", "")
            for i in range(2):
                zf.writestr(f"tiny-imagenet-200/train/{wnid}/images/{wnid}_{i}.JPEG", jpeg_bytes((i, 0, 0), 16))
        notes = "val_0.JPEG\tn01\t0\t0\t1\t1\nval_1.JPEG\tn02\t0\t0\t1\t1\n"
        zf.writestr("tiny-imagenet-200/val/val_annotations.txt", notes)
        for i in range(2):
            zf.writestr(f"tiny-imagenet-200/val/images/val_{i}.JPEG", jpeg_bytes((0, i, 0), 16))
        zf.writestr("tiny-imagenet-200/test/images/test_0.JPEG", jpeg_bytes((0, 0, 0), 16))
    ds = load_dataset("tiny_imagenet", tmp_path, image_size=8)
    assert ds.classes == ["n02", "n01"]  # wnids.txt order
    assert ds.x_train.shape == (4, 3, 8, 8) and ds.y_train.tolist() == [1, 1, 0, 0]
    assert ds.y_test.tolist() == [1, 0]


# ----------------------------------------------------------------------------------------------
# Missing files and downloads
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "missing", "url"),
    [
        ("mnist", {}, "mnist/train-images-idx3-ubyte.gz", "https://ossci-datasets.s3.amazonaws.com/mnist/"),
        ("fashion_mnist", {}, "fashion-mnist/train-images-idx3-ubyte.gz", "fashion-mnist.s3-website"),
        ("cifar10", {}, "cifar-10-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
        ("cifar100", {}, "cifar-100-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
        ("cifar10_jpeg", {}, "cifar10-jpeg.tar.gz", "cifar-10-python.tar.gz"),
        ("tiny_imagenet", {}, "tiny-imagenet-200.zip", "http://cs231n.stanford.edu/tiny-imagenet-200.zip"),
        ("domainnet", {"domains": ["sketch"]}, "domainnet/sketch.zip", "multi-source/sketch.zip"),
        ("image_folder", {"path": "mine"}, "mine", None),
    ],
)
def test_missing_files_explain_where_to_put_them(
    tmp_path: Path, name: str, options: dict[str, Any], missing: str, url: str | None
) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(name, tmp_path / "data", **options)
    message = str(err.value)
    assert str(tmp_path / "data" / missing) in message
    assert "\n" not in message and "FEDSKEW_DATA" in message
    if url is not None:
        assert url in message


def test_offline_download_fails_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(download_mod.urllib.request, "urlopen", offline)
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path, download=True)
    message = str(err.value)
    assert str(tmp_path / "cifar-10-python.tar.gz") in message and "network is unreachable" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message and "\n" not in message
    assert not list(tmp_path.glob("*.part"))


def test_fetch_downloads_verifies_and_falls_back_to_mirrors(tmp_path: Path) -> None:
    served = tmp_path / "served.bin"
    served.write_bytes(b"official bytes")
    good = RemoteFile(
        "data.bin", ((tmp_path / "absent.bin").as_uri(), served.as_uri()), hashlib.md5(b"official bytes").hexdigest()
    )
    path = fetch("demo", good, tmp_path / "dl", download=True)
    assert path.read_bytes() == b"official bytes"
    assert fetch("demo", good, tmp_path / "dl", download=False) == path  # present: no download needed
    wrong = RemoteFile("other.bin", (served.as_uri(),), "0" * 32)
    with pytest.raises(DataError, match="checksum mismatch"):
        fetch("demo", wrong, tmp_path / "dl", download=True)
    assert not (tmp_path / "dl" / "other.bin").exists() and not list((tmp_path / "dl").glob("*.part"))


# ----------------------------------------------------------------------------------------------
# The array cache
# ----------------------------------------------------------------------------------------------


def test_cache_hit_skips_decoding_and_source_change_invalidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tar(tmp_path / "pics.tar.gz", image_folder_files())
    calls = []
    real_decode = image_sources.decode_all

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(image_sources, "decode_all", counting)
    first = load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    second = load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    assert len(calls) == 1
    for attr in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(first, attr), getattr(second, attr))
    assert (first.classes, first.mean, first.std) == (second.classes, second.mean, second.std)
    assert len(list((tmp_path / "cache").glob("image_folder-*.npz"))) == 1

    load_dataset("image_folder", tmp_path, path="pics.tar.gz", image_size=3)  # other options: other entry
    assert len(calls) == 2
    stat = (tmp_path / "pics.tar.gz").stat()
    os.utime(tmp_path / "pics.tar.gz", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    assert len(calls) == 3


def test_unreadable_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    write_tar(tmp_path / "pics.tar.gz", image_folder_files())
    first = load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    (entry,) = (tmp_path / "cache").glob("image_folder-*.npz")
    entry.write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="unreadable cache entry"):
        again = load_dataset("image_folder", tmp_path, path="pics.tar.gz")
    assert np.array_equal(first.x_train, again.x_train)
    assert entry.stat().st_size > 100  # rewritten


def test_cache_entries_round_trip_domains(tmp_path: Path) -> None:
    write_domain_tree(tmp_path / "tree")
    first = load_dataset("domain_folder", tmp_path, path="tree", image_size=4)
    cached = load_dataset("domain_folder", tmp_path, path="tree", image_size=4)
    assert cached.domain_names == first.domain_names
    assert cached.domains_test is not None and first.domains_test is not None
    assert np.array_equal(cached.domains_test, first.domains_test)


def test_train_subset_is_stratified_seeded_and_keeps_normalisation() -> None:
    ds = load_dataset("synthetic", num_train=400, num_test=50, num_classes=4, num_domains=2)
    sub = ds.train_subset(0.25, seed=3)
    assert len(sub.y_train) == 100
    assert np.bincount(sub.y_train, minlength=4).tolist() == [
        round(0.25 * n) for n in np.bincount(ds.y_train, minlength=4)
    ]
    assert sub.domains_train is not None and len(sub.domains_train) == 100
    assert sub.mean == ds.mean and sub.std == ds.std
    assert np.array_equal(sub.x_test, ds.x_test)
    # every kept image is one of the originals, with its own label
    rows = {ds.x_train[i].tobytes(): int(ds.y_train[i]) for i in range(len(ds.y_train))}
    assert all(rows[sub.x_train[i].tobytes()] == int(sub.y_train[i]) for i in range(100))
    assert np.array_equal(sub.y_train, ds.train_subset(0.25, seed=3).y_train)
    assert not np.array_equal(sub.x_train, ds.train_subset(0.25, seed=4).x_train)
    assert ds.train_subset(1.0, seed=0) is ds


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "0.5", True])
def test_train_subset_rejects_fractions_outside_0_1(bad: object) -> None:
    ds = load_dataset("synthetic", num_train=40, num_test=10)
    with pytest.raises(ConfigError, match=r"train_fraction.*0 < fraction <= 1"):
        ds.train_subset(bad, seed=0)
