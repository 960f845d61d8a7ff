"""The typed configuration of one run, and the one function that validates it.

A resolved config is a plain dict (it is what ``config.toml`` holds and what travels to worker
processes and Flower nodes); :func:`typed_config` turns it into a :class:`RunConfig`, a dataclass tree
whose every leaf is built and checked by :func:`~fedskew.core.params.build_params`: the top-level run
settings (:class:`RunSettings`), the dataset, partitioner, model and algorithm, each a
:class:`Component` holding the typed ``Params`` its registry declares for that name, and the tables of
:mod:`.tables` (faults, Ray, per-client evaluation, logs). :func:`validate` is that check without the
result: every run of an experiment passes it before anything is loaded or trained.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fedskew.config.tables import EvalParams, Faults, LoggingParams, RayParams
from fedskew.core.engines import check_engine
from fedskew.core.errors import ConfigError
from fedskew.core.figures import FigureStyle
from fedskew.core.params import Options, build_params, check, maximums, minimums, option, option_help, resumable_options
from fedskew.plugins import check_specs, load_plugins
from fedskew.privacy.checks import check_privacy
from fedskew.privacy.params import PrivacyParams
from fedskew.runs import check_folder_name, check_label

if TYPE_CHECKING:
    from fedskew.core.device import Compute

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?|mps")
"""What ``device`` may say; whether the device is present is checked before a run starts."""

MAX_ROUNDS = 1_000_000
"""The most rounds a run may have (a bound, so that a typo such as ``rounds=99999999999999999999`` is refused)."""
MAX_WORKERS = 1024
"""The most worker processes a run may ask for."""
MAX_CLIENTS_IN_PARALLEL = 1_000_000
"""The most clients a run may batch at once (a bound against typos; a round's clients are all it uses)."""

NAMED = ("dataset", "partition", "model", "algorithm")
"""Tables that name a registered object (``name = ...``) and hold that object's options."""
GENERIC_KEYS = {
    "dataset": {"data_dir", "train_fraction", "normalize"},
    "partition": {"num_clients", "seed", "client_test_fraction"},
    "model": set(),
}
"""Keys of a table that belong to the table, not to the object it names (kept when the name changes)."""


class RunSettings(Options):
    """The top-level keys of one run. Each field's ``help`` is what ``fedskew run --help`` and
    :data:`TOP_LEVEL` say of it; ``resumable`` fields may change when a run is resumed (:data:`RESUMABLE`)."""

    name: str = option("experiment", help="experiment name; the parent folder of its runs")
    description: str = option("", help="free text shown in the report")
    rounds: int = option(20, help="number of communication rounds", resumable=True)
    seed: int = option(0, help="root seed of a single run")
    workers: int = option(0, resumable=True, help=(
        "worker processes for client jobs and evaluation (0 = auto: workers_per_device per GPU or CPU core, "
        "at most the round's client jobs and what memory holds; not with engine = ray)"))
    workers_per_device: int = option(1, resumable=True, help=(
        "with workers = 0: worker processes per GPU (on a CPU, per core); results do not change"))
    server_threads: int = option(0, resumable=True, help=(
        "intra-op CPU threads of the server's own work in the main process (FedDM's, FedAF's and FedDC's training "
        "on the condensed sets, ...): 0 = PyTorch's default (every core), N = N threads; 1 keeps it from stalling "
        "beside other jobs; results differ between thread counts"))
    eval_every: int = option(1, help=(
        "evaluate the global model (and the clients' own models, see eval) every N rounds and after the last"))
    checkpoint_every: int = option(10, resumable=True, help=(
        "write a checkpoint every N rounds and after the last (0 = only after the last)"))
    target_accuracy: float | None = option(None, help="accuracy (fraction) for rounds-to-target and bytes-to-target")
    at_rounds: list[int] = option(default_factory=list, help="rounds at which to report accuracy in the summary")
    label: str = option("", help="name of the run in tables and plots")
    device: str = option("auto", resumable=True, help=(
        "where tensors live: auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N, mps"))
    amp: Literal["off", "bf16", "fp16"] = option("off", resumable=True, help=(
        "mixed precision of training, evaluation and condensation: off, bf16, fp16 (CUDA)"))
    deterministic: bool = option(False, help="GPU: deterministic kernels (same metrics for any number of GPUs; slower)")
    sgd_impl: Literal["default", "foreach", "fused"] = option("default", resumable=True, help=(  # core.device.SGD_IMPLS
        "local training's SGD: default (torch's choice), foreach, fused (fewer kernel launches a step)"))
    compile: Literal["off", "default", "reduce-overhead"] = option("off", resumable=True, help=(  # COMPILE_MODES
        "torch.compile the model's forward pass in local training: off, default, reduce-overhead (CUDA graphs)"))
    tf32: bool = option(False, resumable=True, help=(
        "CUDA: TF32 float32 matrix products (faster, about 3 fewer significant digits)"))
    engine: str = option("local", help=(  # "local", "ray", or one a plug-in registers (fedskew.core.engines)
        "where client jobs run: local (this machine's workers), ray (a Ray cluster) or a plug-in's engine"))
    plugins: list[str] = option(default_factory=list, help=(
        "modules and .py files (relative to the config file) to import first: they register algorithms, "
        "models, datasets, partitioners"))
    clients_in_parallel: int | str = option(1, resumable=True, help=(  # engine/batched_runner.py
        "clients trained together on one device, batched: 1 (one at a time), N, or auto "
        "(all of a round's on one GPU, else 1; 1 for FedDM, FedAF and FedDC, whose condensation does not batch)"))

    at_least = minimums(rounds=1, seed=0, workers=0, workers_per_device=1, server_threads=0, eval_every=1,
                        checkpoint_every=0)
    at_most = maximums(rounds=MAX_ROUNDS, workers=MAX_WORKERS, workers_per_device=MAX_WORKERS,
                       server_threads=MAX_WORKERS, target_accuracy=1)
    positive = ("target_accuracy",)  # a fraction in (0, 1]; None: no target

    def __post_init__(self) -> None:
        check(DEVICE_PATTERN.fullmatch(self.device) is not None, "device", self.device,
              "one of auto, cpu, cuda, cuda:N, mps")
        check_folder_name("name", self.name)
        if self.label:  # "" leaves the label to the variant or the algorithm's name
            check_label(self.label)
        super().__post_init__()
        check(all(1 <= r <= MAX_ROUNDS for r in self.at_rounds), "at_rounds", self.at_rounds,
              f"a list of rounds in [1, {MAX_ROUNDS:_}]")
        width = self.clients_in_parallel
        check(width == "auto" or (isinstance(width, int) and 1 <= width <= MAX_CLIENTS_IN_PARALLEL),
              "clients_in_parallel", width, f'"auto" or an integer in [1, {MAX_CLIENTS_IN_PARALLEL:_}]')
        batched = width not in (1, "auto")
        check(not batched or self.workers <= 1, "clients_in_parallel", width,
              "1 or \"auto\" with workers >= 2 (batched clients train in one process; set workers = 1)")
        check(not batched or self.engine == "local", "clients_in_parallel", width,
              f"1 or \"auto\" with engine = {self.engine!r} (it batches the local engine's clients)")


@dataclass(frozen=True)
class Component:
    """A named, registered object and its typed options (``[dataset]``, ``[model]`` ...)."""

    name: str
    params: Any


def _table(help: str, *, resumable: bool = False) -> dict[str, Any]:
    """A :class:`RunConfig` table's metadata: what it holds (``help``) and whether a resumed run may change it."""
    return {"help": help, "resumable": resumable}


@dataclass(frozen=True)
class RunConfig:
    """One run's configuration, every leaf typed and checked; ``source`` is the dict it was built from
    (the form ``config.toml`` holds and that travels to workers and nodes)."""

    run: RunSettings
    dataset: Component = field(metadata=_table(
        "table: name = dataset, data_dir, train_fraction, and the dataset's options"))
    partition: Component = field(metadata=_table(
        "table: name = partitioner, num_clients, seed (optional), client_test_fraction, and its parameters"))
    model: Component = field(metadata=_table("table: name = model, and its options"))
    algorithm: Component = field(metadata=_table("table: name = algorithm, and its hyper-parameters"))
    faults: Faults = field(metadata=_table(
        "table: simulated failures: dropout, straggler (probabilities), max_reply_mb"))
    ray: RayParams = field(metadata=_table(
        "table: the Ray engine: address (empty: a local instance), num_cpus, num_gpus per client job"))
    eval: EvalParams = field(metadata=_table(
        "table: per-client evaluation (with partition.client_test_fraction): personalized_epochs, "
        "personalized_lr, personalized_batch_size"))
    logging: LoggingParams = field(metadata=_table(
        "table: extra logs of a run: tensorboard = true writes TensorBoard event files (fedskew[tensorboard])",
        resumable=True))
    privacy: PrivacyParams = field(default_factory=PrivacyParams, metadata=_table(
        "table: differential privacy: mode (off, central, local, sample, condensation), noise_multiplier, clip, "
        "adaptive_clip, delta, target_epsilon, on_target, accountant (docs/privacy.md)"))
    """What the run does to limit what clients reveal (the ``[privacy]`` table; off by default)."""
    report: FigureStyle = field(default_factory=FigureStyle, metadata=_table(
        "table: how the experiment's report looks: format (png, pdf, svg), dpi, width and height (inches), "
        "font_size (points), titles (true/false), preset (single or double column of a paper)", resumable=True))
    """How the experiment's report looks (the ``[report]`` table; it changes no result)."""
    source: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        """The run's label: its own, else the algorithm's name."""
        return self.run.label or self.algorithm.name

    @functools.cached_property
    def compute(self) -> Compute:
        """Where and how the run computes: ``device`` resolved (refused in one line when this machine lacks
        it), the workers' devices, ``amp`` and the launch-cutting switches (``sgd_impl``, ``compile``, ``tf32``)
        checked against the device, ``deterministic``. Resolved once, on first use (before any run of an
        experiment starts), and read by everything after."""
        from fedskew.core.device import resolve_compute

        run = self.run
        return resolve_compute(run.device, run.amp, run.deterministic, run.sgd_impl, run.compile, run.tf32)


SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("run", "source"))
"""The tables of a config (``[dataset]`` ... ``[privacy]``, ``[report]``), from :class:`RunConfig`."""
assert SECTIONS[: len(NAMED)] == NAMED, SECTIONS  # typed_config and full_config rely on the order

