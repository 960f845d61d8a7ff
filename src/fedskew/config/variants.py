"""Expanding a config into its runs: variants x seeds, with command-line overrides."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedskew.config.files import TOP_LEVEL, set_dotted
from fedskew.config.grid import Grid, grid_of
from fedskew.config.schema import DEFAULTS, GENERIC_KEYS, NAMED, SECTIONS, RunConfig, option_default, typed_config
from fedskew.core.errors import ConfigError
from fedskew.plugins import check_specs, load_plugins
from fedskew.runs import MAX_LABEL, check_label, folder_label, run_folder_name


def _check_top(raw: dict[str, Any], where: str) -> None:
    for key in raw:
        if key not in TOP_LEVEL:
            allowed = ", ".join(TOP_LEVEL)
            raise ConfigError(f"{where}: unknown config key {key!r}; allowed: {allowed}")
    for sec in SECTIONS:
        if sec in raw and not isinstance(raw[sec], dict):
            raise ConfigError(f"{where}: {sec} must be a table, got {raw[sec]!r}")


@dataclass
class RunSpec:
    """One run of an experiment: its label, seed and fully resolved config."""

    label: str
    config: dict[str, Any]
    selectors: tuple[str, ...] = ()
    """What ``--only`` selects the run by besides ``label``: its own label before ``--label`` and, for a point of
    a grid, its variant's label (which selects every point of the variant)."""

    @functools.cached_property
    def typed(self) -> RunConfig:
        """The run's typed config, built (and so validated) once: what the run, its checks and its session use."""
        return typed_config(self.config)

    @property
    def folder_name(self) -> str:
        """``<label>-seed<k>``, with path separators in the label made ``_`` ("FedAF w/o CDC" -> "FedAF w_o CDC")."""
        return run_folder_name(self.label, self.config["seed"])


def resolve(
    raw: dict[str, Any], overrides: dict[str, Any] | None = None, where: str = "config", imports: Sequence[str] = (),
    *, relabelled: bool = False, only: Sequence[str] | None = None,
) -> list[RunSpec]:
    """Expand a parsed config into its runs (variants x grid points x seeds), each validated.

    The steps, each a function below: the file over the defaults, its plug-ins imported (:func:`_file_config`);
    the grid (:func:`~fedskew.config.grid.grid_of`); the variants (:func:`_variants`); the seeds
    (:func:`_seeds`); then for each grid point its config (:func:`_point_config`: variant, overrides, the point's
    values) and label (:func:`_label`), and one validated run per seed (:func:`_seeded`).

    The plug-ins come first: the config's ``plugins`` (or a ``plugins`` override, whose relative paths are
    relative to the current folder), then ``imports`` (``--import``); they are imported before anything is
    checked, and every run's config records them (normalised, see :func:`fedskew.plugins.normalise`).

    The grid (a ``[sweep]`` table, list values on the command line) is decided in one place,
    :mod:`fedskew.config.grid`. ``relabelled``: the caller relabels the runs it keeps (``--label``, after
    ``--only``), so a grid point's own label is not refused for its length (it is what ``--only`` selects by).
    ``only`` (the labels ``--only`` names, selected by the caller afterwards): the runs it does not select are
    returned unvalidated, and a command-line ``algorithm.<param>`` must fit a method among the selected runs, so
    an override meant for one variant is neither refused by another (``--only "FedDC drift"
    algorithm.scaling=shard`` beside FedRS, whose ``scaling`` takes other values) nor dropped unseen.
    """
    _check_top(raw, where)
    overrides = dict(overrides or {})
    base = _file_config(raw, overrides, imports)
    grid = grid_of(raw, overrides, base, where)  # takes the swept keys (and seed=[...]) out of the overrides
    variants = _variants(raw, overrides, where)
    seeds = _seeds(raw, overrides, base["seed"], grid)
    points = grid.expand(variants, base, overrides, len(seeds), where)
    # A command-line algorithm.<param> goes to the variants whose algorithm has that parameter
    # (`algorithm.condense_iterations=20` on a FedAvg-vs-FedDC file); it is an error only if none has it.
    algo_overrides = {k for k in overrides if k.startswith("algorithm.") and k != "algorithm.name"}
    taken: set[str] = set()
    runs: list[RunSpec] = []
    folders: set[str] = set()
    wanted = None if only is None else set(only)
    any_selected = False
    for point in points:
        point_taken: set[str] = set()
        cfg = _point_config(point, base, overrides, algo_overrides if len(points) > 1 else set(), point_taken)
        label, selectors = _label(point, cfg, overrides, grid, where, relabelled)
        folder = folder_label(label)
        if folder in folders:  # equal labels have equal folder names
            raise ConfigError(
                f"{where}: two variants share the label {label!r} or its folder name; give each a distinct label"
            )
        folders.add(folder)
        selected = wanted is None or label in wanted or any(s in wanted for s in selectors)
        if selected:
            taken |= point_taken
            any_selected = True
        runs.extend(_seeded(cfg, label, selectors, seeds, validate=selected, named=len(points) > 1))
    if len(points) > 1 and any_selected and algo_overrides - taken:
        key = sorted(algo_overrides - taken)[0]
        whose = "no variant's algorithm" if wanted is None else "no selected (--only) variant's algorithm"
        raise ConfigError(f"unknown key {key!r}: {whose} has this parameter")
    return runs


