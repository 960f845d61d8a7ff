"""Every column of the comparison table declared once: its key, header, decimals, which way is better, whether
it is a count, where it comes from in ``summary.json`` (and the scale it is shown at) and what it means.

The terminal table, ``results.md``, ``results.csv`` and the HTML report (:mod:`fedskew.report`) read their
headers, rounding and best-value marks from here; the table's rows average each column with a ``source``
over the seeds (:func:`fedskew.report.tables.comparison_table`). Adding a metric: docs/architecture.md,
"Add a metric".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Better = Literal["higher", "lower"] | None


@dataclass(frozen=True)
class Column:
    """One column of the comparison table."""

    key: str
    header: str
    caption: str
    decimals: int = 2
    better: Better = None
    whole: bool = False  # a count: a whole mean prints as an integer
    source: str | None = None  # the summary.json key averaged over seeds (None: the table computes it)
    scale: float = 1.0  # shown as source * scale (100: a fraction in percent)


COLUMNS: tuple[Column, ...] = (
    Column("label", "label", "the runs' label (a variant and its seeds)"),
    Column("algorithm", "algorithm", "the registered method"),
    Column("n", "n", "runs (seeds) in the row"),
    Column("rounds", "rounds", "rounds run"),
    Column("final_acc", "final acc %", "test accuracy of the global model in the last round", better="higher",
           source="final_accuracy", scale=100),
    Column("best_acc", "best acc %", "best test accuracy over the rounds", better="higher", source="best_accuracy",
           scale=100),
    Column("max_drop", "max drop pp", "largest fall of accuracy from one round to the next (FedDC Table 1)",
           better="higher", source="max_drop", scale=100),
    Column("mean_drop", "mean drop pp", "mean fall over the rounds that fell", better="higher", source="mean_drop",
           scale=100),
    Column("mean_rise", "mean rise pp", "mean rise over the rounds that rose", source="mean_rise", scale=100),
    Column("client_mean", "clients % (global)", "mean over clients of the global model on their own test split",
           better="higher", source="client_mean_final", scale=100),
    Column("client_worst10", "worst-10% clients % (global)", "the same, the worst 10% of the clients",
           better="higher", source="client_worst10_final", scale=100),
    Column("client_pooled", "pooled clients % (global)",
           "the global model on every client's test split pooled together (correct answers over all held-out "
           "samples: PFLlib's measure)", better="higher", source="client_pooled_final", scale=100),
    Column("personal_mean", "clients % (own)", "mean over clients of their own model on their own test split",
           better="higher", source="personal_mean_final", scale=100),
    Column("personal_worst10", "worst-10% clients % (own)", "the same, the worst 10% of the clients",
           better="higher", source="personal_worst10_final", scale=100),
    Column("personal_pooled", "pooled clients % (own)",
           "each client's own model on its test split, pooled over all clients' held-out samples",
           better="higher", source="personal_pooled_final", scale=100),
    Column("worse_than_local", "clients worse than local %", "clients whose own model is worse than local training's",
           better="lower"),
    Column("untrained", "clients never trained", "clients evaluated that never trained", whole=True, decimals=1),
    Column("class_var", "class var", "variance of the per-class accuracies, mean over rounds (FedDC Table 1)",
           decimals=5, better="lower", source="mean_class_variance"),
    Column("class_std_pp", "class std pp", "standard deviation of the per-class accuracies, last round",
           better="lower"),
    Column("mb_server_to_client", "MB down", "megabytes the server sent", decimals=3),
    Column("mb_client_to_server", "MB up", "megabytes the clients sent", decimals=3),
    Column("mb_client_to_client", "MB c2c", "megabytes clients sent each other", decimals=3),
    Column("epsilon", "epsilon", "the (epsilon, privacy.delta) differential privacy the run spent ([privacy]; local "
           "and sample modes: the most any client spent)", better="lower", source="epsilon"),
    Column("rounds_to_target", "rounds to target", "first round at target_accuracy", decimals=1, better="lower",
           whole=True),
    Column("mb_to_target", "MB to target", "megabytes sent until target_accuracy", decimals=3, better="lower"),
    Column("target_acc", "target acc %", "target_accuracy, in percent (results.csv; the table's headers say it "
           "where every row shares one: rounds to 80%)", decimals=1),
)

CATALOG: dict[str, Column] = {c.key: c for c in COLUMNS}
"""Column key -> its declaration."""


def column(key: str) -> Column:
    """The declaration of column ``key``; ``acc@<round>`` (accuracy at a round) is made on demand."""
    if key in CATALOG:
        return CATALOG[key]
    if key.startswith("acc@"):
        rnd = key[len("acc@"):]
        return Column(key, f"acc % @{rnd}", f"test accuracy at round {rnd}", better="higher", scale=100)
    return Column(key, key, key, decimals=3 if key.startswith("mb_") else 2)


def from_summaries(*keys: str) -> tuple[Column, ...]:
    """The declarations of ``keys``, each with a ``source``."""
    found = tuple(CATALOG[k] for k in keys)
    assert all(c.source is not None for c in found), keys
    return found
