"""What a grid of runs is: the one place that decides a sweep's keys, their typed values, which runs each key
applies to, the grid's size and the text its points add to their labels.

A grid comes from a config's ``[sweep]`` table and from the command line: a list where a key takes one value
(``'partition.alpha=[0.1,0.5]'``). The rules (docs/configuration.md, "Sweeps"; docs/reliability.md, the fourth
pass):

- Precedence: the command line replaces the ``[sweep]`` table's values of a key, and a plain command-line value
  of a key the table sweeps (``partition.alpha=0.9``) is a grid of that one value (its runs are labelled
  ``alpha=0.9``). A swept key wins over the file's plain value of it.
- A key ``seed`` or ``seeds`` in a grid is the experiment's seeds (``seed=[0,1]`` runs seeds 0 and 1; each seed
  is already a run of its own).
- Every variant is swept over every key, but for a variant that sets the key itself (it keeps its own value: a
  variant that names its method keeps it under a grid over ``algorithm.name``) and an option of a named table
  (``algorithm.mu``, ``partition.alpha``) that the variant's component at that point does not have (FedAvg is
  not swept over ``mu``, an IID partition not over ``alpha``). A key that applies to no run at all is refused.
- Values are compared after typing (``[1, 1.0]`` for a float option is a repeat) and a grid has at most
  :data:`MAX_GRID_RUNS` runs, counted before a single point is made.
- A point's label is its variant's label then ``key=value`` for each swept key, by the key's last part
  (``alpha=0.1``; a ``*.name`` key by its table, ``algorithm=ditto``; a longer suffix where two keys share
  a last part). A variant with no label of its own is labelled by its method, so a point of a grid over
  ``algorithm.name`` is labelled by the method it runs (``ditto``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from fedskew.config.files import set_dotted
from fedskew.config.schema import (
    GENERIC_KEYS,
    NAMED,
    SECTIONS,
    EvalParams,
    Faults,
    LoggingParams,
    RayParams,
    RunSettings,
    _registry,
)
from fedskew.core.errors import ConfigError
from fedskew.core.params import _coerce

MAX_GRID_RUNS = 1000
"""The most runs a grid may make (variants x grid points x seeds), counted before any point is made."""

SEED_KEYS = ("seed", "seeds")
"""Keys that a grid turns into the experiment's seeds."""

NOT_SWEPT = {
    "name": "every run of an experiment shares its name (one folder); run the experiment once per name",
    "label": "the labels of a grid's points are made from their values; name them with --label TEMPLATE",
    "plugins": "the plug-ins apply to every run; list them all in plugins = [...]",
}
"""Top-level keys a grid may not sweep, and why."""


@dataclass(frozen=True)
class Axis:
    """One swept key and its values as given (typed per run by :meth:`Grid.expand`)."""

    key: str
    values: tuple[Any, ...]
    source: str  # "command line" or "[sweep] table"

    @property
    def section(self) -> str | None:
        """The named table (``algorithm``) of an option ``algorithm.mu`` or ``algorithm.name``; else None."""
        top = self.key.split(".")[0]
        return top if top in NAMED and "." in self.key else None

    @property
    def names_component(self) -> bool:
        """Whether this key is the ``name`` of a named table (``algorithm.name``): it decides the options."""
        return self.section is not None and self.key == f"{self.section}.name"


@dataclass
class Point:
    """A variant at one point of the grid: the swept values that apply to it, the text they add to its label,
    and what ``--only`` may select it by besides its full label (its variant's label)."""

    variant: dict[str, Any]
    values: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    variant_label: str | None = None


@dataclass
class _Plan:
    """A variant at one combination of the swept names: the keys that apply there."""

    index: int
    variant: dict[str, Any]
    own_names: dict[str, Any]
    names: dict[str, Any]
    axes: list[Axis]


