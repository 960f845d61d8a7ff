"""Typed hyper-parameters from plain config tables.

Each algorithm declares its hyper-parameters as a dataclass whose defaults are the paper's values. This
module turns a config table into that dataclass, rejecting unknown keys and values of the wrong type with
a :class:`ConfigError` that names the key and what is allowed. Every number is checked here once for all
Params: a float must be finite (``nan`` and ``inf`` are refused), an integer must fit 64 bits.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from fedskew.core.errors import ConfigError

P = TypeVar("P")


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is typing.Literal:
        if isinstance(value, float) and not math.isfinite(value) and _word(value) in args:
            return _word(value)  # TOML reads the bare words nan and inf as numbers (faults.attack = nan)
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key} must be one of {allowed}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        inner = args[0] if args else Any
        return [_coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return dict(value)
    if annotation is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # TOML and the command line may spell an integer as 3.0
    if annotation in _SCALARS:
        accepts, allowed = _SCALARS[annotation]
        if isinstance(value, bool) != (annotation is bool) or not isinstance(value, accepts):
            raise ConfigError(f"{key} must be {allowed}, got {value!r}")
        if annotation is float:
            return _finite(key, value)
        if isinstance(value, int) and annotation is int and not -INT_LIMIT <= value < INT_LIMIT:
            raise ConfigError(f"{key} must be an integer of at most 64 bits (|value| < 2**63), got {value!r}")
        return value
    return value


def _finite(key: str, value: Any) -> float:
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return number


INT_LIMIT = 2**63
"""Every integer option fits a signed 64-bit integer (what numpy and torch take); ranges of their own are
checked by each Params class."""


def _word(value: float) -> str:
    """The TOML spelling of a non-finite float: ``nan``, ``inf`` or ``-inf``."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


_SCALARS: dict[Any, tuple[type | tuple[type, ...], str]] = {
    bool: (bool, "true or false"),
    int: (int, "an integer"),
    float: ((int, float), "a number"),
    str: (str, "a string"),
}
"""Scalar annotation -> (accepted Python types, what the error calls them); bool is never a number."""