def _file_config(raw: dict[str, Any], overrides: dict[str, Any], imports: Sequence[str]) -> dict[str, Any]:
    """Step 1, files and defaults: the config file's tables and top-level keys over :data:`DEFAULTS`, its plug-ins
    (a ``plugins`` override's instead, taken out of ``overrides``; then ``imports``) imported and recorded."""
    plugins = load_plugins([*check_specs(overrides.pop("plugins", raw.get("plugins", []))), *imports])
    base = copy.deepcopy(DEFAULTS)
    for key, value in raw.items():
        if key in SECTIONS:
            base[key] = dict(value)
        elif key not in ("variants", "plugins", "sweep"):
            base[key] = value
    if plugins:
        base["plugins"] = plugins
    return base


def _variants(raw: dict[str, Any], overrides: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Step 2, variants: the file's ``[[variants]]`` (one empty one without), none when the command line names one
    method (after the grid took a list of methods out of ``overrides``); a variant may not set what applies to
    every variant (seeds, plug-ins)."""
    variants = raw.get("variants") or [{}]
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ConfigError(f"{where}: variants must be a list of tables")
    if "algorithm.name" in overrides or "algorithm" in overrides:  # one method named on the command line
        return [{}]
    for index, variant in enumerate(variants):
        for key, top in (("seed", "seeds"), ("seeds", "seeds"), ("plugins", "plugins")):
            if key in variant:
                raise ConfigError(
                    f"{where}: variant {variant.get('label', index)!r} sets {key}; the {top} apply to every "
                    f"variant: set {top} = [...] at the top level"
                )
    return variants


def _point_config(
    point: Any, base: dict[str, Any], overrides: dict[str, Any], algo_overrides: set[str], taken: set[str]
) -> dict[str, Any]:
    """Step 3, one grid point's config: the base, then the variant's keys, the command line's, the point's
    values (last: its label names them); the method first of all, so that its options know their method.

    A table whose object the point renames starts afresh (:data:`GENERIC_KEYS` and the keys set with it kept),
    and a new method keeps the base's hyper-parameters it also has. ``algo_overrides`` (in a grid): command-line
    ``algorithm.<param>`` keys that go only to the methods that have the parameter, noted in ``taken``.
    """
    variant = point.variant
    cfg = copy.deepcopy(base)
    explicit: dict[str, set[str]] = {sec: set() for sec in NAMED}
    for source in (variant, overrides, point.values):
        for key, value in source.items():
            if key != "label" and key.startswith("algorithm.name"):
                set_dotted(cfg, key, value)
    params = _param_names(cfg["algorithm"]["name"])
    for source in (variant, overrides, point.values):
        for key, value in source.items():
            if key in ("label", "seeds"):
                continue
            if source is overrides and key in algo_overrides:
                if params is not None and key.split(".")[1] not in params:
                    continue
                taken.add(key)
            set_dotted(cfg, key, value)
            sec, _, leaf = key.partition(".")
            if sec in explicit and leaf:
                explicit[sec].add(leaf.split(".")[0])
    for sec in ("dataset", "partition", "model"):
        if cfg[sec].get("name") != base[sec].get("name"):
            # Options belong to the object they were written for: a new name starts afresh.
            keep = explicit[sec] | {"name"} | GENERIC_KEYS[sec]
            cfg[sec] = {k: v for k, v in cfg[sec].items() if k in keep}
    if cfg["algorithm"].get("name") != base["algorithm"].get("name"):
        _keep_shared_params(cfg, explicit["algorithm"])
    return cfg


def _label(
    point: Any, cfg: dict[str, Any], overrides: dict[str, Any], grid: Grid, where: str, relabelled: bool
) -> tuple[str, tuple[str, ...]]:
    """Step 4, the point's label (the variant's, the config's or the method's name, then the point's values; a
    ``label`` template of the command line last) and what ``--only`` may select it by."""
    variant = point.variant
    label = check_label(str(variant.get("label") or cfg.get("label") or cfg["algorithm"]["name"]))
    own = f"{label}, {point.text}" if point.text else label
    templated = "label" in overrides
    if point.text and len(own) > MAX_LABEL and not (templated or relabelled):
        raise ConfigError(_long_label(grid, own, where))
    label = check_label(own, longest=None if templated or relabelled else MAX_LABEL)
    if templated:
        label = expand_label(str(overrides["label"]), label, cfg)
    return label, tuple(dict.fromkeys(s for s in (own, point.variant_label) if s))


def _seeded(
    cfg: dict[str, Any], label: str, selectors: tuple[str, ...], seeds: list[int], validate: bool = True,
    named: bool = False,
) -> list[RunSpec]:
    """Step 5, one run per seed, each validated now (its typed form kept for the run) unless ``validate`` is
    false (a run ``--only`` leaves out). ``named`` (one of several variants or grid points): an invalid run's
    error starts with its label and says how to leave it out."""
    runs = []
    for seed in seeds:
        run = copy.deepcopy(cfg)
        run["seed"] = seed
        run["label"] = label
        run.pop("seeds", None)
        spec = RunSpec(label, run, selectors)
        try:
            if validate and len(label) > MAX_LABEL:  # a long point label, to be relabelled: validate the rest now
                typed_config({**run, "label": ""})
            elif validate:
                spec.typed  # noqa: B018 (validates the run now, and keeps the typed form for the run)
        except ConfigError as e:
            if not named:
                raise
            raise ConfigError(f"run {label!r}: {e}; --only LABEL ... runs the others without it") from None
        runs.append(spec)
    return runs


def relabel(runs: list[RunSpec], template: str) -> list[RunSpec]:
    """The runs labelled by ``template`` (:func:`expand_label`: ``{label}`` is each run's own label, ``{KEY}`` a
    config value); labels that collide are refused in one line."""
    out = []
    for spec in runs:
        new = expand_label(template, spec.label, spec.config)
        out.append(RunSpec(new, {**spec.config, "label": new}))
    folders = [spec.folder_name for spec in out]
    if len(set(folders)) != len(folders):
        raise ConfigError(f"--label {template!r} gives two runs the same label or folder; add {{label}} or a "
                          "setting that tells them apart")
    return out


def _long_label(grid: Grid, label: str, where: str) -> str:
    """The line refusing a grid point whose label is too long: the sweep, and how to name the points."""
    example = ", ".join(f"{name}={{{key}}}" for key, name in grid.short_names().items())
    return (
        f"{where}: {grid.describe()}: the label of point {label!r} has {len(label)} characters, more than "
        f"{MAX_LABEL}; name the points with --label TEMPLATE (or the override label=TEMPLATE; Python: label=...), "
        f"e.g. --label '{example}', or give the variants shorter labels"
    )


_FIELD = re.compile(r"\{([^{}]*)\}")
MISSING: Any = dataclasses.MISSING
"""What :func:`config_value` returns for a key the run's config does not have (the sentinel
:func:`~fedskew.config.schema.option_default` returns too)."""


def config_value(cfg: dict[str, Any], key: str) -> Any:
    """The run's value of a dotted config key (``partition.alpha``): the value written in ``cfg``, else,
    for an option of a named table left unset (``algorithm.tau``), that option's default; else
    :data:`MISSING`. Dataclass values come back as dicts."""
    value: Any = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif i == 1 and parts[0] in NAMED and isinstance(value, dict):  # an option left at its default
            value = option_default(parts[0], value.get("name"), part)
            if value is MISSING:
                return MISSING
        else:
            return MISSING
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return value


def expand_label(template: str, label: str, cfg: dict[str, Any]) -> str:
    """A ``label`` override for one variant: ``{label}`` is the variant's own label, ``{key.path}`` the
    run's value of a dotted config key, e.g. ``"{label}, tau={algorithm.tau}"`` (``--label`` on the command line).
    A template without fields is the label of every run."""

    def field(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "label":
            return label
        return str(scalar_value(cfg, key, f"label {template!r}: {{{key}}}"))

    expanded = _FIELD.sub(field, template)
    return check_label(expanded, "label" if expanded == template else f"label {template!r} gives {expanded!r}; a label")


def scalar_value(cfg: dict[str, Any], key: str, what: str) -> Any:
    """The run's value of config key ``key`` (:func:`config_value`), which must be a scalar (a string, number or
    boolean): a label or a report's ``--group-by`` may name such a key, not a table or a list."""
    value = config_value(cfg, key)
    if value is MISSING:
        raise ConfigError(f"{what} is not a key of the run's config; use a dotted key such as algorithm.lr")
    if isinstance(value, dict | list):
        kind = "table" if isinstance(value, dict) else "list"
        raise ConfigError(f"{what} is a {kind}, not a single value; name one of its keys, such as {key}.name")
    return value


