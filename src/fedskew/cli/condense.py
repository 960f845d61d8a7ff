"""``fedskew condense``: condense a dataset with DC, DM or KIP, save the set, and score it.

The command loads a dataset, condenses its training split into ``ipc`` images per class, quantises
the set to 8-bit pixels (the form in which condensation-based FL methods send it), writes it, and
scores the *quantised* set with the DC/DM evaluation protocol
(:func:`~fedskew.condense.evaluate.evaluate_synthetic`), so the accuracy reported is that of the
file on disk. ``--method random`` keeps a random real subset of the same size: the baseline a
condensation method has to beat.

Files written to ``--out``:

- ``synthetic.safetensors``: ``images`` (uint8, N x C x H x W), ``labels`` (int64) and, when KIP
  learns them, ``soft_labels`` (float32); the metadata holds the normalisation ``mean`` and ``std``
  (JSON lists) that :func:`load_set` needs to map the pixels back to the training space, and the
  dataset, method and ipc;
- ``grid.png``: the images, one row per class, each row named by its class;
- ``result.json``: method, ipc, iterations, condensation seconds, seconds per iteration, test accuracy.

Method settings default to the published ones (DC: Zhao, Mopuri & Bilen, ICLR 2021; DM: Zhao &
Bilen, WACV 2023; KIP: Nguyen, Chen & Lee, ICLR 2021), including their iteration counts, which take
hours on a CPU; ``--iterations`` scales them down. Every method starts from random real images drawn
first from the seeded generator, so for a given seed DC, DM and KIP start from exactly the subset that
``--method random`` keeps, and any gain over it is the condensation's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from fedskew.condense.augment import DSAConfig
from fedskew.condense.distribution_matching import (
    BN_STATISTICS,
    DMConfig,
    distribution_matching,
    random_model_sampler,
)
from fedskew.condense.evaluate import EvalConfig, evaluate_synthetic
from fedskew.condense.gradient_matching import GMConfig, gradient_matching
from fedskew.condense.kip import KIPConfig, kip
from fedskew.condense.synthetic import ModelFactory, SyntheticSet, UInt8Set, init_synthetic
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.params import MAX_BATCH, MAX_EPOCHS, MAX_IPC, MAX_STEPS, MAX_WIDTH
from fedskew.core.seeding import torch_generator
from fedskew.core.threads import num_threads

METHODS = ("dc", "dm", "kip", "random")
"""Condensation methods of ``fedskew condense``; ``random`` is the random-real-subset baseline."""

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
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
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


DEFAULTS: dict[str, Any] = {
    "dataset": "digits", "method": "dm", "ipc": 1, "iterations": None, "seed": 0, "out": None, "eval_epochs": 300,
    "eval_dsa": False, "model": "convnet", "net_width": None, "image_lr": None, "real_batch": None, "dsa": None,
    "outer_loop": None, "inner_loop": None, "kernel": "ntk", "learn_labels": False, "threads": 1,
    "bn_statistics": "pooled",
}
"""The settings of ``fedskew condense`` and their defaults (``None``: the method's published value)."""

TYPES: dict[str, type] = {
    "dataset": str, "method": str, "ipc": int, "iterations": int, "seed": int, "out": str, "eval_epochs": int,
    "eval_dsa": bool, "model": str, "net_width": int, "image_lr": float, "real_batch": int, "dsa": bool,
    "outer_loop": int, "inner_loop": int, "kernel": str, "learn_labels": bool, "threads": int,
    "bn_statistics": str,
}

ALIASES = {"dataset.name": "dataset", "model.name": "model", "model.net_width": "net_width",
           "eval.epochs": "eval_epochs", "eval.dsa": "eval_dsa"}
"""Dotted keys of a settings file or override, and the setting each names (the others are named as is)."""



def resolve_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The command's settings: :data:`DEFAULTS`, then a TOML file (the first of ``args.items`` without an
    ``=``), then the ``KEY=VALUE`` items, then the flags given (aliases of the keys). A key that is not a
    setting, a value of the wrong type, or a second file is refused in one line."""
    from fedskew.config import parse_overrides
    from fedskew.config.files import flat_keys, read_toml

    values = dict(DEFAULTS)
    files = [item for item in args.items if "=" not in item]
    if len(files) > 1:
        raise ConfigError(f"fedskew condense takes one settings file, got {', '.join(files)}")
    layers = [flat_keys(read_toml(Path(files[0]), "condense settings"))] if files else []
    layers.append(parse_overrides([item for item in args.items if "=" in item]))
    for layer in layers:
        for key, value in layer.items():
            name = ALIASES.get(key, key)
            if name not in DEFAULTS:
                allowed = ", ".join([*DEFAULTS, *ALIASES])
                raise ConfigError(f"unknown condense setting {key!r}; allowed: {allowed}")
            wanted = TYPES[name]
            ok = isinstance(value, wanted) and not (wanted is not bool and isinstance(value, bool))
            if wanted is float and isinstance(value, int) and not isinstance(value, bool):
                value, ok = float(value), True
            if not ok:
                raise ConfigError(f"condense setting {key} = {value!r} must be a {wanted.__name__}")
            values[name] = value
    for name in DEFAULTS:  # the flags given last
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    return argparse.Namespace(**{**vars(args), **values})


def _settings(args: argparse.Namespace) -> MethodSettings:
    """Method settings from the command line, with their values checked."""
    if args.method not in METHODS:
        raise ConfigError(f"--method must be one of {', '.join(METHODS)}, got {args.method!r}")
    if args.ipc < 1:
        raise ConfigError(f"--ipc must be >= 1, got {args.ipc}")
    for name in ("iterations", "real_batch", "outer_loop", "inner_loop"):
        value = getattr(args, name)
        if value is not None and value < (1 if name in ("real_batch", "outer_loop") else 0):
            raise ConfigError(f"--{name.replace('_', '-')} is out of range: {value}")
    if args.image_lr is not None and args.image_lr <= 0:
        raise ConfigError(f"--image-lr must be > 0, got {args.image_lr}")
    if args.bn_statistics not in BN_STATISTICS:
        raise ConfigError(f"--bn-statistics must be one of {', '.join(BN_STATISTICS)}, got {args.bn_statistics!r}")
    limits = {"ipc": MAX_IPC, "iterations": MAX_STEPS, "real_batch": MAX_BATCH, "outer_loop": MAX_STEPS,
              "inner_loop": MAX_STEPS, "eval_epochs": MAX_EPOCHS, "net_width": MAX_WIDTH, "threads": 1024}
    for name, limit in limits.items():  # bounded before memory is (see fedskew.core.params.SIZE_LIMITS)
        value = getattr(args, name, None)
        if isinstance(value, int) and value > limit:
            raise ConfigError(f"--{name.replace('_', '-')} must be at most {limit:_}, got {value}")
    return MethodSettings(
        iterations=args.iterations,
        image_lr=args.image_lr,
        real_batch=args.real_batch,
        dsa=args.dsa,
        outer_loop=args.outer_loop,
        inner_loop=args.inner_loop,
        kernel=args.kernel,
        rf_width=args.net_width or 128,
        learn_labels=args.learn_labels,
        bn_statistics=args.bn_statistics,
    )


def cmd_condense(args: argparse.Namespace, data_dir: str | None) -> int:
    """Run ``fedskew condense`` (see the module docstring); returns the exit code."""
    from fedskew.condense.grids import labelled_grid_figure, save_figure
    from fedskew.core.figures import DEFAULT_STYLE, dataset_title
    from fedskew.data import load_dataset
    from fedskew.models import create_model

    args = resolve_settings(args)
    settings = _settings(args)
    eval_cfg = EvalConfig(epochs=args.eval_epochs, dsa=dsa_config(args.dataset) if args.eval_dsa else None)
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    ds = load_dataset(args.dataset, data_dir)
    options = {} if args.net_width is None else {"net_width": args.net_width}
    factory = partial(
        create_model, args.model, in_channels=ds.in_channels, num_classes=ds.num_classes, image_size=ds.image_size,
        **options,
    )
    factory()  # a bad model name or option fails here, before any work
    out = Path(args.out or f"runs/condense/{args.dataset}-{args.method}-ipc{args.ipc}-seed{args.seed}")
    out.mkdir(parents=True, exist_ok=True)
    x, y = ds.to_tensors("train")
    x_test, y_test = ds.to_tensors("test")
    progress = not args.no_progress
    iterations = iterations_of(args.method, settings)
    keep_freed_memory()
    with num_threads(args.threads):
        start = time.perf_counter()
        syn = condense_set(
            args.method, x, y, ds.num_classes, args.ipc, factory, settings,
            torch_generator(args.seed, "condense"), dsa_config(args.dataset), progress,
        )
        seconds = time.perf_counter() - start
        u = syn.to_uint8(ds.mean, ds.std)
        stored = SyntheticSet.from_uint8(u, ds.mean, ds.std)
        start = time.perf_counter()
        accuracy = evaluate_synthetic(
            stored, x_test, y_test, factory, eval_cfg, torch_generator(args.seed, "evaluate"), progress=progress
        )
        eval_seconds = time.perf_counter() - start
    info = {"dataset": args.dataset, "method": args.method, "ipc": args.ipc}
    save_set(out / "synthetic.safetensors", u, ds.mean, ds.std, info)
    names = [str(c) for c in ds.classes] or None
    with DEFAULT_STYLE.context():  # the report's style and dataset names
        method = METHOD_TITLES.get(args.method, args.method)
        title = f"{dataset_title(args.dataset)}, {method}, {args.ipc} image{'s' if args.ipc != 1 else ''} per class"
        grid = labelled_grid_figure(u.images, u.labels, names, title=title,
                                    scale=max(2, round(32 / int(u.images.shape[2]))))
        save_figure(grid, out / "grid.png", DEFAULT_STYLE.dpi)
    result = {
        **info,
        "seed": args.seed,
        "iterations": iterations,
        "seconds": round(seconds, 3),
        "seconds_per_step": round(seconds / iterations, 4) if iterations else None,
        "test_accuracy": accuracy,
        "eval_seconds": round(eval_seconds, 3),
        "eval": {**asdict(eval_cfg), "dsa": args.eval_dsa},
        "model": args.model,
        "model_options": options,
        "settings": asdict(settings),
        "threads": args.threads,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.method} ipc={args.ipc} on {args.dataset}: test accuracy {accuracy:.4f} "
          f"({len(syn)} images, {iterations} iterations in {seconds:.1f} s)")
    print(f"written: {out}/synthetic.safetensors, grid.png, result.json", file=sys.stderr)
    return 0