FILE_KEYS: dict[str, str] = {
    "seeds": "one run per seed (overrides seed)",
    "variants": "list of tables of dotted overrides, one run each (with a label)",
    "sweep": "table of dotted keys and lists of values: a grid of runs, every variant at every combination",
}
"""Keys of a config file that say which runs it holds; no single run has them."""

TOP_LEVEL: dict[str, str] = {
    **{k: v for name, v in option_help(RunSettings).items()
       for k, v in ((name, v), *((("seeds", FILE_KEYS["seeds"]),) if name == "seed" else ()))},
    **{f.name: f.metadata["help"] for f in dataclasses.fields(RunConfig) if f.name in SECTIONS},
    "variants": FILE_KEYS["variants"],
    "sweep": FILE_KEYS["sweep"],
}
"""Every top-level key of a config file and what it means, generated from :class:`RunSettings`, the tables of
:class:`RunConfig` and :data:`FILE_KEYS` (``fedskew run --help`` prints it)."""

RESUMABLE: tuple[str, ...] = (
    *resumable_options(RunSettings),
    *(f.name for f in dataclasses.fields(RunConfig) if f.metadata.get("resumable")),
    # Single keys of the other tables (privacy.target_epsilon: a budget may be raised to go on).
    *(f"{name}.{key}" for name, kind in typing.get_type_hints(RunConfig).items()
      if name in SECTIONS and isinstance(kind, type) and issubclass(kind, Options)
      and not RunConfig.__dataclass_fields__[name].metadata.get("resumable") for key in resumable_options(kind)),
)
"""What a resumed run may change (the fields declared ``resumable``): its length, where it computes
(checkpoints are device-free) and in which precision (an fp16 GPU run can go on on a CPU with ``amp=off`` or
``bf16``; rounds after the resume are computed in the new one) with which kernels (``sgd_impl``, ``compile``,
``tf32``: a GPU run's switches may be turned off to go on on a CPU; ``clients_in_parallel``: batched or one at a
time), how often it saves, and what it logs besides its own files (``logging``) and how its report looks
(``report``). Any other difference between the config and the checkpoint's is an edit, and refused."""