def build_params(cls: type[P], table: Mapping[str, Any], prefix: str = "") -> P:
    """Instantiate the dataclass ``cls`` from ``table``.

    Parameters
    ----------
    cls
        A dataclass type; its field annotations drive type checking. A field whose type is itself a
        dataclass is a nested table (``[algorithm.server]``): its keys are merged into the field's
        default and checked the same way. A ``renamed`` class attribute (old key -> new dotted key)
        turns an old key into an error that names the new one. A ``presets`` class attribute (option ->
        word -> settings, nested tables as dicts) fills in the settings of the word the table gives that
        option (or of its default word); the keys the table gives itself win over the preset's.
    table
        Key -> value, as read from a config file.
    prefix
        Printed before each key in error messages (``"algorithm."``).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    renamed: Mapping[str, str] = getattr(cls, "renamed", {})
    table = with_presets(cls, table, fields)
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields:
            if key in renamed:
                raise ConfigError(f"{prefix + key!r} is now {prefix + renamed[key]!r}; rename the key")
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key {prefix + key!r}; allowed: {allowed}")
        if dataclasses.is_dataclass(hints[key]):
            kwargs[key] = _build_nested(fields[key], hints[key], key, value, prefix)
        else:
            kwargs[key] = _coerce(prefix + key, value, hints[key])
    try:
        built = cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None
    check_sizes(built, prefix)
    return built


def with_presets(
    cls: type, table: Mapping[str, Any], fields: Mapping[str, dataclasses.Field[Any]]
) -> Mapping[str, Any]:
    """``table`` under the settings of the presets it chooses (``cls.presets``, see :func:`build_params`)."""
    for option, words in getattr(cls, "presets", {}).items():
        word = table.get(option, fields[option].default)
        if isinstance(word, str) and word in words:
            table = _merged(words[word], table)
    return table


def _merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s keys on it, nested tables merged key by key."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(below, Mapping) and isinstance(value, Mapping) else value
    return out


MAX_BATCH = 65_536
MAX_EPOCHS = 10_000
MAX_STEPS = 1_000_000
MAX_IPC = 10_000
MAX_COUNT = 1_000_000
MAX_WIDTH = 65_536
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("batch_size", "real_batch", "pretrain_batch_size", "gen_batch_size", "kip_target_batch",
                     "personalized_batch_size"), (MAX_BATCH, "samples a batch")),
    **dict.fromkeys(("local_epochs", "epochs", "epochs_per_round", "pretrain_epochs", "personalized_epochs",
                     "fine_tune_epochs", "finetune_epochs", "head_epochs", "personal_epochs", "max_init_epochs",
                     "local_steps", "inner_steps", "local_rounds"), (MAX_EPOCHS, "passes")),
    **dict.fromkeys(("condense_iterations", "kip_iterations", "gen_steps", "max_retries"), (MAX_STEPS, "steps")),
    **dict.fromkeys(("ipc", "kip_ipc"), (MAX_IPC, "images per class")),
    **dict.fromkeys(("num_clients", "clients_per_round", "max_clients", "num_clusters", "num_homogeneous",
                     "kip_images", "public_size", "num_train", "num_test", "num_classes", "classes",
                     "shards_per_client", "kmeans_n_init", "max_per_class", "num_pre_loss", "layers"), (MAX_COUNT, "")),
    **dict.fromkeys(("net_width", "hidden", "noise_dim", "gen_hidden", "swd_projections"), (MAX_WIDTH, "units")),
    "net_depth": (256, "layers"),
}
"""Upper bounds of size-like options, by option name, for every parameter class (plug-ins' included): a value
beyond them cannot fit in memory or finish, and is refused in one line before anything is loaded or
allocated (``algorithm.ipc = 1000000000`` once drove a machine into the kernel's out-of-memory killer)."""


def check_sizes(params: Any, prefix: str = "") -> None:
    """Refuse a size-like option of ``params`` (:data:`SIZE_LIMITS`, by name) above its bound; lists of sizes
    (``model.hidden = [64, 32]``) are checked item by item."""
    for f in dataclasses.fields(params):
        if f.name not in SIZE_LIMITS:
            continue
        limit, unit = SIZE_LIMITS[f.name]
        value = getattr(params, f.name)
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and v > limit:
                what = f"at most {limit:_}" + (f" {unit}" if unit else "")
                raise ConfigError(f"{prefix}{f.name} must be {what}, got {value!r}")


def _build_nested(f: dataclasses.Field[Any], kind: type, key: str, value: Any, prefix: str) -> Any:
    """A nested table: the field's default with the table's keys applied on top."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{prefix + key} must be a table, got {value!r}")
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else kind()
    merged = {g.name: getattr(default, g.name) for g in dataclasses.fields(default)}
    merged.update(value)
    return build_params(kind, merged, prefix=f"{prefix}{key}.")


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a ConfigError ``"<key> must be <allowed>, got <value>"`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")


@typing.dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
class Options:
    """The base of a parameter class (an algorithm's ``Params``): each subclass is made a dataclass, with no
    decorator, and declares its simple bounds rather than writing the checks out.

    The bounds (class attributes, merged over the subclasses; each fails with one line naming the option,
    its value and what is allowed; an option that is ``None`` is unset and passes):

    - :attr:`at_least`: option -> its smallest value (``{"local_epochs": 1}``); :attr:`at_most`: its largest
      (an integer option's message says so, and a pair of bounds is one range: ``rounds must be an integer in
      [1, 1_000_000], got 0``);
    - :attr:`positive`: options that are ``> 0``;
    - :attr:`fractions`: options in ``[0, 1)``; :attr:`unit`: options in ``[0, 1]``.

    Anything else goes in ``__post_init__``, which calls ``super().__post_init__()`` first. A subclass may
    still carry an explicit ``@dataclass``: its fields are kept, so the second pass sees the same fields.
    The decorator's ``kw_only`` and ``frozen`` are class keywords (``class PartitionParams(Options,
    kw_only=True)``); as with the decorator, ``kw_only`` holds for the class's own fields, not its subclasses'.
    """

    at_least: typing.ClassVar[Mapping[str, float]] = {}
    at_most: typing.ClassVar[Mapping[str, float]] = {}
    positive: typing.ClassVar[tuple[str, ...]] = ()
    fractions: typing.ClassVar[tuple[str, ...]] = ()
    unit: typing.ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, *, kw_only: bool = False, frozen: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(cls, kw_only=kw_only, frozen=frozen)
        own = inspect.get_annotations(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in own and f.name not in cls.__dict__:
                setattr(cls, f.name, f)  # a default_factory field: kept for an explicit @dataclass after this

    def __post_init__(self) -> None:
        declared = [vars(c) for c in reversed(type(self).__mro__)]
        lows = {n: low for table in declared for n, low in table.get("at_least", {}).items()}
        highs = {n: high for table in declared for n, high in table.get("at_most", {}).items()}
        cls: type = type(self)
        integers = _integer_fields(cls)
        for name in dict.fromkeys([*lows, *highs]):
            low, high = lows.get(name), highs.get(name)
            allowed = (f"in [{_number(low)}, {_number(high)}]" if low is not None and high is not None
                       else f">= {_number(low)}" if low is not None else f"<= {_number(highs[name])}")
            _bound(self, name, functools.partial(_within, low, high),
                   f"an integer {allowed}" if name in integers else allowed)
        for name in dict.fromkeys(n for table in declared for n in table.get("positive", ())):
            _bound(self, name, lambda v: v > 0, "> 0")
        for name in dict.fromkeys(n for table in declared for n in table.get("fractions", ())):
            _bound(self, name, lambda v: 0 <= v < 1, "in [0, 1)")
        for name in dict.fromkeys(n for table in declared for n in table.get("unit", ())):
            _bound(self, name, lambda v: 0 <= v <= 1, "in [0, 1]")
        next_checks(super())


def minimums(**lows: float) -> Mapping[str, float]:
    """An :attr:`Options.at_least` declaration: option name -> its smallest allowed value (read-only)."""
    return types.MappingProxyType(lows)


def maximums(**highs: float) -> Mapping[str, float]:
    """An :attr:`Options.at_most` declaration: option name -> its largest allowed value (read-only)."""
    return types.MappingProxyType(highs)


@functools.cache
def _integer_fields(cls: type) -> frozenset[str]:
    """The fields of ``cls`` whose values are integers (``int``, ``int | None``): their bounds read "an integer
    >= 1", so that the message says what kind of value is allowed as well as its range."""
    out = set()
    for name, hint in typing.get_type_hints(cls).items():
        args = set(typing.get_args(hint)) - {type(None)} if typing.get_origin(hint) in (typing.Union, types.UnionType) \
            else {hint}
        if args == {int}:
            out.add(name)
    return frozenset(out)


def _within(low: float | None, high: float | None, value: Any) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _number(value: float) -> str:
    """A bound as an error prints it: integers whole, grouped from five digits (``1024``, ``1_000_000``), other
    numbers short."""
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    return f"{value:g}"


def option(default: Any = dataclasses.MISSING, *, help: str = "", resumable: bool = False,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A field of an :class:`Options` class with what it means (``help``, the text ``fedskew`` prints for it)
    and whether a resumed run may give it another value (``resumable``: ``rounds`` may grow, ``seed`` may
    not). Both live in the field's metadata and are read back by :func:`option_help` and
    :func:`resumable_options`, so the help text and the resumable set are generated from the class."""
    metadata = {"help": help, "resumable": resumable}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def option_help(cls: type) -> dict[str, str]:
    """Field name -> its help text (``option(help=...)``; empty where none is given), in field order."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def resumable_options(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` a resumed run may change (``option(resumable=True)``), in field order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable"))


