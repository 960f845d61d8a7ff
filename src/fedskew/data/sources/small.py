"""Built-in small datasets that need no files: scikit-learn's digits and a synthetic generator."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedskew.core.params import check, maximums, minimums
from fedskew.data.sources.base import DATASETS, DatasetParams, cached
from fedskew.data.sources.checks import MAX_IMAGE_SIZE, check_channels
from fedskew.data.sources.container import ArrayDataset


@DATASETS.register("digits", params=DatasetParams)
def digits(params: DatasetParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """scikit-learn's 8x8 handwritten digits: 1,437 train / 360 test, 1 channel, 10 classes.

    Bundled with scikit-learn, so it needs no files (``data_dir`` is accepted for a uniform loader signature
    and ignored); ideal for quick runs. Pixel values 0..16 are scaled to 0..255. The split is stratified with a
    fixed seed, so it never changes. The arrays are kept in the array cache (``cache_dir``), keyed by
    scikit-learn's version and its bundled file: a later run reads them without importing scikit-learn (2-3 s
    of a short run's start on a loaded machine).
    """
    import importlib.metadata
    import importlib.util

    def build() -> ArrayDataset:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x = np.rint(np.asarray(bunch.data, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 1, 8, 8)
        y = np.asarray(bunch.target, dtype=np.int64)
        train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=360, stratify=y, random_state=0)
        train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
        classes = [str(i) for i in range(10)]
        return ArrayDataset.from_arrays("digits", x[train_idx], y[train_idx], x[test_idx], y[test_idx], classes)

    spec = importlib.util.find_spec("sklearn")  # where scikit-learn is, without importing it
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    bundled = Path(folders[0]) / "datasets" / "data" / "digits.csv.gz" if folders else None
    if bundled is None or not bundled.is_file():
        return build()  # an unusual scikit-learn: no cache, as before
    options = {"scikit-learn": importlib.metadata.version("scikit-learn")}
    return cached("digits", options, [bundled], cache_dir, build)


SYNTHETIC_MAX_PIXELS = 2**27
"""The most pixels the ``synthetic`` dataset generates (about 1 GiB of float64 noise at once)."""


class SyntheticParams(DatasetParams, kw_only=True):
    """Options of ``synthetic``: sizes, image shape, pixel ``noise``, ``num_domains`` (0: none) and ``seed``."""

    num_train: int = 512
    num_test: int = 128
    num_classes: int = 10
    image_size: int = 16
    channels: int = 1
    noise: float = 0.6
    num_domains: int = 0
    seed: int = 0

    at_least = minimums(num_train=1, num_test=0, num_classes=2, image_size=2, noise=0, num_domains=0, seed=0)
    at_most = maximums(image_size=MAX_IMAGE_SIZE)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_channels(self.channels)
        pixels = (self.num_train + self.num_test) * self.channels * self.image_size**2
        check(pixels <= SYNTHETIC_MAX_PIXELS, "num_train + num_test", self.num_train + self.num_test,
              f"such that (num_train + num_test) x channels x image_size^2 <= {SYNTHETIC_MAX_PIXELS:_} pixels "
              f"(they are generated in memory; here {pixels:_})")


@DATASETS.register("synthetic", params=SyntheticParams)
def synthetic(p: SyntheticParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """A tiny generated dataset for tests and smoke runs (no files; data/cache dirs are ignored).

    Each class has a smooth random prototype image; samples are the prototype plus Gaussian
    pixel noise of std ``noise`` (prototypes have unit std), so a small model learns it within
    a few steps while it is not trivially separable. Labels are balanced. With
    ``num_domains > 0`` every sample also gets a domain whose brightness gain and per-channel
    offset change its appearance but not its class, which mimics domain (feature) skew.
    """
    name = "synthetic"
    size, channels, num_classes, num_domains = p.image_size, p.channels, p.num_classes, p.num_domains
    rng = np.random.default_rng(p.seed)

    # Low-frequency prototypes: random values on a coarse grid, upsampled by repetition.
    coarse = max(2, size // 4)
    grid = rng.normal(size=(num_classes, channels, coarse, coarse))
    reps = math.ceil(size / coarse)
    protos = grid.repeat(reps, axis=2).repeat(reps, axis=3)[:, :, :size, :size]
    protos /= protos.std(axis=(1, 2, 3), keepdims=True)
    gains = rng.uniform(0.6, 1.4, size=num_domains)
    offsets = rng.normal(scale=0.8, size=(num_domains, channels, 1, 1))

    def draw(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(count) % num_classes).astype(np.int64)
        domains = rng.integers(max(num_domains, 1), size=count).astype(np.int64)
        values = protos[labels] + p.noise * rng.normal(size=(count, channels, size, size))
        if num_domains:
            values = values * gains[domains][:, None, None, None] + offsets[domains]
        pixels = np.clip(np.rint(128.0 + 40.0 * values), 0, 255).astype(np.uint8)
        return pixels, labels, domains

    x_train, y_train, d_train = draw(p.num_train)
    x_test, y_test, d_test = draw(p.num_test)
    classes = [f"class_{i}" for i in range(num_classes)]
    if not num_domains:
        return ArrayDataset.from_arrays(name, x_train, y_train, x_test, y_test, classes)
    return ArrayDataset.from_arrays(
        name,
        x_train,
        y_train,
        x_test,
        y_test,
        classes,
        domains_train=d_train,
        domains_test=d_test,
        domain_names=[f"domain_{i}" for i in range(num_domains)],
    )
