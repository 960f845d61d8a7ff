"""fedskew: federated learning on skewed (non-IID) client data.

The public Python API (``docs/python-api.md``)::

    import fedskew

    results = fedskew.run("experiments/fmnist_fedavg.toml", rounds=2, partition__alpha=0.5)
    print(results.table())
    fedskew.report(results)

and what extending fedskew takes (``docs/extending.md``): :func:`register_algorithm`, :class:`Algorithm`
and :class:`FedAvg` for a method; the registries :data:`MODELS`, :data:`DATASETS` and
:data:`PARTITIONERS` with the base classes of their entries; :func:`load_plugins` for modules and files
that register them. The names are imported when first used, so ``import fedskew`` stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# GNU OpenMP (PyTorch's Linux CPU wheels) lets a thread that waits at the end of a parallel region spin for
# 300,000 turns before it sleeps. When another process wants the same cores, the spinning holds a core the
# thread it waits for needs: the server's training of FedDM on this project's 2-core machine took 63 s instead
# of 3.6 s beside one other job, and 2.6 s when idle (docs/performance.md, "OpenMP's spin"). 1,000 turns keep
# the idle speed and lose little under load. Read when the OpenMP library loads, so only before ``import torch``
# in this process; a value already set wins. The number of threads, and so every result, is unchanged.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # running and reporting
    "run": "fedskew.api",
    "Results": "fedskew.api",
    "report": "fedskew.report",
    "load_plugins": "fedskew.plugins",
    # methods
    "Algorithm": "fedskew.algorithms.base",
    "ALGORITHMS": "fedskew.algorithms.base",
    "register_algorithm": "fedskew.algorithms.base",
    "ClientContext": "fedskew.algorithms.base",
    "ServerContext": "fedskew.algorithms.base",
    "FederationInfo": "fedskew.algorithms.base",
    "FedAvg": "fedskew.algorithms.fedavg",
    "Message": "fedskew.core.message",
    # models, datasets, partitioners
    "MODELS": "fedskew.models.registry",
    "FedModel": "fedskew.models.registry",
    "ModelParams": "fedskew.models.registry",
    "DATASETS": "fedskew.data.sources",
    "ArrayDataset": "fedskew.data.sources",
    "DatasetParams": "fedskew.data.sources",
    "PARTITIONERS": "fedskew.data.partition",
    "Partition": "fedskew.data.partition",
    "PartitionParams": "fedskew.data.partition",
    # errors
    "ConfigError": "fedskew.core.errors",
    "DataError": "fedskew.core.errors",
    "FedskewError": "fedskew.core.errors",
}

__all__ = [
    "ALGORITHMS", "DATASETS", "MODELS", "PARTITIONERS", "Algorithm", "ArrayDataset", "ClientContext", "ConfigError",
    "DataError", "DatasetParams", "FedAvg", "FedModel", "FederationInfo", "FedskewError", "Message", "ModelParams",
    "Partition", "PartitionParams", "Results", "ServerContext", "__version__", "load_plugins", "register_algorithm",
    "report", "run",
]

if TYPE_CHECKING:
    from fedskew.algorithms.base import (
        ALGORITHMS,
        Algorithm,
        ClientContext,
        FederationInfo,
        ServerContext,
        register_algorithm,
    )
    from fedskew.algorithms.fedavg import FedAvg
    from fedskew.api import Results, run
    from fedskew.core.errors import ConfigError, DataError, FedskewError
    from fedskew.core.message import Message
    from fedskew.data.partition import PARTITIONERS, Partition, PartitionParams
    from fedskew.data.sources import DATASETS, ArrayDataset, DatasetParams
    from fedskew.models.registry import MODELS, FedModel, ModelParams
    from fedskew.plugins import load_plugins
    from fedskew.report import report


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedskew' has no attribute {name!r}")
    if name == "report":
        return importlib.import_module(module)  # the package itself: callable, see fedskew.report.report
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
