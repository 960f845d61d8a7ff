"""``fedskew condense``: condense a dataset with DC, DM or KIP, save the set, and score it.

The command loads a dataset, condenses its training split into ``ipc`` images per class, quantises
the set to 8-bit pixels (the form in which condensation-based FL methods send it), writes it, and
scores the *quantised* set with the DC/DM evaluation protocol
(:func:`~fedskew.condense.evaluate.evaluate_synthetic`), so the accuracy reported is that of the
file on disk. ``--method random`` keeps a random real subset of the same size: the baseline a
condensation method has to beat. How each method runs, and the file format, are in
:mod:`fedskew.cli.condensation`.

Files written to ``--out``:

- ``synthetic.safetensors``: ``images`` (uint8, N x C x H x W), ``labels`` (int64) and, when KIP
  learns them, ``soft_labels`` (float32); the metadata holds the normalisation ``mean`` and ``std``
  (JSON lists) that :func:`~fedskew.cli.condensation.load_set` needs to map the pixels back to the
  training space, and the dataset, method and ipc;
- ``grid.png``: the images, one row per class, each row named by its class;
- ``result.json``: method, ipc, iterations, condensation seconds, seconds per iteration, test accuracy.

The settings are one :class:`CondenseSettings`: its fields are the keys of a settings file and of
``KEY=VALUE`` overrides, its flags (``--ipc``) are generated from it, and it holds their defaults, types,
choices, bounds and help text. This module imports no torch: ``fedskew --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

from fedskew.cli.common import DATA_HELP, add_import, data_dir
from fedskew.core.errors import ConfigError
from fedskew.core.params import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_IPC,
    MAX_STEPS,
    MAX_WIDTH,
    Options,
    build_params,
    maximums,
    minimums,
    option,
)

if typing.TYPE_CHECKING:
    from fedskew.cli.condensation import MethodSettings

NAME = "condense"
TRAILING = "items"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""

Method = Literal["dc", "dm", "kip", "random"]
METHODS: tuple[str, ...] = typing.get_args(Method)
"""Condensation methods of ``fedskew condense``; ``random`` is the random-real-subset baseline."""


class CondenseSettings(Options):
    """The settings of ``fedskew condense``; ``None`` is the method's published value.

    A help text that ends in a bracket says the default itself; the others get the default appended in
    brackets by :func:`add_parser` (booleans and ``None`` defaults: nothing). The method's own settings
    class (``GMConfig``, ``DMConfig``, ``KIPConfig``) and ``EvalConfig`` check their values again when
    :func:`~fedskew.cli.condensation.condense_set` builds them.
    """

    at_least = minimums(ipc=1, iterations=0, eval_epochs=0, net_width=1, real_batch=1, outer_loop=1, inner_loop=0,
                        threads=1)
    at_most = maximums(ipc=MAX_IPC, iterations=MAX_STEPS, eval_epochs=MAX_EPOCHS, net_width=MAX_WIDTH,
                       real_batch=MAX_BATCH, outer_loop=MAX_STEPS, inner_loop=MAX_STEPS, threads=1024)
    """Bounded before memory is (see :data:`fedskew.core.params.SIZE_LIMITS`)."""
    positive = ("image_lr",)

    dataset: str = option("digits", help="registered dataset name")
    method: Method = option("dm", help="dc, dm, kip or random (a random real subset)")
    ipc: int = option(1, help="images per class")
    iterations: int | None = option(None, help="condensation iterations [published: DC 1000, DM 20000, KIP 1000]")
    seed: int = option(0, help="seed of condensation and evaluation")
    out: str | None = option(None, help="output folder [runs/condense/<dataset>-<method>-ipc<N>-seed<S>]")
    eval_epochs: int = option(300, help="epochs of the evaluation training (key eval.epochs)")
    eval_dsa: bool = option(False, help="DSA augmentation in the evaluation training, as DSA and DM evaluate "
                                        "(key eval.dsa) [off, as DC evaluates]")
    model: str = option("convnet", help="network to condense with and evaluate (key model.name)")
    net_width: int | None = option(None, help="ConvNet width (key model.net_width) [128]")
    image_lr: float | None = option(None, help="image learning rate [DC 0.1, DM 1.0, KIP 0.01]")
    real_batch: int | None = option(None, help="real images per class per step (KIP: target batch) [256]")
    dsa: bool | None = option(None, help="augment while matching [on for DM, off for DC]")
    outer_loop: int | None = option(None, help="DC matching steps per network [DC's: 1 at ipc 1, 10 at 10]")
    inner_loop: int | None = option(None, help="DC network steps between them [DC's: 1 at ipc 1, 50 at 10]")
    kernel: Literal["ntk", "rf_convnet"] = option("ntk", help="KIP kernel: ntk or rf_convnet")
    bn_statistics: Literal["separate", "pooled"] = option(
        "pooled", help="DM with a BatchNorm network: pooled (real and synthetic images normalised in one pass) or "
                       "separate (a pass each, DM's code)")
    learn_labels: bool = option(False, help="KIP also learns the labels (saved as soft labels)")
    threads: int = option(1, help="torch threads [1: reproducible, fair to others]")


ALIASES = {"dataset.name": "dataset", "model.name": "model", "model.net_width": "net_width",
           "eval.epochs": "eval_epochs", "eval.dsa": "eval_dsa"}
"""Dotted keys of a settings file or override, and the setting each names (the others are named as is)."""


def flag(name: str) -> str:
    """The command-line flag of a setting: ``net_width`` -> ``--net-width``."""
    return "--" + name.replace("_", "-")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The subparser: one flag per :class:`CondenseSettings` field, in field order (``--data-dir`` after
    ``--dataset``). argparse only reads the words: every flag defaults to None (not given), and its value is
    typed and checked with the other settings by :func:`read_settings`. A boolean that defaults to None takes
    ``--x`` and ``--no-x``; one that defaults to False, ``--x``."""
    co = subparsers.add_parser(
        NAME, help="condense a dataset (DC, DM, KIP), save the set and score it",
        description="Settings come from an optional TOML file, then KEY=VALUE overrides (dotted, as for `fedskew "
                    "run`: method=kip ipc=10 model.net_width=32 eval.epochs=100), then the flags below, which are "
                    "aliases of those keys. Defaults in brackets.",
    )
    co.add_argument("items", nargs="*", metavar="CONFIG_OR_KEY=VALUE",
                    help="a TOML file of settings (first) and/or dotted overrides")
    hints = typing.get_type_hints(CondenseSettings)
    for f in dataclasses.fields(CondenseSettings):
        text = f.metadata["help"]
        if not (f.default is None or isinstance(f.default, bool) or text.endswith("]")):
            text = f"{text} [{f.default}]"
        if hints[f.name] is bool:
            co.add_argument(flag(f.name), action="store_true", default=None, help=text)
        elif f.default is None and _kinds(hints[f.name]) == {bool}:
            co.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            co.add_argument(flag(f.name), help=text)
        if f.name == "dataset":
            co.add_argument("--data-dir", help=DATA_HELP)
    co.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_import(co)
    co.set_defaults(func=cmd_condense)


