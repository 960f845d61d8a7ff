"""The ``fedskew`` commands: each takes the parsed arguments and returns the exit code.

Heavy modules (torch, the engine, the report) are imported inside the commands, so that ``fedskew
--help`` and a mistyped command answer at once.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from fedskew.core.errors import FedskewError
from fedskew.runs import CONFIG_FILE


def _data_dir(args: argparse.Namespace) -> str | None:
    return args.data_dir or os.environ.get("FEDSKEW_DATA") or None


def _print_table(paths: list[Path], group_by: list[str] | None = None, label: str = "") -> None:
    """Print the comparison table of the runs under ``paths`` (after a line naming the keys they differ in, when
    they come from different experiments)."""
    from fedskew.report import (
        comparison_table,
        find_runs,
        format_table,
        in_config_order,
        load_run,
        separate_experiments,
    )
    from fedskew.report.tables import TERMINAL_WIDTH, differing_line

    runs = separate_experiments(in_config_order([load_run(p) for p in find_runs(paths)]), group_by or (), label)
    mixed = differing_line(runs)
    if mixed:
        print(f"fedskew: {mixed}", file=sys.stderr)
    print(format_table(comparison_table(runs), max_width=TERMINAL_WIDTH))


def _experiment_report(run_dirs: list[Path]) -> tuple[list[Path], Path | None]:
    """The runs and report folder of the experiment that ``run_dirs`` belong to: every run of their experiment
    folder and its ``report/`` (the report ``fedskew run`` wrote, which ``audit`` and ``--resume`` update),
    or ``run_dirs`` and None (the default folder) when they are not the runs of one folder."""
    from fedskew.runs import experiment_of, experiment_runs, find_runs

    runs = find_runs(run_dirs)
    home = experiment_of(runs)
    if home is not None and {p.resolve() for p in runs} <= set(experiment_runs(home)):
        return experiment_runs(home), home / "report"
    return runs, None


def cmd_run(args: argparse.Namespace) -> int:
    from fedskew.api import plan
    from fedskew.config import parse_overrides
    from fedskew.engine.experiment import resume_run, run_experiment

    overrides = parse_overrides(args.overrides)
    progress = not args.no_progress
    source = args.config
    if source is not None and "=" in source and not Path(source).exists():
        overrides = parse_overrides([source, *args.overrides])  # `fedskew run rounds=5`, `--resume DIR rounds=20`
        source = None
    if args.resume and "=" in args.resume and not Path(args.resume).exists():
        overrides = {**overrides, **parse_overrides([args.resume])}  # `--out DIR --resume rounds=20`
        args.resume = ""
    if args.resume == "":  # `fedskew run CONFIG --out DIR --resume`: the whole experiment
        runs, parent = plan(source, overrides, out=args.out, only=args.only, force=args.force, imports=args.imports,
                            resume=True, label=args.label)
        from fedskew.engine.experiment import run_state

        states = [run_state(parent / r.folder_name, r.typed) for r in runs]
        print(f"fedskew: {parent}: {states.count('done')} run(s) finished, {states.count('partial')} to continue, "
              f"{states.count('new')} to start", file=sys.stderr)
        run_experiment(runs, parent, data_dir=_data_dir(args), progress=progress, resume=True, states=states)
        parents = [parent]
    elif args.resume:
        if source is not None:
            from fedskew.engine.checkpoint import RESUMABLE

            raise FedskewError(
                f"--resume takes no config file ({source!r}): the run folder's {CONFIG_FILE} is used; "
                f"give only overrides ({', '.join(RESUMABLE)})"
            )
        res = resume_run(Path(args.resume), overrides, data_dir=_data_dir(args), progress=progress)
        parents = [res.run_dir]
    else:
        runs, parent = plan(source, overrides, out=args.out, only=args.only, force=args.force, imports=args.imports,
                            label=args.label)
        base = Path("runs") / str(runs[0].config["name"])
        if args.out is None and parent != base:  # renumbered: say so, never silently
            print(f"fedskew: {base} holds earlier runs; these go to {parent} (give --out to choose)", file=sys.stderr)
        print(f"fedskew: {len(runs)} run(s) -> {parent}", file=sys.stderr)
        run_experiment(runs, parent, data_dir=_data_dir(args), progress=progress)
        parents = [parent]
    # The experiment's report, EXP/report/: after --resume RUN, that of every run of RUN's experiment folder
    from fedskew.report import write_report  # matplotlib: imported once the runs are done, not before they start

    runs_of: list[Path] = parents
    folder: Path | None = parents[0] / "report"
    try:
        runs_of, folder = _experiment_report(parents) if args.resume else (parents, parents[0] / "report")
        html = write_report(runs_of, folder)
    except (FedskewError, OSError) as e:  # the runs are done and kept; only their report failed: not a success
        why = _report_error(e, folder, runs_of) if isinstance(e, OSError) else str(e)
        print(f"fedskew: error: the runs finished and are kept in {parents[0]}, but no report was written: {why}; "
              f"fix that, then `fedskew report {parents[0]}`", file=sys.stderr)
        return 1
    _print_table(runs_of)
    print(f"\nrun folder: {parents[0]}\nreport:     {html}")
    return 0


def _report_error(e: OSError, report: Path | None, runs: list[Path]) -> str:
    """A failed report write in one line naming the report folder (``report``, None: the default one of ``runs``)
    on a full disk or a read-only folder, not the temporary folder it was being written into
    (:func:`fedskew.core.files.staged_folder`)."""
    from fedskew.runs import describe_os_error, report_folder

    staged = isinstance(e.filename, str | bytes) and ".partial-" in os.fsdecode(e.filename)
    return describe_os_error(OSError(e.errno, e.strerror) if staged else e, report or report_folder(runs))


def cmd_partition(args: argparse.Namespace) -> int:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.data.partition import summarize
    from fedskew.data.partition_plot import partition_plot
    from fedskew.engine.federation import federation_for

    spec = resolve(
        read_config(args.config), parse_overrides(args.overrides), where=str(args.config), imports=args.imports
    )[0]
    config = spec.typed
    fed = federation_for(config, _data_dir(args))
    # The federation holds each client's shard contiguously: offsets give the partition back.
    import numpy as np

    from fedskew.data.partition import Partition

    part = Partition(indices=[np.arange(fed.offsets[k], fed.offsets[k + 1]) for k in range(fed.info.num_clients)])
    labels = fed.y.numpy()
    print(summarize(part, labels, fed.info.num_classes))
    from fedskew.core.figures import dataset_title, partition_title
    from fedskew.core.params import as_table

    out = Path(args.out or f"partition-{config.partition.name}.png")  # in the current folder, as --help says
    drawn = config.partition  # the report's names
    shown = partition_title(drawn.name, drawn.params.num_clients, as_table(drawn.params))
    title = f"{dataset_title(config.dataset.name)}, {shown}"
    partition_plot(fed.counts, out, title=title, class_names=fed.class_names, style=args.style,
                   look=config.report)
    print(f"\npartition plot: {out.resolve()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedskew.core.figures import style_of
    from fedskew.report import write_report
    from fedskew.runs import find_runs, load_run

    paths = [Path(p) for p in args.runs]
    group_by = [key.strip() for item in args.group_by or [] for key in item.split(",") if key.strip()]
    # The look the runs' [report] table gives, changed by the options given.
    style = style_of(load_run(p).recorded_table("report") for p in find_runs(paths)).updated(
        format=args.format, dpi=args.dpi, preset=args.preset, width=args.width, height=args.height,
        font_size=args.font_size, titles=args.titles,
    )
    html = write_report(paths, Path(args.out) if args.out else None, group_by, args.label,
                        progress=not args.no_progress, style=style)
    _print_table(paths, group_by, args.label)
    print(f"\nreport: {html}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedskew.engine.flower.app import superlink_command, write_app, write_shards

    config, overrides = args.config, args.overrides
    if config is not None and "=" in config and not Path(config).exists():  # `fedskew deploy init app rounds=5`
        config, overrides = None, [config, *overrides]
    if args.action == "init":
        folder = write_app(
            Path(args.folder), config, overrides, label=args.label, force=args.force, imports=args.imports
        )
        from fedskew.config import parse_overrides, read_config, resolve

        spec = resolve(read_config(config), parse_overrides(overrides), where=str(config or "default"),
                       imports=args.imports)[0]
        nodes = spec.typed.partition.params.num_clients
        bin_dir = Path(sys.executable).parent
        flwr = bin_dir / "flwr"
        path = "" if os.environ.get("VIRTUAL_ENV") else f'PATH="{bin_dir}:$PATH" '  # flwr starts flower-superlink
        install = "" if flwr.exists() else " (Flower is not installed: pip install -e '.[flower]' in fedskew's clone)"
        print(f"Flower App: {folder}\n"
              f"run it on Flower's local simulation ({nodes} simulated SuperNodes, one per partition){install}:\n"
              f"  {path}{flwr if flwr.exists() else 'flwr'} run {shlex.quote(str(folder))} --stream "
              f"--federation-config 'num-supernodes={nodes}'\n"
              f"or in production: start the SuperLink (bound to this machine; others reach it through an SSH "
              f"tunnel, see docs/deploy.md):\n  {superlink_command()}\n"
              f"then: flwr run {shlex.quote(str(folder))} <superlink-connection>")
        return 0
    from fedskew.config import parse_overrides, read_config, resolve

    cfg = resolve(
        read_config(config), parse_overrides(overrides), where=str(config or "default"), imports=args.imports
    )[0].config
    paths = write_shards(cfg, Path(args.folder), _data_dir(args))
    print(f"{len(paths)} shard files in {args.folder}: give client-<k>.pt to the site of partition k")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedskew.audit import AUDIT_LEGEND, audit, format_audit

    results = audit([Path(p) for p in args.runs], _data_dir(args), args.max_images, args.epochs,
                    progress=not args.no_progress)
    print(format_audit(results))
    print("\n" + AUDIT_LEGEND)
    from fedskew.report import write_report

    # The report of these runs' experiment (the one `fedskew run` wrote) now shows the audit table beside the
    # results (audit.json in each run).
    runs, folder = _experiment_report([Path(p) for p in args.runs])
    print(f"report: {write_report(runs, folder)}")
    return 0


def cmd_condense(args: argparse.Namespace) -> int:
    from fedskew.cli.condense import cmd_condense as run

    return run(args, _data_dir(args))


def cmd_list(args: argparse.Namespace) -> int:
    import dataclasses

    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.config import builtin_configs
    from fedskew.core.params import params_doc
    from fedskew.data import DATASETS
    from fedskew.data.partition import PARTITIONERS
    from fedskew.models import MODELS
    from fedskew.plugins import loaded_plugins

    registries: dict[str, Any] = {
        "algorithms": ALGORITHMS, "models": MODELS, "datasets": DATASETS, "partitioners": PARTITIONERS,
    }
    for title, registry in registries.items():
        base = registry.base
        common = {f.name for f in dataclasses.fields(base)} if base is not None else set()
        print(f"{title}:" + (f" (all also take: {', '.join(sorted(common))})" if common else ""))
        for name in registry.names():
            cls = registry.params_of(name)
            doc = ", ".join(f"{n}={d!r}" for n, _, d in params_doc(cls) if n not in common) if cls else ""
            print(f"  {name:<14} {doc}")
    print("configs:      " + ", ".join(builtin_configs()))
    plugins = loaded_plugins()
    if plugins:
        print("plugins:      " + ", ".join(plugins))
    return 0
