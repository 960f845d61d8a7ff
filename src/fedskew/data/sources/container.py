"""The dataset container every source produces: NCHW ``uint8`` images and ``int64`` labels in memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedskew.core.errors import ConfigError, DataError

__all__ = ["ArrayDataset", "channel_stats"]


@dataclass(eq=False, repr=False)
class ArrayDataset:
    """A whole dataset in memory as ``uint8`` images and ``int64`` labels.

    Images stay ``uint8`` (a quarter of the memory of ``float32``) until a model needs them;
    :meth:`to_tensors` normalises with the per-channel ``mean``/``std`` of the train split,
    which are computed once from ``x_train`` rather than copied from papers, so every
    dataset (including custom image folders) is normalised the same way.

    Attributes
    ----------
    name : str
        Registered dataset name (or a custom label).
    x_train, x_test : numpy.ndarray
        ``uint8`` images, shape ``(N, C, H, W)``.
    y_train, y_test : numpy.ndarray
        ``int64`` labels in ``[0, len(classes))``, shape ``(N,)``.
    classes : list of str
        Class names; the label is the index into this list.
    mean, std : tuple of float
        Per-channel mean and standard deviation of ``x_train / 255``.
    domains_train, domains_test : numpy.ndarray or None
        ``int64`` domain id per sample, for datasets whose clients differ by domain
        (feature skew); ``None`` for single-domain datasets.
    domain_names : list of str or None
        Name of each domain id.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    domains_train: np.ndarray | None = None
    domains_test: np.ndarray | None = None
    domain_names: list[str] | None = None

    def __post_init__(self) -> None:
        """Check shapes and dtypes up front: a wrong array would otherwise fail deep in training."""
        for split in ("train", "test"):
            x, y = self._split(split)
            if x.dtype != np.uint8 or x.ndim != 4:
                raise DataError(f"{self.name}: x_{split} must be uint8 (N, C, H, W), got {x.dtype} {x.shape}")
            if y.dtype != np.int64 or y.shape != (len(x),):
                raise DataError(f"{self.name}: y_{split} must be int64 of shape ({len(x)},), got {y.dtype} {y.shape}")
            if len(y) and (y.min() < 0 or y.max() >= len(self.classes)):
                raise DataError(f"{self.name}: y_{split} has labels outside [0, {len(self.classes)})")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"{self.name}: train images {self.x_train.shape[1:]} and test images "
                f"{self.x_test.shape[1:]} differ in shape"
            )
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise DataError(f"{self.name}: mean/std need one value per channel ({self.in_channels})")
        self._check_domains()

    def _check_domains(self) -> None:
        train, test, names = self.domains_train, self.domains_test, self.domain_names
        if train is None and test is None and names is None:
            return
        if train is None or test is None or names is None:
            raise DataError(f"{self.name}: domains_train, domains_test and domain_names go together")
        for split, domains, count in (("train", train, len(self.y_train)), ("test", test, len(self.y_test))):
            if domains.dtype != np.int64 or domains.shape != (count,):
                raise DataError(f"{self.name}: domains_{split} must be int64 of shape ({count},)")
            if count and (domains.min() < 0 or domains.max() >= len(names)):
                raise DataError(f"{self.name}: domains_{split} has ids outside [0, {len(names)})")

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
        classes: Sequence[str],
        *,
        domains_train: np.ndarray | None = None,
        domains_test: np.ndarray | None = None,
        domain_names: Sequence[str] | None = None,
    ) -> ArrayDataset:
        """Build a dataset, computing ``mean``/``std`` from ``x_train`` so callers cannot get them wrong."""
        mean, std = channel_stats(x_train)
        return cls(
            name=name,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            classes=list(classes),
            mean=mean,
            std=std,
            domains_train=domains_train,
            domains_test=domains_test,
            domain_names=None if domain_names is None else list(domain_names),
        )

    @property
    def num_classes(self) -> int:
        """Number of classes (length of :attr:`classes`)."""
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        """Image channels ``C`` (1 for grayscale, 3 for RGB)."""
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        """Image height ``H`` (all bundled datasets are square)."""
        return int(self.x_train.shape[2])

    def _split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split == "train":
            return self.x_train, self.y_train
        if split == "test":
            return self.x_test, self.y_test
        raise ConfigError(f"unknown split {split!r}; allowed: test, train")

    def to_tensors(self, split: str, index: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)`` of ``split`` (``"train"`` or ``"test"``) as torch tensors.

        ``x`` is ``float32`` normalised as ``(x / 255 - mean) / std``; ``y`` is ``int64``.
        Both are copies, so training code may modify them freely. ``index`` (integer rows) selects
        and orders the samples before the conversion, so no full-size float copy is made first.
        """
        x, y = self._split(split)
        if index is not None:
            x, y = x[index], y[index]
        shape = (1, self.in_channels, 1, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32).view(shape)
        images = torch.from_numpy(np.asarray(x, dtype=np.float32))  # a fresh, writable copy
        images.div_(255.0).sub_(mean).div_(std)
        return images, torch.from_numpy(y.copy())

    def train_subset(self, fraction: float, seed: int) -> ArrayDataset:
        """A class-stratified random ``fraction`` of the training split; the test split is kept whole.

        Each class keeps ``round(fraction * n_c)`` of its ``n_c`` images (at least one), drawn with
        ``seed``. ``mean``/``std`` stay those of the full training split, so a model sees inputs
        normalised the same way whatever the fraction. Used to scale experiments down to a small
        machine (the ``dataset.train_fraction`` config key).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ConfigError(f"dataset.train_fraction = {fraction!r} is not allowed; allowed: 0 < fraction <= 1")
        if fraction == 1:
            return self
        rng = np.random.default_rng(seed)
        keep = []
        for c in np.unique(self.y_train):
            rows = np.flatnonzero(self.y_train == c)
            take = max(1, round(fraction * len(rows)))
            keep.append(rng.choice(rows, size=take, replace=False))
        index = np.sort(np.concatenate(keep))
        return replace(
            self,
            x_train=self.x_train[index],
            y_train=self.y_train[index],
            domains_train=None if self.domains_train is None else self.domains_train[index],
        )

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.x_train.shape[1:])
        domains = f", domains={len(self.domain_names)}" if self.domain_names is not None else ""
        return (
            f"ArrayDataset({self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"image={shape}, classes={self.num_classes}{domains})"
        )


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of ``x / 255`` for NCHW ``uint8`` images.

    Accumulates in float64 over chunks so 60,000 CIFAR images need no full float copy. A
    constant channel gets std 1.0 instead of 0, so normalising it cannot divide by zero.
    """
    channels = x.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(x), 4096):
        chunk = x[start : start + 4096].astype(np.float64) / 255.0
        total += chunk.sum(axis=(0, 2, 3))
        squares += np.square(chunk).sum(axis=(0, 2, 3))
    count = max(1, x.shape[0] * x.shape[2] * x.shape[3])
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    std[std < 1e-6] = 1.0
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)