DEFAULTS: dict[str, Any] = {
    **{f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
       for f in dataclasses.fields(RunSettings) if f.name not in ("label", "plugins")},
    # no [report] and no [privacy]: the records of runs that set neither stay as they were
    **{section: {} for section in SECTIONS if section not in ("report", "privacy")},
    "dataset": {"name": "digits"},
    "partition": {"name": "iid", "num_clients": 10},
    "model": {"name": "cnn"},
    "algorithm": {"name": "fedavg"},
}
"""A config's values where its file says nothing."""


def _registry(section: str) -> Any:
    """The registry of a named table (``dataset``, ``partition``, ``model``, ``algorithm``)."""
    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.data import DATASETS
    from fedskew.data.partition import PARTITIONERS
    from fedskew.models import MODELS

    return {"dataset": DATASETS, "partition": PARTITIONERS, "model": MODELS, "algorithm": ALGORITHMS}[section]


def component(section: str, table: Mapping[str, Any]) -> Component:
    """The typed form of a named table (``dataset``, ``partition``, ``model``, ``algorithm``): its ``name`` and
    its options checked against the Params its registry declares for that name."""
    options = dict(table)
    name = options.pop("name", None)
    check(isinstance(name, str), f"{section}.name", name, "a string")
    return Component(name, _registry(section).build_params(name, options, prefix=f"{section}."))


