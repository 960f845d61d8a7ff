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
that algorithm. A list where a key takes one value (``'partition.alpha=[0.1,0.5]'``), or a ``[sweep]`` table,
is a grid: every variant at every point, as :mod:`.grid` decides (a list of methods sweeps the variants that
run the config's own method). When a variant or override changes the ``name`` of the dataset, partition or model, that
table starts afresh (keeping only ``data_dir``, or ``num_clients`` and ``seed``, and the keys set with
it); when it changes the algorithm, the base's hyper-parameters that the new algorithm also has are kept.

The package: :mod:`.files` reads and writes config files and parses overrides, :mod:`.variants`
expands a config into its runs, :mod:`.grid` decides what a grid of runs is, :mod:`.schema` is the typed
configuration and its validation.
"""

from fedskew.config.files import TOP_LEVEL, builtin_configs, dump, parse_overrides, parse_value, read_config, set_dotted
from fedskew.config.schema import (
    DEFAULTS,
    NAMED,
    SECTIONS,
    Component,
    Faults,
    LoggingParams,
    RayParams,
    RunConfig,
    RunSettings,
    typed_config,
    validate,
)
from fedskew.config.variants import RunSpec, resolve
from fedskew.runs import folder_label, run_folder_name

__all__ = [
    "DEFAULTS", "NAMED", "SECTIONS", "TOP_LEVEL", "Component", "Faults", "LoggingParams", "RayParams", "RunConfig",
    "RunSettings", "RunSpec",
    "builtin_configs", "dump", "folder_label", "parse_overrides", "parse_value", "read_config", "resolve",
    "run_folder_name", "set_dotted", "typed_config", "validate",
]
