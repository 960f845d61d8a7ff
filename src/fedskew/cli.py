"""The ``fedskew`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedskew.core.errors import FedskewError

if TYPE_CHECKING:
    from fedskew.config import RunSpec

EPILOG = """examples:
  fedskew run                                   the default experiment (digits, FedAvg vs centralised)
  fedskew run experiments/fmnist_fedavg.toml rounds=5 partition.alpha=0.5
  fedskew run --resume runs/default/FedAvg-seed0 rounds=50
  fedskew partition experiments/fmnist_fedavg.toml
  fedskew report runs/default
  fedskew audit runs/feddc_cifar10                 privacy of the condensed images FedDC clients sent
  fedskew condense --dataset fashion_mnist --method dm --ipc 10 --iterations 200   condense and score a set
  fedskew list
  fedskew deploy init my-app experiments/fmnist_fedavg.toml rounds=50   a Flower App for `flwr run`
"""


def _data_dir(args: argparse.Namespace) -> str | None:
    return args.data_dir or os.environ.get("FEDSKEW_DATA") or None


def _only(runs: list[RunSpec], wanted: list[str]) -> list[RunSpec]:
    """The runs whose label is in ``wanted``; every label in ``wanted`` must name one.

    ``--only`` takes several labels, so an override written after it (``--only FedAF rounds=5``) would
    otherwise be read as a label and silently dropped.
    """
    labels = list(dict.fromkeys(r.label for r in runs))
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        hint = ""
        if any("=" in w for w in unknown):
            hint = "; overrides go before --only, e.g. `fedskew run CONFIG rounds=5 --only LABEL`"
        raise FedskewError(f"--only: no run is labelled {', '.join(map(repr, unknown))}; "
                           f"this config's labels: {', '.join(map(repr, labels))}{hint}")
    return [r for r in runs if r.label in wanted]


def cmd_run(args: argparse.Namespace) -> int:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.engine.experiment import choose_parent, resume_run, run_experiment
    from fedskew.report import format_table, write_report

    overrides = parse_overrides(args.overrides)
    progress = not args.no_progress
    source = args.config
    if source is not None and "=" in source and not Path(source).exists():
        overrides = parse_overrides([source, *args.overrides])  # `fedskew run rounds=5`, `--resume DIR rounds=20`
        source = None
    if args.resume:
        if source is not None:
            raise FedskewError(
                f"--resume takes no config file ({source!r}): the run folder's config.toml is used; "
                "give only overrides (rounds, workers, checkpoint_every)"
            )
        res = resume_run(Path(args.resume), overrides, data_dir=_data_dir(args), progress=progress)
        parents = [res.run_dir]
    else:
        raw = read_config(source)
        runs = resolve(raw, overrides, where=str(source or "default"))
        if args.only:
            runs = _only(runs, args.only)
        parent = choose_parent(args.out, runs[0].config.get("name", "experiment"), runs, args.force)
        print(f"fedskew: {len(runs)} run(s) -> {parent}", file=sys.stderr)
        run_experiment(runs, parent, data_dir=_data_dir(args), progress=progress)
        parents = [parent]
    html = write_report(parents, parents[0] / "report")
    from fedskew.report import comparison_table, find_runs, load_run

    rows = comparison_table([load_run(p) for p in find_runs(parents)])
    print(format_table(rows))
    print(f"\nrun folder: {parents[0]}\nreport:     {html}")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.data.partition import summarize
    from fedskew.data.partition_plot import bubble_plot
    from fedskew.engine.federation import build_federation

    spec = resolve(read_config(args.config), parse_overrides(args.overrides), where=str(args.config))[0]
    cfg = spec.config
    fed = build_federation(cfg["dataset"], cfg["partition"], cfg["model"], int(cfg["seed"]), _data_dir(args))
    # The federation holds each client's shard contiguously: offsets give the partition back.
    import numpy as np

    from fedskew.data.partition import Partition

    part = Partition(indices=[np.arange(fed.offsets[k], fed.offsets[k + 1]) for k in range(fed.info.num_clients)])
    labels = fed.y.numpy()
    print(summarize(part, labels, fed.info.num_classes))
    out = Path(args.out or f"partition-{cfg['partition']['name']}.png")
    title = f"{cfg['dataset']['name']}: {cfg['partition']['name']} " + ", ".join(
        f"{k}={v}" for k, v in cfg["partition"].items() if k != "name"
    )
    bubble_plot(fed.counts, out, title=title, class_names=fed.class_names)
    print(f"\nbubble plot: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedskew.report import comparison_table, find_runs, format_table, load_run, write_report

    paths = [Path(p) for p in args.runs]
    html = write_report(paths, Path(args.out) if args.out else None)
    print(format_table(comparison_table([load_run(p) for p in find_runs(paths)])))
    print(f"\nreport: {html}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedskew.engine.flower.app import write_app, write_shards

    config, overrides = args.config, args.overrides
    if config is not None and "=" in config and not Path(config).exists():  # `fedskew deploy init app rounds=5`
        config, overrides = None, [config, *overrides]
    if args.action == "init":
        folder = write_app(Path(args.folder), config, overrides, label=args.label, force=args.force)
        print(f"Flower App: {folder}\nrun it with: flwr run {folder} <superlink-connection>  (see docs/deploy.md)")
        return 0
    from fedskew.config import parse_overrides, read_config, resolve

    cfg = resolve(read_config(config), parse_overrides(overrides), where=str(config or "default"))[0].config
    paths = write_shards(cfg, Path(args.folder), _data_dir(args))
    print(f"{len(paths)} shard files in {args.folder}: give client-<k>.pt to the site of partition k")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedskew.audit import AUDIT_LEGEND, audit, format_audit

    results = audit([Path(p) for p in args.runs], _data_dir(args), args.max_images, args.epochs)
    print(format_audit(results))
    print("\n" + AUDIT_LEGEND)
    from fedskew.report import write_report

    # The report of these runs now shows the audit table beside the results (audit.json in each run).
    print(f"report: {write_report([Path(p) for p in args.runs])}")
    return 0


def cmd_condense(args: argparse.Namespace) -> int:
    from fedskew.condense.cli import cmd_condense as run

    return run(args, _data_dir(args))


def cmd_list(args: argparse.Namespace) -> int:
    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.config import builtin_configs
    from fedskew.core.params import params_doc
    from fedskew.data import DATASETS
    from fedskew.data.partition import PARTITIONERS
    from fedskew.models import MODELS

    print("algorithms:")
    for name in ALGORITHMS.names():
        doc = ", ".join(f"{n}={d!r}" for n, _, d in params_doc(ALGORITHMS.get(name).Params))
        print(f"  {name:<14} {doc}")
    print("models:       " + ", ".join(MODELS.names()))
    print("datasets:     " + ", ".join(DATASETS.names()))
    print("partitioners: " + ", ".join(PARTITIONERS.names()))
    print("configs:      " + ", ".join(builtin_configs()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedskew",
        description="Federated learning on skewed (non-IID) client data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"fedskew {__import__('fedskew').__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    data_help = "folder laid out like shared/datasets (default: $FEDSKEW_DATA, else ~/.cache/fedskew/data)"
    r = sub.add_parser("run", help="run an experiment (default: the built-in default experiment)")
    r.add_argument("config", nargs="?", help="TOML config file or built-in config name (default: default)")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=5 partition.alpha=0.5")
    r.add_argument("--out", help="experiment folder (default: runs/<name>, numbered if taken)")
    r.add_argument("--data-dir", help=data_help)
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a run folder from its last checkpoint")
    r.add_argument("--only", nargs="+", metavar="LABEL",
                   help="run only the variants with these labels (put overrides before --only)")
    r.add_argument("--force", action="store_true", help="overwrite runs already in --out")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)

    pa = sub.add_parser("partition", help="print per-client class counts and save a bubble plot")
    pa.add_argument("config", help="TOML config file or built-in config name")
    pa.add_argument("overrides", nargs="*", help="dotted overrides, e.g. partition.alpha=0.5")
    pa.add_argument("--out", help="PNG path (default: partition-<name>.png)")
    pa.add_argument("--data-dir", help=data_help)
    pa.set_defaults(func=cmd_partition)

    rp = sub.add_parser("report", help="plots, comparison table and report.html for run folders")
    rp.add_argument("runs", nargs="+", help="run folders or their parents")
    rp.add_argument("--out", help="output folder (default: <common parent>/report)")
    rp.set_defaults(func=cmd_report)

    de = sub.add_parser("deploy", help="run on Flower: write a Flower App folder, or per-client shard files")
    de.add_argument("action", choices=["init", "shards"], help="init: app folder for `flwr run`; shards: data files")
    de.add_argument("folder", help="the app folder (init) or the shard folder (shards)")
    de.add_argument("config", nargs="?", help="TOML config file or built-in config name (default: default)")
    de.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=5 partition.alpha=0.5")
    de.add_argument("--data-dir", help=data_help)
    de.add_argument("--label", default="", help="init: the variant to run when the config has several")
    de.add_argument("--force", action="store_true", help="overwrite an existing app folder")
    de.set_defaults(func=cmd_deploy)

    au = sub.add_parser(
        "audit", help="privacy checks on the synthetic images a run's clients sent; adds the table to the report"
    )
    au.add_argument("runs", nargs="+", help="run folders or their parents")
    au.add_argument("--data-dir", help=data_help)
    au.add_argument("--max-images", type=int, default=2000, help="images sampled per run (default 2000)")
    au.add_argument("--epochs", type=int, default=50, help="epochs of the attacked model (default 50)")
    au.set_defaults(func=cmd_audit)

    co = sub.add_parser("condense", help="condense a dataset (DC, DM, KIP), save the set and score it")
    co.add_argument("--dataset", default="digits", help="registered dataset name (default digits)")
    co.add_argument("--data-dir", help=data_help)
    co.add_argument("--method", default="dm", help="dc, dm, kip or random (a random real subset; default dm)")
    co.add_argument("--ipc", type=int, default=1, help="images per class (default 1)")
    co.add_argument("--iterations", type=int,
                    help="condensation iterations (default: published, DC 1000, DM 20000, KIP 1000)")
    co.add_argument("--seed", type=int, default=0, help="seed of condensation and evaluation (default 0)")
    co.add_argument("--out", help="output folder (default runs/condense/<dataset>-<method>-ipc<N>-seed<S>)")
    co.add_argument("--eval-epochs", type=int, default=300, help="epochs of the evaluation training (default 300)")
    co.add_argument("--eval-dsa", action="store_true", help="DSA augmentation in the evaluation training, "
                    "as DSA and DM evaluate (default off, as DC evaluates)")
    co.add_argument("--model", default="convnet", help="network to condense with and evaluate (default convnet)")
    co.add_argument("--net-width", type=int, help="ConvNet width (default 128)")
    co.add_argument("--image-lr", type=float, help="image learning rate (default DC 0.1, DM 1.0, KIP 0.01)")
    co.add_argument("--real-batch", type=int, help="real images per class per step (KIP: target batch; default 256)")
    co.add_argument("--dsa", action=argparse.BooleanOptionalAction, default=None,
                    help="augment while matching (default: on for DM, off for DC)")
    co.add_argument("--outer-loop", type=int, help="DC matching steps per network (default DC's: 1 at ipc 1, 10 at 10)")
    co.add_argument("--inner-loop", type=int, help="DC network steps between them (default DC's: 1 at ipc 1, 50 at 10)")
    co.add_argument("--kernel", default="ntk", help="KIP kernel: ntk or rf_convnet (default ntk)")
    co.add_argument("--learn-labels", action="store_true", help="KIP also learns the labels (saved as soft labels)")
    co.add_argument("--threads", type=int, default=1, help="torch threads (default 1: reproducible, fair to others)")
    co.add_argument("--no-progress", action="store_true", help="no progress bar")
    co.set_defaults(func=cmd_condense)

    ls = sub.add_parser("list", help="registered algorithms, models, datasets, partitioners, configs")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except FedskewError as e:
        print(f"fedskew: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedskew: interrupted; a run continues from its last checkpoint with "
              "`fedskew run --resume RUN_DIR`", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
