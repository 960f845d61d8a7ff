"""``fedskew audit``: privacy checks on what a run's clients sent; the table joins the report.

Runs that sent synthetic images are scored on the images themselves. With ``--attack dlg|idlg``, runs that
sent model updates (and TOML configs, which need not have run: the attack needs only the round-1 model and
the client data) are scored through a gradient-inversion attack on a client's first update
(:mod:`fedskew.attack`), its settings the ``--attack-*``, ``--dp-mode``, ``--noise-multiplier`` and
``--clip`` flags (one :class:`~fedskew.attack.AttackSettings`; a bad value is one line naming the flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import typing
from pathlib import Path
from typing import Any

from fedskew.cli.common import DATA_HELP, add_import, data_dir, experiment_report, is_override
from fedskew.core.errors import ConfigError

if typing.TYPE_CHECKING:
    from fedskew.attack import AttackSettings
    from fedskew.audit import AuditResult

NAME = "audit"
TRAILING = "runs"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""

FLAGS = {"method": "--attack", "dp_mode": "--dp-mode", "noise_multipliers": "--noise-multiplier", "clip": "--clip"}
"""The flags of the attack's settings that are not ``--attack-<setting>``."""

ATTACK_HELP: dict[str, str] = {
    "method": "score runs that sent model updates (and configs) by a gradient-inversion attack: dlg or idlg",
    "iterations": "optimiser steps per attacked batch [300]",
    "optimizer": "lbfgs (the papers') or adam [lbfgs]",
    "lr": "step size of the attack [lbfgs 1, adam 0.1]",
    "batch_size": "images per attacked gradient [1]",
    "batches": "batches attacked one after another [1]",
    "client": "the attacked client [0]",
    "target": "gradient (one batch's, on the round-1 model) or update (after --attack-local-steps SGD steps) "
              "[gradient]",
    "local_steps": "local SGD steps of an attacked update [1]",
    "local_lr": "their learning rate [the method's lr]",
    "activation": "run (the model as trained) or sigmoid (its ReLUs swapped for sigmoids, as DLG does) [run]",
    "dp_mode": "privacy of the DP rows: config (the [privacy] table), off, central, local, sample [config]",
    "noise_multipliers": "noise multipliers, one DP row each [privacy.noise_multiplier]",
    "clip": "clipping norm of the DP rows [privacy.clip]",
}

METAVARS = {"method": "{dlg,idlg}", "optimizer": "{lbfgs,adam}", "lr": "LR", "local_lr": "LR", "client": "K",
            "target": "{gradient,update}", "activation": "{run,sigmoid}", "dp_mode": "MODE", "noise_multipliers": "Z",
            "clip": "C"}
"""What each flag's value is called in ``--help`` (``N`` for the counts)."""


def flag(name: str) -> str:
    """The command-line flag of an attack setting: ``iterations`` -> ``--attack-iterations``."""
    return FLAGS.get(name) or "--attack-" + name.replace("_", "-")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    au = subparsers.add_parser(
        NAME, help="privacy checks on what a run's clients sent (synthetic images; with --attack, model updates); "
                   "adds the table to the report"
    )
    au.add_argument("runs", nargs="+", metavar="RUN_OR_CONFIG",
                    help="run folders or their parents; with --attack also TOML configs or built-in config names, "
                         "and KEY=VALUE overrides for them")
    au.add_argument("--data-dir", help=DATA_HELP)
    au.add_argument("--max-images", type=int, default=2000, help="images sampled per run (default 2000)")
    au.add_argument("--epochs", type=int, default=50, help="epochs of the attacked model (default 50)")
    attack = au.add_argument_group("gradient-inversion attack (docs/privacy_attack.md)")
    for name, text in ATTACK_HELP.items():
        attack.add_argument(flag(name), dest=f"attack_{name}", nargs="+" if name == "noise_multipliers" else None,
                            metavar=METAVARS.get(name, "N"), help=text)
    au.add_argument("--out", help="where the attack on a config writes its results (default runs/audit)")
    au.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_import(au)
    au.set_defaults(func=cmd_audit)


