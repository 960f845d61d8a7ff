"""How ``fedskew condense`` condenses, saves and reads a set: the methods with their published settings
(:func:`condense_set`), and the file (:func:`save_set`, :func:`load_set`).

Method settings default to the published ones (DC: Zhao, Mopuri & Bilen, ICLR 2021; DM: Zhao &
Bilen, WACV 2023; KIP: Nguyen, Chen & Lee, ICLR 2021), including their iteration counts, which take
hours on a CPU; ``iterations`` scales them down. Every method starts from random real images drawn
first from the seeded generator, so for a given seed DC, DM and KIP start from exactly the subset that
``method = "random"`` keeps, and any gain over it is the condensation's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedskew.condense.augment import DSAConfig
from fedskew.condense.distribution_matching import DMConfig, distribution_matching
from fedskew.condense.gradient_matching import GMConfig, gradient_matching
from fedskew.condense.kip import KIPConfig, kip
from fedskew.condense.samplers import random_model_sampler
from fedskew.condense.synthetic import ModelFactory, SyntheticSet, UInt8Set, init_synthetic
from fedskew.core.errors import ConfigError, DataError

METHOD_TITLES = {"dc": "DC", "dm": "DM", "kip": "KIP", "random": "random real images"}
"""How the grid's title names each method."""
PUBLISHED_ITERATIONS = {"dc": 1000, "dm": 20000, "kip": 1000, "random": 0}
"""Default iteration counts: DC's 1000 outer iterations, DM's 20,000 steps, and 1000 KIP steps (the
library default; KIP's own runs are longer)."""

DC_LOOPS = ((1, 1, 1), (10, 10, 50), (20, 20, 25), (30, 30, 20), (40, 40, 15), (50, 50, 10))
"""DC's ``(ipc, outer_loop, inner_loop)`` schedule (its code's ``get_loops``); other ipc values take
the row of the largest listed ipc below them."""

NO_FLIP_DATASETS = ("digits", "mnist")
"""Datasets whose mirrored images may change class, so DSA drops the flip for them (as DSA does for
MNIST)."""


@dataclass
class MethodSettings:
    """Knobs of a condensation run; ``None`` means the method's published value.

    Attributes
    ----------
    iterations
        DC: network draws (each ``outer_loop`` image updates); DM and KIP: image updates.
    image_lr
        Image learning rate (DC 0.1, DM 1.0, KIP 0.01 with Adam).
    real_batch
        Real images per class per step (DC, DM: 256), or KIP's target batch over all classes (256).
    dsa
        Siamese augmentation while matching (DC: off, DM: on; ``True`` for DC is DSA's method).
    outer_loop, inner_loop
        DC's matching steps per network draw and network-training steps between them
        (see :data:`DC_LOOPS`).
    kernel
        KIP's kernel, ``"ntk"`` or ``"rf_convnet"``.
    rf_width
        Channels of the random ConvNets of the ``"rf_convnet"`` kernel (DC's width, 128).
    learn_labels
        KIP also learns the labels (saved as soft labels, which evaluation regresses).
    bn_statistics
        DM with a BatchNorm network: ``"separate"`` or ``"pooled"`` batch statistics (``DMConfig.bn_statistics``).
    """

    iterations: int | None = None
    image_lr: float | None = None
    real_batch: int | None = None
    dsa: bool | None = None
    outer_loop: int | None = None
    inner_loop: int | None = None
    kernel: str = "ntk"
    rf_width: int = 128
    learn_labels: bool = False
    bn_statistics: str = "pooled"


def dc_loops(ipc: int) -> tuple[int, int]:
    """DC's ``(outer_loop, inner_loop)`` for ``ipc`` (see :data:`DC_LOOPS`)."""
    row = max((r for r in DC_LOOPS if r[0] <= ipc), key=lambda r: r[0])
    return row[1], row[2]


def dsa_config(dataset: str) -> DSAConfig:
    """DSA's default augmentation, without flips for digit datasets."""
    return DSAConfig(flip=dataset not in NO_FLIP_DATASETS)


