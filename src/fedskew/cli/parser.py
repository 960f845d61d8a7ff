"""The ``fedskew`` parser: the top level here, each command's arguments in its own module.

A command module (:data:`COMMANDS`) has ``NAME``, ``add_parser(subparsers)`` (its subparser, whose default
``func`` is its ``cmd_*``), ``TRAILING`` (the list positional that words met after an option join, or None)
and, where it needs one, ``check_args(args, parser)`` (a last look at the parsed words).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType

from fedskew.cli import audit, condense, deploy, listing, partition, report, run

COMMANDS: dict[str, ModuleType] = {m.NAME: m for m in (run, partition, report, deploy, audit, condense, listing)}
"""The commands, in the order ``fedskew --help`` lists them."""

KEY_VALUE_LISTS = ("overrides", "items")
"""Trailing lists that take only ``KEY=VALUE`` words after an option (a second config file is an error)."""

EPILOG = """examples:
  fedskew run                                   the default experiment (digits, FedAvg vs centralised)
  fedskew run experiments/fmnist_fedavg.toml rounds=5 partition.alpha=0.5
  fedskew run --resume runs/default/FedAvg-seed0 rounds=50
  fedskew run experiments/fmnist_fedavg.toml --out runs/f --resume   finish an interrupted experiment
  fedskew partition experiments/fmnist_fedavg.toml
  fedskew report runs/default
  fedskew report runs/default --format pdf --preset single --no-titles   figures for one column of a paper
  fedskew audit runs/feddc_cifar10                 privacy of the condensed images FedDC clients sent
  fedskew condense --dataset fashion_mnist --method dm --ipc 10 --iterations 200   condense and score a set
  fedskew condense my_set.toml ipc=10 model.net_width=32   the same from a settings file and overrides
  fedskew list
  fedskew deploy init my-app experiments/fmnist_fedavg.toml rounds=50   a Flower App for `flwr run`
  fedskew run my.toml --import my_algorithm.py   a config naming an algorithm that my_algorithm.py registers
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedskew",
        description="Federated learning on skewed (non-IID) client data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"fedskew {__import__('fedskew').__version__}")
    subparsers = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line, taking ``key=value`` overrides (and a command's other trailing words) anywhere
    among the options: ``fedskew run exp.toml --import x.py rounds=1``, ``fedskew deploy init app exp.toml
    --label X rounds=2``.

    argparse fills a list positional from one run of words only, so words after an option come back
    unrecognised; they are appended, in order, to the command's list (its module's ``TRAILING``). Lists of
    overrides (:data:`KEY_VALUE_LISTS`) take only ``key=value`` words there (a second config file is an error),
    and anything starting with ``-`` stays an unrecognised option. Then the command's ``check_args`` has its
    say (``run``: ``--only LABEL ...`` gives up the ``KEY=VALUE`` words whose KEY is a config key, which are
    overrides wherever they stand).
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = COMMANDS[args.command]
    dest = command.TRAILING
    unknown = [w for w in extra if w.startswith("-") or dest is None
               or (dest in KEY_VALUE_LISTS and "=" not in w)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        setattr(args, dest, [*(getattr(args, dest) or []), *extra])
    check = getattr(command, "check_args", None)
    if check is not None:
        check(args, parser)
    return args