def _value(word: str, name: str) -> Any:
    from fedskew.config.files import parse_value

    return word if name in ("method", "optimizer", "target", "activation", "dp_mode") else parse_value(word)


def attack_settings(args: argparse.Namespace) -> AttackSettings | None:
    """The attack's settings from the flags given (None without ``--attack``); a flag without ``--attack``,
    or a bad value, is one line naming the flag."""
    from fedskew.attack import AttackSettings
    from fedskew.core.params import build_params

    given: dict[str, Any] = {name: getattr(args, f"attack_{name}") for name in ATTACK_HELP
                             if getattr(args, f"attack_{name}", None) is not None}
    if not given:
        return None
    if "method" not in given:
        raise ConfigError(f"{flag(next(iter(given)))} needs --attack dlg or --attack idlg")
    table = {name: [_value(w, name) for w in word] if isinstance(word, list) else _value(word, name)
             for name, word in given.items()}
    try:
        return build_params(AttackSettings, table)
    except ConfigError as e:  # its messages start with the setting's name: say it as it was given
        name, _, rest = str(e).partition(" ")
        name = name.split("[")[0]
        names = [f.name for f in dataclasses.fields(AttackSettings)]
        raise ConfigError(f"{flag(name)} {rest}" if name in names else str(e)) from None


def _split(words: list[str], attacking: bool) -> tuple[list[Path], list[Path], list[str]]:
    """(run folders, configs: TOML files or built-in names, overrides) among the words."""
    from fedskew.config import builtin_configs

    overrides = [w for w in words if is_override(w)]
    paths = [Path(w) for w in words if not is_override(w)]
    builtin = set(builtin_configs())
    configs = [p for p in paths if p.is_file() or (not p.exists() and str(p) in builtin)]
    if (configs or overrides) and not attacking:
        what = configs[0] if configs else overrides[0]
        raise ConfigError(f"{what}: a config (or an override) is audited only by an attack: add --attack dlg or "
                          "--attack idlg (runs are audited from their folders)")
    if overrides and not configs:
        raise ConfigError(f"{overrides[0]}: overrides apply to a TOML config, and none was given")
    return [p for p in paths if p not in configs], configs, overrides


def _attack_configs(configs: list[Path], overrides: list[str], settings: AttackSettings, args: argparse.Namespace,
                    progress: bool) -> list[AuditResult]:
    """Attack each run of each config; each run's results and grid go to ``--out``/<run folder name>."""
    import json

    from fedskew.attack import attack_config
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.runs import AUDIT_FILE

    out = Path(args.out or "runs/audit")
    results = []
    for path in configs:
        for spec in resolve(read_config(path), parse_overrides(overrides), where=str(path), imports=args.imports):
            folder = out / spec.folder_name
            folder.mkdir(parents=True, exist_ok=True)
            rows = attack_config(spec.typed, settings, folder, data_dir(args), progress)
            (folder / AUDIT_FILE).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n")
            print(f"attack: {folder / AUDIT_FILE}, grid {folder / rows[0].attack['grid']}"  # type: ignore[index]
                  , file=sys.stderr)
            results.extend(rows)
    return results


def cmd_audit(args: argparse.Namespace) -> int:
    from fedskew.audit import AUDIT_LEGEND, audit, format_audit

    settings = attack_settings(args)
    progress = not args.no_progress
    folders, configs, overrides = _split(args.runs, settings is not None)
    results = []
    if settings is not None:
        results += _attack_configs(configs, overrides, settings, args, progress)
    if folders:
        attacker = None
        if settings is not None:
            from fedskew.attack import attack_run

            attacker = functools.partial(attack_run, settings=settings, data_dir=data_dir(args), progress=progress)
        results += audit(folders, data_dir(args), args.max_images, args.epochs, progress=progress, attacker=attacker)
    print(format_audit(results))
    print("\n" + AUDIT_LEGEND)
    if folders:
        from fedskew.report import write_report

        # The report of these runs' experiment (the one `fedskew run` wrote) now shows the audit table beside the
        # results (audit.json in each run).
        runs, folder = experiment_report(folders)
        print(f"report: {write_report(runs, folder)}")
    return 0