@dataclass
class Grid:
    """The keys of a grid in order, with their values, and the seeds a grid gave (``seed=[0,1]``)."""

    axes: list[Axis] = field(default_factory=list)
    seeds: list[Any] | None = None
    seeds_source: str = ""

    @property
    def keys(self) -> list[str]:
        return [a.key for a in self.axes]

    def describe(self) -> str:
        return "sweep over " + ", ".join(self.keys)

    def short_names(self) -> dict[str, str]:
        """Each key's name in labels: its last part (``alpha``), the table for a ``*.name`` key (``algorithm``),
        and the shortest dotted suffix no other swept key ends with where last parts collide."""
        out: dict[str, str] = {}
        for axis in self.axes:
            parts = axis.key.split(".")
            candidates = ([axis.section] if axis.names_component else []) + [
                ".".join(parts[-n:]) for n in range(1, len(parts) + 1)]
            for name in filter(None, candidates):
                if not any(_claims(other, name) for other in self.axes if other is not axis):
                    out[axis.key] = name
                    break
            else:
                out[axis.key] = axis.key
        return out

    def expand(self, variants: list[dict[str, Any]], base: dict[str, Any], overrides: dict[str, Any],
               seeds: int, where: str) -> list[Point]:
        """Every variant at every point of the grid (what applies to it), each value typed.

        Refused in one line: a grid over more than :data:`MAX_GRID_RUNS` runs (counted first, from the value
        counts), a key that applies to no run, a value of the wrong type and a value given twice (compared
        after typing).
        """
        if not self.axes:
            return [Point(v) for v in variants]
        names_axes = [a for a in self.axes if a.names_component]
        option_axes = [a for a in self.axes if not a.names_component]
        # The size, before any point is made: the name combinations alone are a lower bound of the runs.
        at_least = len(variants) * seeds * math.prod(len(a.values) for a in names_axes)
        if at_least > MAX_GRID_RUNS:
            self._too_big(at_least, where)
        for axis in names_axes:
            _typed_values(axis, {})  # names are strings, none given twice
        plans: list[_Plan] = []
        total = 0
        applied: set[str] = set()
        seen: dict[str, set[str]] = {sec: set() for sec in NAMED}
        for index, variant in enumerate(variants):
            own_names = _names_of(variant, base, overrides)
            swept_names = [a for a in names_axes if not _sets(variant, a.key)]
            applied.update(a.key for a in swept_names)
            for combo in itertools.product(*(a.values for a in swept_names)):
                names = {**own_names, **{a.section: v for a, v in zip(swept_names, combo, strict=True) if a.section}}
                for sec in NAMED:
                    seen[sec].add(str(names[sec]))
                here = [a for a in option_axes if not _sets(variant, a.key) and _has_option(a, names)]
                applied.update(a.key for a in here)
                total += seeds * math.prod(len(a.values) for a in here)
                plans.append(_Plan(index, variant, own_names, names, [*swept_names, *here]))
        if total > MAX_GRID_RUNS:
            self._too_big(total, where)
        for axis in self.axes:
            if axis.key not in applied:
                raise ConfigError(_applies_to_none(axis, variants, base, overrides, seen, where))
        return self._points(plans, base)

    def _points(self, plans: list[_Plan], base: dict[str, Any]) -> list[Point]:
        """The points of each variant, in the grid's order (the first key varies slowest), variant by variant."""
        short = self.short_names()
        position = {a.key: i for i, a in enumerate(self.axes)}
        typed_cache: dict[tuple[str, str | None], list[Any]] = {}
        ranked: list[tuple[int, tuple[int, ...], Point]] = []
        for plan in plans:
            lists: list[list[tuple[int, Any]]] = []
            for axis in plan.axes:
                if axis.names_component and axis.section:
                    value = plan.names[axis.section]
                    lists.append([(axis.values.index(value), value)])
                    continue
                component = plan.names.get(axis.section) if axis.section else None
                if (axis.key, component) not in typed_cache:
                    typed_cache[axis.key, component] = _typed_values(axis, plan.names)
                lists.append(list(enumerate(typed_cache[axis.key, component])))
            labelled = bool(plan.variant.get("label") or base.get("label"))
            method_swept = any(a.key == "algorithm.name" for a in plan.axes)
            variant_label = None if method_swept and not labelled else str(
                plan.variant.get("label") or base.get("label") or plan.own_names["algorithm"])
            for combo in itertools.product(*lists):
                values = {a.key: v for a, (_, v) in zip(plan.axes, combo, strict=True)}
                rank = [-1] * len(self.axes)
                for a, (i, _) in zip(plan.axes, combo, strict=True):
                    rank[position[a.key]] = i
                # A variant without a label is labelled by its method: the method is not said twice.
                shown = sorted((k for k in values if labelled or k != "algorithm.name"), key=position.__getitem__)
                text = ", ".join(f"{short[k]}={shown_value(values[k])}" for k in shown)
                ranked.append((plan.index, tuple(rank), Point(plan.variant, values, text, variant_label)))
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [point for _, _, point in ranked]

    def _too_big(self, runs: int, where: str) -> typing.NoReturn:
        counts = " x ".join(f"{len(a.values)} ({a.key})" for a in self.axes)
        raise ConfigError(
            f"{where}: {self.describe()} makes {runs:_} runs ({counts} values, times the variants and seeds), more "
            f"than the {MAX_GRID_RUNS:_} a grid may have; sweep fewer values, or split it into several experiments"
        )


