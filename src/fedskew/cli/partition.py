"""``fedskew partition``: print each client's class counts under a config's partition and draw them."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedskew.cli.common import CONFIG_HELP, DATA_HELP, OVERRIDES_HELP, add_import, data_dir

NAME = "partition"
TRAILING = "overrides"
"""Where the words met after an option go (see :func:`fedskew.cli.parser.parse_args`)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pa = subparsers.add_parser(NAME, help="print per-client class counts and save a bubble plot or heat map")
    pa.add_argument("config", help=CONFIG_HELP)
    pa.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    pa.add_argument("--out", help="file to write, .png, .pdf or .svg (default: partition-<partitioner>.png in the "
                                  "current folder)")
    pa.add_argument("--style", choices=["auto", "bubble", "heatmap"], default="auto",
                    help="bubbles per client and class, or a heat map (auto: a heat map from 100 clients on)")
    pa.add_argument("--data-dir", help=DATA_HELP)
    add_import(pa)
    pa.set_defaults(func=cmd_partition)


def cmd_partition(args: argparse.Namespace) -> int:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.data.partition import summarize
    from fedskew.data.partition_plot import partition_plot
    from fedskew.engine.federation import federation_for

    spec = resolve(
        read_config(args.config), parse_overrides(args.overrides), where=str(args.config), imports=args.imports
    )[0]
    config = spec.typed
    fed = federation_for(config, data_dir(args))
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