def _seeds(raw: dict[str, Any], overrides: dict[str, Any], default: Any, grid: Grid) -> list[int]:
    """The seeds of an experiment: ``seeds`` (command line, else a grid's ``seed`` or ``seeds``, else file), else
    ``seed``; distinct integers.

    ``seed=K`` on the command line runs seed K alone, even when the file has ``seeds`` (the built-in
    default has ``seeds = [0]``): it sets the seeds to ``[K]``. ``seed=[0,1]`` (a grid over the seed) sets them
    to ``[0, 1]``.
    """
    if "seed" in overrides and "seeds" in overrides:
        raise ConfigError("give seed=K or seeds=[...] on the command line, not both")
    what = "seeds"
    if "seeds" in overrides:
        seeds = overrides["seeds"]
    elif "seed" in overrides:
        seeds = [overrides["seed"]]
    elif grid.seeds is not None:
        seeds, what = grid.seeds, f"{grid.seeds_source} (the seeds)"
    else:
        seeds = raw.get("seeds", [default])
    ok = isinstance(seeds, list) and len(seeds) > 0
    ok = ok and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) and len(set(seeds)) == len(seeds)
    if not ok:
        raise ConfigError(f"{what} must be a non-empty list of distinct integers, got {seeds!r}")
    return list(seeds)


def _param_names(name: Any) -> set[str] | None:
    """The hyper-parameter names of algorithm ``name`` (None if it is not registered: validate reports it)."""
    from fedskew.algorithms.base import ALGORITHMS

    if not isinstance(name, str) or name not in ALGORITHMS:
        return None
    return {f.name for f in dataclasses.fields(ALGORITHMS.get(name).Params)}


def _keep_shared_params(cfg: dict[str, Any], explicit: set[str]) -> None:
    """A variant switched algorithm: keep the base's hyper-parameters that the new one also has.

    The base ``[algorithm]`` table usually holds shared settings (lr, batch size, clients per round);
    those the new algorithm does not have are dropped, while keys the variant set itself are kept and
    checked, so a misspelt key still fails.
    """
    from fedskew.algorithms.base import ALGORITHMS

    table = cfg["algorithm"]
    fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(table["name"]).Params)}
    cfg["algorithm"] = {k: v for k, v in table.items() if k == "name" or k in fields or k in explicit}