def _bound(params: Any, name: str, ok: typing.Callable[[Any], bool], allowed: str) -> None:
    value = getattr(params, name)
    check(value is None or ok(value), name, value, allowed)


def next_checks(parent: Any) -> None:
    """Run the next ``__post_init__`` in the method resolution order, if there is one.

    Parameter dataclasses combine as mixins (``FedDC.Params(CondensationParams, FedAvg.Params)``);
    each ends its ``__post_init__`` with ``next_checks(super())`` so every class's checks run once.
    """
    post_init = getattr(parent, "__post_init__", None)
    if post_init is not None:
        post_init()


def as_table(params: Any, leave: typing.Iterable[str] = ()) -> dict[str, Any]:
    """The config table that builds ``params`` again (:func:`build_params`): each init field's value, a nested
    Params as its own table; the fields named in ``leave`` left out. What a typed component hands to an API
    that takes its options as keywords (``load_dataset(name, **options)``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        if f.init and f.name not in leave:
            value = getattr(params, f.name)
            out[f.name] = as_table(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    return out


def params_doc(cls: type) -> list[tuple[str, str, Any]]:
    """(name, type, default) of each field, for ``fedskew list`` and the docs; nested tables are
    listed key by key (``server.lr``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        )
        if dataclasses.is_dataclass(hints[f.name]) and default is not None:
            for name, kind, _ in params_doc(hints[f.name]):
                out.append((f"{f.name}.{name}", kind, getattr(default, name)))
            continue
        out.append((f.name, getattr(hints[f.name], "__name__", str(hints[f.name])), default))
    return out