def _claims(other: Axis, name: str) -> bool:
    """Whether swept key ``other`` could be shown as ``name`` too (its key ends with it, or it is the table's
    ``name`` and ``name`` is the table)."""
    return other.key == name or other.key.endswith("." + name) or (other.names_component and other.section == name)


def shown_value(value: Any) -> str:
    """A value as a label shows it: ``true`` and ``false`` as TOML writes them, anything else as ``str``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def grid_of(raw: dict[str, Any], overrides: dict[str, Any], base: dict[str, Any], where: str) -> Grid:
    """The grid of an experiment: the ``[sweep]`` table's keys and value lists, then every command-line value
    that is a list where its key takes one value, then every plain command-line value of a key the table sweeps
    (a grid of that one value). Those are taken out of ``overrides``; so are ``seed=[...]`` (the seeds, put back
    as ``seeds``). A key that takes a list (``seeds``, ``at_rounds``, ``model.hidden``) stays an override."""

    table = raw.get("sweep", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: sweep must be a table of dotted keys and lists of values")
    grid = Grid()
    axes: dict[str, Axis] = {}
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: sweep.{key} must be a non-empty list of values, got {values!r}")
        axes[str(key)] = Axis(str(key), tuple(values), "[sweep] table")
    merged = {**base, **overrides}
    for key, value in list(overrides.items()):
        if isinstance(value, list) and not takes_list(key, merged):
            if not value:
                raise ConfigError(f"{key}=[] sweeps over no value; give one value or a list of values")
            axes[key] = Axis(key, tuple(value), "command line")
            del overrides[key]
        elif key in axes and axes[key].source == "[sweep] table":  # a plain value of a swept key: a grid of one value
            axes[key] = Axis(key, (value,), "command line")
            del overrides[key]
    for key in SEED_KEYS:
        if key in axes:
            axis = axes.pop(key)
            if axis.source == "command line":
                if "seeds" in overrides or "seed" in overrides:
                    raise ConfigError("give seed=[...] or seeds=[...] on the command line, not both")
                overrides["seeds"] = list(axis.values)
            elif grid.seeds is None:
                grid.seeds, grid.seeds_source = list(axis.values), f"sweep.{key}"
            else:
                raise ConfigError(f"{where}: the [sweep] table gives both seed and seeds; give the seeds once")
    for key in axes:
        _check_key(key, where)
    grid.axes = list(axes.values())
    return grid


def _check_key(key: str, where: str) -> None:
    top = key.split(".")[0]
    if key in NOT_SWEPT:
        raise ConfigError(f"{where}: a grid cannot sweep {key}: {NOT_SWEPT[key]}")
    if top in SECTIONS and "." not in key:
        raise ConfigError(f"{where}: a grid cannot sweep the whole table {key}: sweep its keys ({key}.name, ...) or "
                          "write [[variants]]")
    set_dotted({}, key, None)  # an unknown top-level key or a key nested too deeply: one line


def _sets(variant: dict[str, Any], key: str) -> bool:
    """Whether ``variant`` sets ``key`` itself (or the whole table it is in): it keeps its own value."""
    return key in variant or key.split(".")[0] in variant


def _names_of(variant: dict[str, Any], base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, str]:
    """The names of the named tables (dataset, partition, model, algorithm) of a variant before the grid."""
    out = {}
    for sec in NAMED:
        name: Any = base[sec].get("name")
        for source in (variant, overrides):
            if isinstance(source.get(sec), dict) and "name" in source[sec]:
                name = source[sec]["name"]
            if f"{sec}.name" in source:
                name = source[f"{sec}.name"]
        out[sec] = name
    return out


def _params_class(section: str, name: Any) -> type | None:
    """The Params class of the ``name`` entry of a named table; None for an unknown name (validation reports it)."""
    registry = _registry(section)
    if not isinstance(name, str) or name not in registry:
        return None
    return registry.params_of(name)


def _has_option(axis: Axis, names: dict[str, Any]) -> bool:
    """Whether an option of a named table (``algorithm.mu``) belongs to the component a run has there; a key of
    another table, or of a component that is not registered (refused when validated), applies."""
    if axis.section is None:
        return True
    option = axis.key.split(".")[1]
    cls = _params_class(axis.section, names[axis.section])
    if cls is None or option in GENERIC_KEYS.get(axis.section, set()):
        return True
    return option in {f.name for f in dataclasses.fields(cls)}


def annotation(key: str, names: dict[str, Any]) -> Any:
    """The declared type of config key ``key`` for a run whose named tables have ``names``; None when unknown."""
    parts = key.split(".")
    kind: Any
    if len(parts) == 1:
        kind = RunSettings
    elif parts[0] in NAMED:
        if parts[1:] == ["name"]:
            return str
        kind = _params_class(parts[0], names.get(parts[0]))
        if kind is None:
            return None
    else:
        kind = {"faults": Faults, "ray": RayParams, "eval": EvalParams, "logging": LoggingParams}.get(parts[0])
    for part in parts[1:] if len(parts) > 1 else parts:
        hints = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {}
        if part not in hints:
            return None
        kind = hints[part]
    return kind


def _typed_values(axis: Axis, names: dict[str, Any]) -> list[Any]:
    """The values of ``axis`` typed as the run's option declares (an integer for a float option becomes a float);
    one given twice, compared after typing, is refused."""
    kind = annotation(axis.key, names)
    typed = [v if kind is None else _coerce(axis.key, v, kind) for v in axis.values]
    seen: dict[Any, Any] = {}
    for given, value in zip(axis.values, typed, strict=True):
        canon = _canon(value)
        if canon in seen:
            first = seen[canon]
            same = f"{first!r}" if repr(first) == repr(given) else f"{first!r} and {given!r} are both {value!r}"
            raise ConfigError(f"sweep over {axis.key} repeats a value: {same} (values compared as the option "
                              f"takes them); values: {list(axis.values)!r}")
        seen[canon] = given
    return typed


def _canon(value: Any) -> Any:
    """A hashable form of a config value in which equal values are equal: ``1`` and ``1.0`` (Python compares
    numbers exactly), a NaN and a NaN; a boolean is never a number."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, list | tuple):
        return ("list", tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("table", tuple(sorted((str(k), _canon(v)) for k, v in value.items())))
    return (type(value).__name__, value)


def _applies_to_none(axis: Axis, variants: list[dict[str, Any]], base: dict[str, Any], overrides: dict[str, Any],
                     seen: dict[str, set[str]], where: str) -> str:
    """The line refusing a swept key that no run takes: why not."""
    if all(_sets(v, axis.key) for v in variants):
        labels = [str(v.get("label") or base.get("label") or _names_of(v, base, overrides)["algorithm"])
                  for v in variants]
        return (f"{where}: the {axis.source} sweeps {axis.key}, but every variant sets it itself "
                f"({', '.join(labels)}) and keeps its own value; drop it from the variants, or sweep another key")
    sec = axis.section or ""
    option = axis.key.split(".")[1]
    components = sorted(seen[sec])
    what = {"algorithm": "algorithm", "partition": "partitioner"}.get(sec, sec)
    allowed = ""
    cls = _params_class(sec, components[0]) if len(components) == 1 else None
    if cls is not None:
        allowed = f"; {components[0]}'s options: {', '.join(f.name for f in dataclasses.fields(cls))}"
    return (f"{where}: the {axis.source} sweeps {axis.key}, but no run's {what} ({', '.join(components)}) has the "
            f"option {option!r}{allowed}")


def takes_list(key: str, cfg: dict[str, Any]) -> bool:
    """Whether config key ``key`` takes a list (its option is declared as one), for a run whose named tables are
    as in ``cfg`` (a resolved config, or one with dotted ``*.name`` keys on top)."""
    if key.split(".")[0] in ("seeds", "plugins"):
        return True
    names: dict[str, Any] = {}
    for sec in NAMED:
        table = cfg.get(sec)
        names[sec] = cfg.get(f"{sec}.name", table.get("name") if isinstance(table, dict) else None)
    top = key.split(".")[0]
    swept = names.get(top)
    for name in swept if isinstance(swept, list) else [swept]:  # a grid over the table's name: any of them
        kind = annotation(key, {**names, top: name})
        args = [kind, *typing.get_args(kind)]
        if any(typing.get_origin(a) in (list, tuple) or a in (list, tuple) for a in args):
            return True
    return False
