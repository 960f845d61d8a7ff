"""Experiment configuration: TOML files, dotted command-line overrides, variants and seeds.

A config file names the dataset, partition, model and algorithm as tables, each with a ``name`` and
that object's own options::

    name = "default"
    rounds = 30
    seeds = [0]

    [dataset]
    name = "digits"

    [partition]
    name = "dirichlet"
    num_clients = 10
    alpha = 0.1

    [model]
    name = "cnn"

    [algorithm]
    name = "fedavg"
    clients_per_round = 10

    [[variants]]            # optional: one run per variant (x seed), under one parent folder
    label = "FedAvg"

    [[variants]]
    label = "Centralised"
    "algorithm.name" = "centralized"

Overrides given on the command line (``rounds=5 partition.alpha=0.5``) are applied to every variant
after the variant's own keys. An override of ``algorithm.name`` replaces the variants by one run of
that algorithm. When a variant or override changes the ``name`` of the dataset, partition or model, that
table starts afresh (keeping only ``data_dir``, or ``num_clients`` and ``seed``, and the keys set with
it); when it changes the algorithm, the base's hyper-parameters that the new algorithm also has are kept.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from fedskew.core.errors import ConfigError
from fedskew.runs import folder_label, run_folder_name

TOP_LEVEL: dict[str, str] = {
    "name": "experiment name; the parent folder of its runs",
    "description": "free text shown in the report",
    "rounds": "number of communication rounds",
    "seed": "root seed of a single run",
    "seeds": "one run per seed (overrides seed)",
    "workers": "worker processes for client work and evaluation (0 = auto: one per core, at most 2)",
    "eval_every": "evaluate the global model every N rounds (and after the last)",
    "checkpoint_every": "write a checkpoint every N rounds (0 = only at the end)",
    "target_accuracy": "accuracy (fraction) for rounds-to-target and bytes-to-target",
    "at_rounds": "rounds at which to report accuracy in the summary",
    "label": "name of the run in tables and plots",
    "dataset": "table: name = dataset, data_dir, train_fraction, and the dataset's options",
    "partition": "table: name = partitioner, num_clients, seed (optional), and its parameters",
    "model": "table: name = model, and its options",
    "algorithm": "table: name = algorithm, and its hyper-parameters",
    "faults": "table: simulated failures: dropout, straggler (probabilities), max_reply_mb",
    "variants": "list of tables of dotted overrides, one run each (with a label)",
}
NAMED = ("dataset", "partition", "model", "algorithm")
GENERIC_KEYS = {"dataset": {"data_dir", "train_fraction"}, "partition": {"num_clients", "seed"}, "model": set()}
SECTIONS = (*NAMED, "faults")

DEFAULTS: dict[str, Any] = {
    "name": "experiment",
    "description": "",
    "rounds": 20,
    "seed": 0,
    "workers": 0,
    "eval_every": 1,
    "checkpoint_every": 10,
    "target_accuracy": None,
    "at_rounds": [],
    "dataset": {"name": "digits"},
    "partition": {"name": "iid", "num_clients": 10},
    "model": {"name": "cnn"},
    "algorithm": {"name": "fedavg"},
    "faults": {},
}


def builtin_configs() -> list[str]:
    """Names of the configs shipped inside the package (``fedskew run default``)."""
    return sorted(p.name[:-5] for p in resources.files("fedskew.configs").iterdir() if p.name.endswith(".toml"))


def read_config(source: str | Path | None) -> dict[str, Any]:
    """Parse a config file, or a built-in config by name (None: ``default``)."""
    if source is None:
        source = "default"
    path = Path(source)
    if not path.exists() and str(source) in builtin_configs():
        text = resources.files("fedskew.configs").joinpath(f"{source}.toml").read_text()
        where = f"built-in config {source!r}"
    elif path.is_file():
        text = path.read_text()
        where = str(path)
    else:
        raise ConfigError(
            f"config {str(source)!r} not found: give a TOML file or one of the built-in configs "
            f"({', '.join(builtin_configs())})"
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: invalid TOML: {e}") from None


def parse_value(text: str) -> Any:
    """A command-line value as TOML (``0.1``, ``true``, ``[1, 2]``, ``"x"``); bare words stay strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "rounds=5"]`` -> ``{"a.b": 1, "rounds": 5}``; a malformed item is a ConfigError."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value (for example rounds=5)")
        out[key.strip()] = parse_value(value.strip())
    return out