def option_default(section: str, name: Any, key: str) -> Any:
    """The default of option ``key`` of the ``name`` entry of a named table (``algorithm``, ``fedaf``,
    ``tau`` -> 1.0); :data:`dataclasses.MISSING` when there is no such entry or option, or no default."""
    registry = _registry(section)
    if not isinstance(name, str) or name not in registry or registry.params_of(name) is None:
        return dataclasses.MISSING
    return registry.default(name, key)


def check_evaluable(algorithm: str, client_test_fraction: float) -> None:
    """A method without a global model (``local``) is measured only on the clients' own test splits:
    refuse it without them (``partition.client_test_fraction``)."""
    from fedskew.algorithms.base import ALGORITHMS

    if not ALGORITHMS.get(algorithm).has_global_model and not client_test_fraction:
        raise ConfigError(
            f"algorithm {algorithm!r} has no global model to evaluate: give the clients test splits of their "
            "own with partition.client_test_fraction (a fraction in (0, 0.9], e.g. 0.2)"
        )


def check_clients_per_round(cfg: dict[str, Any], num_clients: int) -> None:
    """Refuse an ``algorithm.clients_per_round`` the config sets above the number of clients (it was silently
    taken as every client); a method's default above it is fine and means every client."""
    wanted = cfg.get("algorithm", {}).get("clients_per_round")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > num_clients:
        raise ConfigError(
            f"algorithm.clients_per_round = {wanted} is more than partition.num_clients = {num_clients}; give at most "
            f"{num_clients} (every client each round)"
        )


