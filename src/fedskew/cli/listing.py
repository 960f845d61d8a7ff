"""``fedskew list``: the registered algorithms, models, datasets and partitioners with their options, and the
built-in configs (a module not named ``list``, which would hide the built-in in this package)."""

from __future__ import annotations

import argparse
from typing import Any

from fedskew.cli.common import add_import

NAME = "list"
TRAILING = None
"""``fedskew list`` takes no words after its options."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ls = subparsers.add_parser(NAME, help="registered algorithms, models, datasets, partitioners, configs")
    add_import(ls)
    ls.set_defaults(func=cmd_list)


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
            paper = getattr(registry.get(name), "paper", "") if title == "algorithms" else ""
            if paper:
                print(f"  {'':<14} paper: {paper}")
    print("configs:      " + ", ".join(builtin_configs()))
    plugins = loaded_plugins()
    if plugins:
        print("plugins:      " + ", ".join(plugins))
    return 0