def set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    """Set ``cfg["a"]["b"] = value`` for ``key = "a.b"``, checking the top-level key is known."""
    parts = key.split(".")
    top = parts[0]
    if top not in TOP_LEVEL or top == "variants":
        allowed = ", ".join(k for k in TOP_LEVEL if k != "variants")
        raise ConfigError(f"unknown config key {key!r}; allowed top-level keys: {allowed}")
    if top in SECTIONS:
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a table; set its entries, for example {key}.name=...")
            cfg[top] = dict(value)
            return
        if len(parts) == 3 and top == "algorithm":  # a nested table of the algorithm (algorithm.server.lr)
            table = cfg.setdefault(top, {}).setdefault(parts[1], {})
            if not isinstance(table, dict):
                raise ConfigError(f"config key {key!r}: algorithm.{parts[1]} is not a table")
            table[parts[2]] = value
            return
        if len(parts) != 2:
            deepest = f"{top}.<option>" + (" or algorithm.<table>.<option>" if top == "algorithm" else "")
            raise ConfigError(f"config key {key!r} is nested too deeply; use {deepest}")
        cfg.setdefault(top, {})[parts[1]] = value
    else:
        if len(parts) != 1:
            raise ConfigError(f"config key {key!r}: {top!r} is not a table")
        cfg[top] = value


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

    @property
    def folder_name(self) -> str:
        """``<label>-seed<k>``, with path separators in the label made ``_`` ("FedAF w/o CDC" -> "FedAF w_o CDC")."""
        return run_folder_name(self.label, self.config["seed"])


def resolve(raw: dict[str, Any], overrides: dict[str, Any] | None = None, where: str = "config") -> list[RunSpec]:
    """Expand a parsed config into its runs (variants x seeds), each validated."""
    _check_top(raw, where)
    overrides = overrides or {}
    base = copy.deepcopy(DEFAULTS)
    for key, value in raw.items():
        if key in SECTIONS:
            base[key] = dict(value)
        elif key != "variants":
            base[key] = value
    variants = raw.get("variants") or [{}]
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ConfigError(f"{where}: variants must be a list of tables")
    if "algorithm.name" in overrides or "algorithm" in overrides:
        variants = [{}]
    seeds = overrides.get("seeds", raw.get("seeds")) or [overrides.get("seed", base["seed"])]
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"seeds must be a list of integers, got {seeds!r}")
    runs: list[RunSpec] = []
    folders: set[str] = set()
    # A command-line algorithm.<param> goes to the variants whose algorithm has that parameter
    # (`algorithm.condense_iterations=20` on a FedAvg-vs-FedDC file); it is an error only if none has it.
    algo_overrides = {k for k in overrides if k.startswith("algorithm.") and k != "algorithm.name"}
    taken: set[str] = set()
    for variant in variants:
        cfg = copy.deepcopy(base)
        explicit: dict[str, set[str]] = {sec: set() for sec in NAMED}
        for key, value in variant.items():
            if key != "label" and key.startswith("algorithm.name"):
                set_dotted(cfg, key, value)
        if "algorithm.name" in overrides:
            set_dotted(cfg, "algorithm.name", overrides["algorithm.name"])
        params = _param_names(cfg["algorithm"]["name"])
        for source in (variant, overrides):
            for key, value in source.items():
                if key in ("label", "seeds"):
                    continue
                if source is overrides and key in algo_overrides and len(variants) > 1:
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
        label = str(overrides.get("label") or variant.get("label") or cfg.get("label") or cfg["algorithm"]["name"])
        folder = folder_label(label)
        if folder in folders:  # equal labels have equal folder names
            raise ConfigError(
                f"{where}: two variants share the label {label!r} or its folder name; give each a distinct label"
            )
        folders.add(folder)
        for seed in seeds:
            run = copy.deepcopy(cfg)
            run["seed"] = seed
            run["label"] = label
            run.pop("seeds", None)
            validate(run)
            runs.append(RunSpec(label, run))
    if len(variants) > 1 and algo_overrides - taken:
        key = sorted(algo_overrides - taken)[0]
        raise ConfigError(f"unknown key {key!r}: no variant's algorithm has this parameter")
    return runs