def typed_config(cfg: dict[str, Any]) -> RunConfig:
    """The typed form of a resolved config; a ConfigError names the first bad key and what is allowed.

    The config's ``plugins`` are imported first (:func:`~fedskew.plugins.load_plugins`), so that the
    names they register are known.
    """
    load_plugins(check_specs(cfg.get("plugins", []), "plugins"))
    for section in SECTIONS:
        if not isinstance(cfg.get(section, {}), dict):
            raise ConfigError(f"{section} must be a table, got {cfg[section]!r}")
    top = {k: v for k, v in cfg.items() if k not in SECTIONS}
    run = build_params(RunSettings, top)
    check_engine(run.engine)  # the engines the plug-ins register are known by now
    parts = {section: component(section, cfg[section]) for section in NAMED}
    faults = build_params(Faults, cfg.get("faults", {}), prefix="faults.")
    ray = build_params(RayParams, cfg.get("ray", {}), prefix="ray.")
    evaluation = build_params(EvalParams, cfg.get("eval", {}), prefix="eval.")
    check_evaluable(parts["algorithm"].name, parts["partition"].params.client_test_fraction)
    check_clients_per_round(cfg, parts["partition"].params.num_clients)
    logs = build_params(LoggingParams, cfg.get("logging", {}), prefix="logging.")
    privacy = build_params(PrivacyParams, cfg.get("privacy", {}), prefix="privacy.")
    if privacy.mode == "condensation":  # the table rides on the method's params (algorithms/condensation/private.py)
        from fedskew.algorithms.condensation.private import with_private_condensation

        parts["algorithm"] = with_private_condensation(parts["algorithm"], privacy)
    else:
        method = parts["algorithm"]
        check_privacy(privacy, method.name, _registry("algorithm").get(method.name).upload, method.params,
                      parts["partition"].params.num_clients)
    look = build_params(FigureStyle, cfg.get("report", {}), prefix="report.") if cfg.get("report") else FigureStyle()
    return RunConfig(run=run, faults=faults, ray=ray, eval=evaluation, logging=logs, privacy=privacy, report=look,
                     source=cfg, **parts)


def full_config(cfg: dict[str, Any] | RunConfig) -> dict[str, Any]:
    """``cfg`` with every default filled in: what a run records as its ``config.toml``, so that the record says
    every value the run used (``lr``, ``mu`` ...) even after a default changes. Validated as :func:`validate`.

    Comparisons of recorded configs (``--resume``) compare full configs, so a record written before defaults
    were filled in still equals its full form.
    """
    typed = cfg if isinstance(cfg, RunConfig) else typed_config(cfg)
    out: dict[str, Any] = {**dataclasses.asdict(typed.run)}
    for section in NAMED:
        part: Component = getattr(typed, section)
        typed_params = part.params
        is_instance = dataclasses.is_dataclass(typed_params) and not isinstance(typed_params, type)
        params = dataclasses.asdict(typed_params) if is_instance else {}
        out[section] = {"name": part.name, **params}
    for section in SECTIONS[len(NAMED):-2]:  # all but privacy and report, below
        out[section] = dataclasses.asdict(getattr(typed, section))
    # Privacy: its table where a mechanism is on; none where it is off, so that non-private records stay as they
    # were.
    if typed.privacy.on:
        out["privacy"] = dataclasses.asdict(typed.privacy)
    for key, value in typed.source.items():  # anything the typed tree does not hold stays as written
        out.setdefault(key, value)
    # The report's look: the settings that differ from the default (None, a size left to each figure, has no
    # TOML); none, no table, so that the records of runs that set none are as they were.
    out["report"] = typed.report.as_table()
    if not out["report"]:
        out.pop("report")
    if not out.get("plugins"):
        out.pop("plugins", None)  # no code to import: no key (a record names plug-ins only where there are some)
    return _plain(out)


def comparable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """:func:`full_config` of ``cfg`` for comparing recorded configs; ``cfg`` as it is when it does not validate
    (it then differs from any valid config, and the caller says which keys)."""
    try:
        return full_config(cfg)
    except ConfigError:
        return cfg


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (the form TOML gives back)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def validate(cfg: dict[str, Any]) -> None:
    """Check every value of a resolved config that can be checked without loading data."""
    typed_config(cfg)