def _kinds(hint: Any) -> set[Any]:
    """The types a field takes, None left out: ``int | None`` -> ``{int}``; a ``Literal`` stays whole."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint)) - {type(None)}
    return {hint}


def _flag_value(name: str, word: Any) -> Any:
    """A flag's value as the setting takes it: a word for a setting that takes words (``--dataset``,
    ``--method``), else read as a ``KEY=VALUE`` override's value is (``--ipc 10``, ``--image-lr 1e-3``), so
    that a flag and its key take the same values; booleans come from argparse as they are."""
    from fedskew.config.files import parse_value

    kinds = _kinds(typing.get_type_hints(CondenseSettings)[name])
    if not isinstance(word, str) or any(k is str or typing.get_origin(k) is Literal for k in kinds):
        return word
    return parse_value(word)


def read_settings(args: argparse.Namespace) -> CondenseSettings:
    """The command's settings: the defaults, then a TOML file (the first of ``args.items`` without an ``=``),
    then the ``KEY=VALUE`` items, then the flags given (aliases of the keys), built and checked by
    :func:`~fedskew.core.params.build_params`. A key that is not a setting, a second file, or a value of the
    wrong type, out of its choices or out of its bounds is refused in one line naming the key as it was given
    (``--ipc``, ``ipc``, ``model.net_width``), the value and what is allowed."""
    from fedskew.config import parse_overrides
    from fedskew.config.files import flat_keys, read_toml

    names = [f.name for f in dataclasses.fields(CondenseSettings)]
    files = [item for item in args.items if "=" not in item]
    if len(files) > 1:
        raise ConfigError(f"fedskew condense takes one settings file, got {', '.join(files)}")
    layers = [flat_keys(read_toml(Path(files[0]), "condense settings"))] if files else []
    layers.append(parse_overrides([item for item in args.items if "=" in item]))
    table: dict[str, Any] = {}
    given: dict[str, str] = {}  # setting -> the key or flag that gave it, for the error messages
    for layer in layers:
        for key, value in layer.items():
            name = ALIASES.get(key, key)
            if name not in names:
                raise ConfigError(f"unknown condense setting {key!r}; allowed: {', '.join([*names, *ALIASES])}")
            table[name], given[name] = value, key
    for name in names:  # the flags given last
        word = getattr(args, name, None)
        if word is not None:
            table[name], given[name] = _flag_value(name, word), flag(name)
    try:
        return build_params(CondenseSettings, table)
    except ConfigError as e:  # its messages start with the setting's name: say it as it was given
        name, _, rest = str(e).partition(" ")
        raise ConfigError(f"{given.get(name, name)} {rest}") from None


def method_settings(settings: CondenseSettings) -> MethodSettings:
    """The knobs of :func:`~fedskew.cli.condensation.condense_set` that ``settings`` gives."""
    from fedskew.cli.condensation import MethodSettings

    return MethodSettings(
        iterations=settings.iterations,
        image_lr=settings.image_lr,
        real_batch=settings.real_batch,
        dsa=settings.dsa,
        outer_loop=settings.outer_loop,
        inner_loop=settings.inner_loop,
        kernel=settings.kernel,
        rf_width=settings.net_width or 128,
        learn_labels=settings.learn_labels,
        bn_statistics=settings.bn_statistics,
    )


def cmd_condense(args: argparse.Namespace) -> int:
    """Run ``fedskew condense`` (see the module docstring); returns the exit code."""
    import json
    import sys
    import time
    from dataclasses import asdict
    from functools import partial

    from fedskew.cli.condensation import (
        METHOD_TITLES,
        condense_set,
        dsa_config,
        iterations_of,
        save_set,
    )
    from fedskew.condense.evaluate import EvalConfig, evaluate_synthetic
    from fedskew.condense.grids import labelled_grid_figure, save_figure
    from fedskew.condense.synthetic import SyntheticSet
    from fedskew.core.allocator import keep_freed_memory
    from fedskew.core.figures import DEFAULT_STYLE, dataset_title
    from fedskew.core.seeding import torch_generator
    from fedskew.core.threads import num_threads
    from fedskew.data import load_dataset
    from fedskew.models import create_model

    s = read_settings(args)
    settings = method_settings(s)
    eval_cfg = EvalConfig(epochs=s.eval_epochs, dsa=dsa_config(s.dataset) if s.eval_dsa else None)
    ds = load_dataset(s.dataset, data_dir(args))
    options = {} if s.net_width is None else {"net_width": s.net_width}
    factory = partial(
        create_model, s.model, in_channels=ds.in_channels, num_classes=ds.num_classes, image_size=ds.image_size,
        **options,
    )
    factory()  # a bad model name or option fails here, before any work
    out = Path(s.out or f"runs/condense/{s.dataset}-{s.method}-ipc{s.ipc}-seed{s.seed}")
    out.mkdir(parents=True, exist_ok=True)
    x, y = ds.to_tensors("train")
    x_test, y_test = ds.to_tensors("test")
    progress = not args.no_progress
    iterations = iterations_of(s.method, settings)
    keep_freed_memory()
    with num_threads(s.threads):
        start = time.perf_counter()
        syn = condense_set(
            s.method, x, y, ds.num_classes, s.ipc, factory, settings,
            torch_generator(s.seed, "condense"), dsa_config(s.dataset), progress,
        )
        seconds = time.perf_counter() - start
        u = syn.to_uint8(ds.mean, ds.std)
        stored = SyntheticSet.from_uint8(u, ds.mean, ds.std)
        start = time.perf_counter()
        accuracy = evaluate_synthetic(
            stored, x_test, y_test, factory, eval_cfg, torch_generator(s.seed, "evaluate"), progress=progress
        )
        eval_seconds = time.perf_counter() - start
    info = {"dataset": s.dataset, "method": s.method, "ipc": s.ipc}
    save_set(out / "synthetic.safetensors", u, ds.mean, ds.std, info)
    names = [str(c) for c in ds.classes] or None
    with DEFAULT_STYLE.context():  # the report's style and dataset names
        method = METHOD_TITLES.get(s.method, s.method)
        title = f"{dataset_title(s.dataset)}, {method}, {s.ipc} image{'s' if s.ipc != 1 else ''} per class"
        grid = labelled_grid_figure(u.images, u.labels, names, title=title,
                                    scale=max(2, round(32 / int(u.images.shape[2]))))
        save_figure(grid, out / "grid.png", DEFAULT_STYLE.dpi)
    result = {
        **info,
        "seed": s.seed,
        "iterations": iterations,
        "seconds": round(seconds, 3),
        "seconds_per_step": round(seconds / iterations, 4) if iterations else None,
        "test_accuracy": accuracy,
        "eval_seconds": round(eval_seconds, 3),
        "eval": {**asdict(eval_cfg), "dsa": s.eval_dsa},
        "model": s.model,
        "model_options": options,
        "settings": asdict(settings),
        "threads": s.threads,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{s.method} ipc={s.ipc} on {s.dataset}: test accuracy {accuracy:.4f} "
          f"({len(syn)} images, {iterations} iterations in {seconds:.1f} s)")
    print(f"written: {out}/synthetic.safetensors, grid.png, result.json", file=sys.stderr)
    return 0
