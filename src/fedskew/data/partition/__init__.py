"""Split a labelled training set among federated clients, IID or skewed.

Non-IID data is what fedskew is about, so every experiment starts here: a *partitioner* takes the
training labels and returns, per client, the indices of the samples that client holds. The skews
the papers use (see ``SPEC.md``) are all registered in :data:`PARTITIONERS`, each with a Params
dataclass declaring its options:

======================== ======================================================================
name                     skew
======================== ======================================================================
``iid``                  none: equal-size uniform random split (the control)
``dirichlet``            label and size skew: per class, client shares ~ Dir(alpha) (NIID-Bench)
``classes_per_client``   label skew: each client holds exactly ``classes`` classes (HFLDD's C; NIID-Bench's #C=k)
``shards``               label skew: McMahan et al.'s sort-by-label shards
``quantity``             size skew only: client sizes ~ Dir(alpha), labels IID within a client
``mixed``                several partitioners, each over its own group of clients
``noise``                feature skew: a base split plus Gaussian input noise growing with the client id
``domain``               feature skew: one client per domain (e.g. DomainNet)
======================== ======================================================================

Use :func:`partition` rather than calling the registered functions: it validates the parameters
(so a typo in a config file fails loudly) and seeds the random generator, which makes every
partition a pure function of ``(name, labels, num_clients, seed, params)``.

Modules: :mod:`.base` (the result, registry, entry point and report), :mod:`.label` (label and size
skews), :mod:`.feature` (noise and domain) and :mod:`.mixed`; importing this package registers them all.
"""

from fedskew.data.partition import feature, label, mixed
from fedskew.data.partition.base import (
    PARTITIONERS,
    Partition,
    PartitionFn,
    PartitionParams,
    hold_out,
    partition,
    summarize,
)

__all__ = [
    "PARTITIONERS",
    "Partition",
    "PartitionFn",
    "PartitionParams",
    "feature",
    "hold_out",
    "label",
    "mixed",
    "partition",
    "summarize",
]