def _param_names(name: Any) -> set[str] | None:
    """The hyper-parameter names of algorithm ``name`` (None if it is not registered: validate reports it)."""
    import dataclasses

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
    import dataclasses

    from fedskew.algorithms.base import ALGORITHMS

    table = cfg["algorithm"]
    fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(table["name"]).Params)}
    cfg["algorithm"] = {k: v for k, v in table.items() if k == "name" or k in fields or k in explicit}


def _need(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate(cfg: dict[str, Any]) -> None:
    """Check every value that can be checked without loading data; errors name key and allowed values."""
    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.core.params import build_params
    from fedskew.data import DATASETS
    from fedskew.data.partition import PARTITIONERS
    from fedskew.models import MODELS

    _need(_is_int(cfg["rounds"]) and cfg["rounds"] >= 1, "rounds", cfg["rounds"], "an integer >= 1")
    _need(_is_int(cfg["seed"]) and cfg["seed"] >= 0, "seed", cfg["seed"], "an integer >= 0")
    _need(_is_int(cfg["workers"]) and cfg["workers"] >= 0, "workers", cfg["workers"], "an integer >= 0 (0 = auto)")
    _need(_is_int(cfg["eval_every"]) and cfg["eval_every"] >= 1, "eval_every", cfg["eval_every"], "an integer >= 1")
    _need(
        _is_int(cfg["checkpoint_every"]) and cfg["checkpoint_every"] >= 0,
        "checkpoint_every", cfg["checkpoint_every"], "an integer >= 0",
    )
    t = cfg.get("target_accuracy")
    _need(
        t is None or (isinstance(t, int | float) and not isinstance(t, bool) and 0 < t <= 1),
        "target_accuracy", t, "a fraction in (0, 1]",
    )
    _need(
        isinstance(cfg["at_rounds"], list) and all(_is_int(r) and r >= 1 for r in cfg["at_rounds"]),
        "at_rounds", cfg["at_rounds"], "a list of rounds >= 1",
    )
    for sec in NAMED:
        name = cfg[sec].get("name")
        _need(isinstance(name, str), f"{sec}.name", name, "a string")
    DATASETS.get(cfg["dataset"]["name"])
    frac = cfg["dataset"].get("train_fraction", 1.0)
    _need(
        isinstance(frac, int | float) and not isinstance(frac, bool) and 0 < frac <= 1,
        "dataset.train_fraction", frac, "a number in (0, 1]",
    )
    PARTITIONERS.get(cfg["partition"]["name"])
    MODELS.get(cfg["model"]["name"])
    nc = cfg["partition"].get("num_clients")
    _need(_is_int(nc) and nc >= 1, "partition.num_clients", nc, "an integer >= 1")
    algo = dict(cfg["algorithm"])
    cls = ALGORITHMS.get(algo.pop("name"))
    build_params(cls.Params, algo, prefix="algorithm.")
    from fedskew.engine.faults import Faults

    build_params(Faults, cfg.get("faults", {}), prefix="faults.")


def dump(cfg: dict[str, Any]) -> str:
    """TOML text of a resolved config (None values dropped: TOML has no null)."""

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return tomli_w.dumps(clean(cfg))
