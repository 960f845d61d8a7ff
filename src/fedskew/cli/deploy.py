"""``fedskew deploy``: run on Flower, as a Flower App folder (``init``) or per-client shard files (``shards``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from fedskew.cli.common import CONFIG_HELP, DATA_HELP, OVERRIDES_HELP, add_import, config_and_overrides, data_dir
from fedskew.core.errors import ConfigError
from fedskew.core.params import option_help
from fedskew.engine.flower.settings import DeploySettings  # needs no Flower

NAME = "deploy"
TRAILING = "overrides"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    de = subparsers.add_parser(NAME, help="run on Flower: write a Flower App folder, or per-client shard files")
    de.add_argument("action", choices=["init", "shards"], help="init: app folder for `flwr run`; shards: data files")
    de.add_argument("folder", help="the app folder (init) or the shard folder (shards)")
    de.add_argument("config", nargs="?", help=f"{CONFIG_HELP} (default: default)")
    de.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    de.add_argument("--data-dir", help=DATA_HELP)
    de.add_argument("--label", default="", help="init: the variant to run when the config has several")
    de.add_argument("--force", action="store_true", help="overwrite an existing app folder")
    helps = option_help(DeploySettings)
    de.add_argument("--secagg", action="store_true",
                    help="init: " + helps["secagg"] + "; methods whose server needs more are refused")
    for key, kind in SECAGG_OPTIONS.items():
        de.add_argument(f"--{key.replace('_', '-')}", type=kind, metavar="N" if kind is int else "X",
                        help=f"init, with --secagg: {helps[key].removeprefix('SecAgg+: ')} (default "
                             f"{getattr(DeploySettings, key)})")
    add_import(de)
    de.set_defaults(func=cmd_deploy)


SECAGG_OPTIONS: dict[str, type] = {
    "secagg_num_shares": int, "secagg_reconstruction_threshold": float, "secagg_clipping_range": float,
    "secagg_quantization_range": int,
}
"""The parameters of secure aggregation ``deploy init`` takes as options (run settings of the app)."""


def secagg_settings(args: argparse.Namespace) -> dict[str, object]:
    """The run settings ``--secagg`` and its parameters give (checked with the others by ``write_app``)."""
    given = {key: getattr(args, key) for key in SECAGG_OPTIONS if getattr(args, key, None) is not None}
    if given and not args.secagg:
        raise ConfigError(f"--{next(iter(given)).replace('_', '-')} is a parameter of secure aggregation: add --secagg")
    return {"secagg": True, **given} if args.secagg else {}


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.engine.flower.app import superlink_command, write_app, write_shards

    config, overrides = config_and_overrides(args.config, args.overrides)  # `fedskew deploy init app rounds=5`
    if args.action == "init":
        secure = secagg_settings(args)
        folder = write_app(
            Path(args.folder), config, overrides, label=args.label, force=args.force, imports=args.imports,
            settings=secure,
        )
        spec = resolve(read_config(config), parse_overrides(overrides), where=str(config or "default"),
                       imports=args.imports)[0]
        nodes = spec.typed.partition.params.num_clients
        bin_dir = Path(sys.executable).parent
        flwr = bin_dir / "flwr"
        path = "" if os.environ.get("VIRTUAL_ENV") else f'PATH="{bin_dir}:$PATH" '  # flwr starts flower-superlink
        install = "" if flwr.exists() else " (Flower is not installed: pip install -e '.[flower]' in fedskew's clone)"
        if secure:
            print("secure aggregation: on (SecAgg+; the run settings secagg_* in pyproject.toml, docs/deploy.md)")
        print(f"Flower App: {folder}\n"
              f"run it on Flower's local simulation ({nodes} simulated SuperNodes, one per partition){install}:\n"
              f"  {path}{flwr if flwr.exists() else 'flwr'} run {shlex.quote(str(folder))} --stream "
              f"--federation-config 'num-supernodes={nodes}'\n"
              f"or in production: start the SuperLink (bound to this machine; others reach it through an SSH "
              f"tunnel, see docs/deploy.md):\n  {superlink_command()}\n"
              f"then: flwr run {shlex.quote(str(folder))} <superlink-connection>")
        return 0
    cfg = resolve(
        read_config(config), parse_overrides(overrides), where=str(config or "default"), imports=args.imports
    )[0].config
    paths = write_shards(cfg, Path(args.folder), data_dir(args))
    print(f"{len(paths)} shard files in {args.folder}: give client-<k>.pt to the site of partition k")
    return 0