def iterations_of(method: str, settings: MethodSettings) -> int:
    """The iteration count a run will use (0 for ``random``, which has nothing to iterate)."""
    if method == "random" or settings.iterations is None:
        return PUBLISHED_ITERATIONS[method]
    return settings.iterations


def condense_set(
    method: str,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    ipc: int,
    model_factory: ModelFactory,
    settings: MethodSettings,
    generator: torch.Generator,
    dsa: DSAConfig,
    progress: bool = False,
) -> SyntheticSet:
    """Condense ``(x, y)`` (normalised) into ``ipc`` images per class with ``method``.

    ``dsa`` is the augmentation used when ``settings.dsa`` (or the method's default) turns it on.
    Raises :class:`ConfigError` for an unknown method or invalid settings.
    """
    if method not in PUBLISHED_ITERATIONS:  # its keys are the methods (fedskew.cli.condense.METHODS)
        raise ConfigError(f"unknown method {method!r}; choose from {', '.join(PUBLISHED_ITERATIONS)}")
    iterations = iterations_of(method, settings)
    if method == "random":
        return init_synthetic(x, y, sorted(set(y.tolist())), ipc, "real", generator)
    if method == "dc":
        outer, inner = dc_loops(ipc)
        gm = GMConfig(
            iterations=iterations,
            ipc=ipc,
            image_lr=0.1 if settings.image_lr is None else settings.image_lr,
            momentum=0.5,
            clip_norm=None,
            real_batch=settings.real_batch or 256,
            distance="dc",
            outer_loop=outer if settings.outer_loop is None else settings.outer_loop,
            inner_loop=inner if settings.inner_loop is None else settings.inner_loop,
            init="real",
            dsa=dsa if settings.dsa else None,
        )
        return gradient_matching(x, y, model_factory, gm, generator, progress)
    if method == "dm":
        dm = DMConfig(
            iterations=iterations,
            ipc=ipc,
            image_lr=1.0 if settings.image_lr is None else settings.image_lr,
            momentum=0.5,
            real_batch=settings.real_batch or 256,
            init="real",
            dsa=None if settings.dsa is False else dsa,
            bn_statistics=settings.bn_statistics,
        )
        return distribution_matching(x, y, random_model_sampler(model_factory), dm, generator, progress=progress)
    cfg = KIPConfig(
        iterations=iterations,
        ipc=ipc,
        lr=0.01 if settings.image_lr is None else settings.image_lr,
        target_batch=settings.real_batch or 256,
        kernel=settings.kernel,
        rf_width=settings.rf_width,
        learn_labels=settings.learn_labels,
        init="real",
    )
    return kip(x, y, num_classes, cfg, generator, progress)


def save_set(path: Path, u: UInt8Set, mean: Sequence[float], std: Sequence[float], info: dict[str, Any]) -> None:
    """Write a quantised set as safetensors, with ``mean``/``std`` and ``info`` as JSON metadata."""
    from safetensors.torch import save_file

    tensors = {"images": u.images.contiguous(), "labels": u.labels.contiguous()}
    if u.soft_labels is not None:
        tensors["soft_labels"] = u.soft_labels.contiguous()
    meta = {"mean": json.dumps(list(mean)), "std": json.dumps(list(std))}
    meta.update({k: json.dumps(v) for k, v in info.items()})
    save_file(tensors, str(path), metadata=meta)


def load_set(path: Path) -> tuple[SyntheticSet, UInt8Set, dict[str, Any]]:
    """Read a file written by :func:`save_set`.

    Returns
    -------
    tuple
        The set in the normalised training space, the stored 8-bit set, and the metadata (decoded
        from JSON, ``mean`` and ``std`` included).
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        u = UInt8Set(tensors["images"], tensors["labels"], tensors.get("soft_labels"))
        return SyntheticSet.from_uint8(u, meta["mean"], meta["std"]), u, meta
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        raise DataError(f"cannot read condensed set {path}: {e}") from None
