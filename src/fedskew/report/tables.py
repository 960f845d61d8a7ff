"""The comparison table of finished runs: one row per label, as plain text, Markdown and CSV.

Units in everything shown to people: accuracy in percent, drops and rises in percentage points
(FedDC's "round variance", as in its Table 1), traffic in MB (10^6 bytes). Runs sharing a label are
seeds of one setting: they are shown as mean and sample standard deviation (ddof=1).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedskew.config.variants import MISSING, config_value, expand_label, scalar_value
from fedskew.core.errors import FedskewError
from fedskew.metrics.catalog import CATALOG, COLUMNS, Column, column, from_summaries
from fedskew.runs import RunData, is_number

DIRECTIONS = ("server_to_client", "client_to_server", "client_to_client")
MB = 1e6

# Display names, decimals and counts of the table's columns: fedskew.metrics.catalog; a column ``x_std`` is
# shown inside column ``x`` as "mean ± std".
HEADERS = {c.key: c.header for c in COLUMNS}
TERMINAL_WIDTH = 120
"""The widest table ``fedskew run`` and ``fedskew report`` print; results.md and results.csv hold every column."""
_LABEL_WIDTH = 40
PER_CLIENT = from_summaries("client_mean", "client_worst10", "client_pooled", "personal_mean", "personal_worst10",
                            "personal_pooled")
"""Per-client columns: mean and worst-10% client accuracy of the global and of the clients' own models."""
_TEXT_COLUMNS = {"label", "algorithm"}


EXPERIMENT_TABLES = ("dataset", "partition", "model")
"""The config tables that say which experiment a run belongs to: runs under one label must agree on them."""


def _config_value(run: RunData, key: str) -> Any:
    """The run's config value at a dotted key (``partition.alpha``), for ``--group-by``: the value written
    in its ``config.toml``, else the default of an option left unset (``algorithm.tau`` of a FedAF run
    that did not set it), else ``-`` (no such key, e.g. ``algorithm.tau`` of a FedAvg run)."""
    value = config_value(run.config, key)
    return "-" if value is MISSING else value


def _setting(run: RunData, identity: dict[str, Any], key: str) -> Any:
    """A run's value of an experiment key: as recorded, else the option's default, else None."""
    if key in identity:
        return identity[key]
    value = config_value(run.config, key)
    return None if value is MISSING else value


def _check_group_key(runs: list[RunData], key: str) -> None:
    """Refuse a ``--group-by`` key that ``--label`` would refuse: one that no run's config has (a misspelt key),
    or one naming a table or a list (``dataset``) rather than a single value."""
    configs = [run.config for run in runs if run.config]
    what = f"--group-by {key!r}"
    for cfg in configs:
        if config_value(cfg, key) is not MISSING:
            scalar_value(cfg, key, what)  # a table or a list is refused
    if configs and all(config_value(cfg, key) is MISSING for cfg in configs):
        scalar_value(configs[0], key, what)  # no run has it: refused, naming the key


def _identity(run: RunData) -> dict[str, Any]:
    """A run's experiment identity: every key of its dataset, partition and model tables but ``data_dir``."""
    out: dict[str, Any] = {}
    for table in EXPERIMENT_TABLES:
        for key, value in run.recorded_table(table).items():
            out[f"{table}.{key}"] = value
    return out


def separate_experiments(runs: list[RunData], group_by: Sequence[str] = (), label: str = "") -> list[RunData]:
    """The runs, labelled so that runs sharing a label are seeds of one experiment.

    ``label`` is a template for each run's new label, as ``fedskew run --label`` takes it
    (:func:`~fedskew.config.variants.expand_label`: ``{label}`` the run's own, ``{KEY}`` a config value).
    ``group_by`` (dotted config keys, e.g. ``dataset.name`` or ``algorithm.tau``) adds each run's values
    of those keys to its label, which shows runs of different experiments, or of one method's settings,
    apart. Runs that still share a label must agree on every key of their dataset, partition and model
    tables (runs without a ``config.toml`` are not checked); otherwise a :class:`FedskewError` names the
    label and the keys that differ, rather than averaging different experiments into one row.
    """
    if label:
        runs = [dataclasses.replace(run, label=expand_label(label, run.label, run.config)) for run in runs]
    if group_by:
        for key in group_by:
            _check_group_key(runs, key)
        runs = [
            dataclasses.replace(
                run, label=f"{run.label} ({', '.join(f'{k}={_config_value(run, k)}' for k in group_by)})"
            )
            for run in runs
        ]
    for label, group in group_runs(runs).items():
        known = [(run, _identity(run)) for run in group if run.config]
        if not known:
            continue
        first_run, first = known[0]
        for run, identity in known[1:]:
            # A key one record lacks is at its default there (records before fedskew wrote full configs).
            differ = sorted(k for k in first.keys() | identity.keys()
                            if _setting(first_run, first, k) != _setting(run, identity, k))
            if differ:
                shown = "; ".join(f"{k}: {first.get(k)!r} vs {identity.get(k)!r}" for k in differ[:4])
                raise FedskewError(
                    f"runs labelled {label!r} come from different experiments ({shown}; {first_run.path} vs "
                    f"{run.path}); report them separately, or show them apart with --group-by {differ[0]}"
                )
    return runs


def differing_settings(runs: list[RunData]) -> list[str]:
    """The keys of the dataset, partition and model tables (:data:`EXPERIMENT_TABLES`, ``data_dir`` aside) and
    ``rounds`` on which the runs differ: runs of different experiments, whatever their labels (runs without a
    ``config.toml`` are not compared). An unset key is at its default, as for runs sharing a label."""
    known = [(run, _identity(run)) for run in runs if run.config]
    keys = sorted({k for _, identity in known for k in identity})
    differ = [k for k in keys if len({repr(_setting(run, identity, k)) for run, identity in known}) > 1]
    if len({run.summary.get("rounds") for run in runs}) > 1:
        differ.append("rounds")
    return differ


def differing_line(runs: list[RunData]) -> str:
    """One line saying that the runs come from different experiments and on which keys they differ
    (:func:`differing_settings`), or "" where they do not."""
    keys = differing_settings(runs)
    if not keys:
        return ""
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return (f"note: these runs come from different experiments: they differ in {shown}; compare them with care "
            "(no best value is marked)")


def group_runs(runs: Iterable[RunData]) -> dict[str, list[RunData]]:
    """Runs by label, labels in order of first appearance."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def _mean_std(values: Iterable[float | None], scale: float, ndigits: int) -> tuple[float | None, float | None]:
    """Mean and sample std of the non-None values times ``scale``; std is None for fewer than two."""
    vals = [float(v) * scale for v in values if v is not None]
    if not vals:
        return None, None
    std = round(statistics.stdev(vals), ndigits) if len(vals) > 1 else None
    return round(statistics.fmean(vals), ndigits), std


def _class_std_pp(run: RunData) -> float | None:
    """Mean over rounds of the per-class accuracy standard deviation, in percentage points.

    FedDC's Table 1 "class variance" values (12-33 for CIFAR-10) exceed the largest possible variance
    of fractions (0.25) and would mean implausibly small spreads if read as percent squared; their
    magnitude matches a standard deviation in points. This column makes that comparison possible.
    """
    stds = [math.sqrt(r["class_variance"]) * 100 for r in run.records if is_number(r.get("class_variance"))]
    return statistics.fmean(stds) if stds else None


def comparison_table(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per label, aggregating seeds.

    Returns
    -------
    list of dict
        Keys: ``label``, ``algorithm``, ``n`` (runs aggregated), ``rounds``; ``final_acc``,
        ``best_acc`` and ``acc@<round>`` (for rounds in the summaries' ``accuracy_at``) in percent;
        ``max_drop``, ``mean_drop``, ``mean_rise`` in percentage points; with a per-client evaluation,
        ``client_mean``, ``client_worst10``, ``client_pooled``, ``personal_mean``, ``personal_worst10``,
        ``personal_pooled`` (the last evaluated round's mean, worst-10% and pooled client accuracy of the global
        and the clients' own models, percent);
        ``class_var`` (mean per-round
        class variance of fractional accuracies) and ``class_std_pp``; each of these with a
        ``<key>_std``, the sample std over seeds (None for a single run); ``mb_<direction>`` traffic
        totals; and, when the summaries have them, ``rounds_to_target`` and ``mb_to_target`` (None unless every seed
        reached the target, since a mean over the seeds that did would flatter the method).
        Accuracies and points are rounded to 2 decimals.
    """
    at_rounds = sorted(
        {int(r) for run in runs for r in (run.summary.get("accuracy_at") or {})},
    )
    with_target = any(run.summary.get("rounds_to_target") is not None for run in runs)
    private = any(run.summary.get("epsilon") is not None for run in runs)  # [privacy] runs: an epsilon column
    local = {run.summary.get("seed"): _client_vector(run, "personal_accuracy") for run in runs
             if run.summary.get("algorithm") == "local"}
    rows = []
    for label, group in group_runs(runs).items():
        summaries = [run.summary for run in group]
        algorithms = list(dict.fromkeys(str(s["algorithm"]) for s in summaries))
        n_rounds = sorted({int(s["rounds"]) for s in summaries})
        row: dict[str, Any] = {
            "label": label,
            "algorithm": ", ".join(algorithms),
            "n": len(group),
            "rounds": n_rounds[0] if len(n_rounds) == 1 else f"{n_rounds[0]}-{n_rounds[-1]}",
        }
        for c in from_summaries("final_acc", "best_acc"):
            row[c.key], row[f"{c.key}_std"] = _summary_mean(summaries, c)
        for r in at_rounds:
            c = column(f"acc@{r}")
            row[c.key], row[f"{c.key}_std"] = _mean_std(
                ((s.get("accuracy_at") or {}).get(str(r)) for s in summaries), c.scale, c.decimals
            )
        for c in (*from_summaries("max_drop", "mean_drop", "mean_rise"), *PER_CLIENT):
            # PER_CLIENT: the per-client evaluation's last round (partition.client_test_fraction)
            row[c.key], row[f"{c.key}_std"] = _summary_mean(summaries, c)
        row["worse_than_local"] = _worse_than_local(group, local)
        row["untrained"], row["untrained_std"] = _mean_std((_last_number(run, "untrained_clients") for run in group),
                                                           1, 1)
        row["class_var"], row["class_var_std"] = _summary_mean(summaries, CATALOG["class_var"])
        row["class_std_pp"], row["class_std_pp_std"] = _mean_std((_class_std_pp(run) for run in group), 1, 2)
        for d in DIRECTIONS:
            row[f"mb_{d}"] = _mean_std((s.get(f"bytes_{d}", 0) for s in summaries), 1 / MB, 3)[0]
        if private:
            row["epsilon"], row["epsilon_std"] = _summary_mean(summaries, CATALOG["epsilon"])
        if with_target:
            targets = {run.recorded("target_accuracy") for run in group}
            target = targets.pop() if len(targets) == 1 else None
            # the target, which the headers say (rounds to 80%)
            row["target_acc"] = round(100 * float(target), 2) if is_number(target) else None
            reached = [s.get("rounds_to_target") is not None for s in summaries]
            row["rounds_to_target"] = (
                _mean_std((s["rounds_to_target"] for s in summaries), 1, 1)[0] if all(reached) else None
            )
            row["mb_to_target"] = (
                _mean_std((s.get("bytes_to_target") for s in summaries), 1 / MB, 3)[0] if all(reached) else None
            )
        rows.append(row)
    return rows


def _summary_mean(summaries: list[dict[str, Any]], c: Column) -> tuple[float | None, float | None]:
    """Mean and std over the seeds of column ``c``'s ``summary.json`` value, at its scale and decimals."""
    return _mean_std((s.get(c.source or c.key) for s in summaries), c.scale, c.decimals)


def _client_vector(run: RunData, key: str) -> list[float | None]:
    """The per-client accuracies of ``key`` (a fraction or None per client) in the run's last round that has them."""
    for r in reversed(run.records):
        if isinstance(r.get(key), list):
            return [float(a) if is_number(a) else None for a in r[key]]
    return []


def _last_number(run: RunData, key: str) -> float | None:
    """The value of ``key`` in the run's last round that has one."""
    for r in reversed(run.records):
        if is_number(r.get(key)):
            return float(r[key])
    return None


def _worse_than_local(group: list[RunData], local: dict[Any, list[float | None]]) -> float | None:
    """Percent of the clients whose own model this method makes worse than ``local``'s (the same seed and client,
    last evaluated round; clients of all seeds pooled), or None without a ``local`` run to compare with."""
    worse = compared = 0
    for run in group:
        theirs = local.get(run.summary.get("seed"))
        if not theirs or run.summary.get("algorithm") == "local":
            continue
        ours = _client_vector(run, "personal_accuracy")
        for a, b in zip(ours, theirs, strict=False):
            if a is not None and b is not None:
                compared += 1
                worse += a < b - 1e-12
    return round(100 * worse / compared, 1) if compared else None


def _shared_target(rows: list[dict[str, Any]]) -> float | None:
    """The target accuracy (percent) of every row, when they share one (the headers then say it)."""
    targets = {row.get("target_acc") for row in rows if "target_acc" in row}
    target = targets.pop() if len(targets) == 1 else None
    return float(target) if is_number(target) else None


TARGET_HEADERS = {"rounds_to_target": "rounds to {t:g}%", "mb_to_target": "MB to {t:g}%"}
"""Headers of the columns counted to ``target_accuracy`` when every row shares one (``rounds to 80%``)."""


def table_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The columns the table shows: every key but the ``_std`` ones, all-empty columns dropped, and the target
    accuracy where every row shares one (the headers of the columns counted to it say it instead)."""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if not k.endswith("_std")]
    if _shared_target(rows) is not None:
        keys.remove("target_acc")
    return [k for k in keys if any(row.get(k) is not None for row in rows)]


def table_cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cell strings of the :func:`table_keys` columns: ``x`` and ``x_std`` merged into "mean ± std"."""
    keys = table_keys(rows)

    def cell(row: dict[str, Any], key: str) -> str:
        value, std = row.get(key), row.get(f"{key}_std")
        if value is None:
            return "-"
        if not isinstance(value, float):
            return str(value)
        c = column(key)
        if c.whole and value.is_integer() and (std is None or std == 0):
            return str(int(value)) + (" ± 0" if std is not None else "")  # a count: 5, not 5.0
        digits = c.decimals
        return f"{value:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")

    target = _shared_target(rows)
    headers = [TARGET_HEADERS[k].format(t=target) if target is not None and k in TARGET_HEADERS else column(k).header
               for k in keys]
    return headers, [[cell(row, k) for k in keys] for row in rows]


def format_table(rows: list[dict[str, Any]], max_width: int | None = None) -> str:
    """The comparison table as aligned plain text, for printing in a terminal.

    With ``max_width`` (``fedskew run`` and ``report`` print at :data:`TERMINAL_WIDTH`), labels longer than 40
    characters are shortened with ``...`` in the middle (the end of a ``--group-by`` label says its setting),
    unless that would make two labels alike: then they are shown whole (up to ``max_width`` less 30); and the
    rightmost columns that do not fit are left out, with a last line saying how many and where they are
    (results.md, results.csv).
    """
    headers, cells = table_cells(rows)
    dropped = 0
    if max_width is not None:
        width = _LABEL_WIDTH
        for j, h in enumerate(headers):
            if h not in _TEXT_COLUMNS:
                continue
            texts = [row[j] for row in cells]
            while len({_shorten(t, width) for t in texts}) < len(set(texts)) and width < max(max_width - 30, 40):
                width += 1  # shortened labels alike: widen until they differ
        cells = [[_shorten(c, width) if h in _TEXT_COLUMNS else c for c, h in zip(row, headers, strict=True)]
                 for row in cells]
        while len(headers) > 3 and _width(headers, cells) > max_width:
            headers, cells = headers[:-1], [row[:-1] for row in cells]
            dropped += 1
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(items: list[str]) -> str:
        padded = (
            item.ljust(w) if h in _TEXT_COLUMNS else item.rjust(w)
            for item, w, h in zip(items, widths, headers, strict=True)
        )
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    more = [f"({dropped} more column{'s' if dropped > 1 else ''} in results.md and results.csv)"] if dropped else []
    return "\n".join([line(headers), rule, *(line(c) for c in cells), *more])


def _width(headers: list[str], cells: list[list[str]]) -> int:
    return sum(max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)) + 2 * (len(headers) - 1)


def _shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and its end, ``...`` between."""
    if len(text) <= width:
        return text
    tail = (width - 3) // 3
    return text[: width - 3 - tail] + "..." + text[len(text) - tail:]


def write_table(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """Write ``results.md`` (for docs and pull requests) and ``results.csv`` (for further analysis).

    The CSV keeps means and stds in separate columns with full precision of the rows; the Markdown
    shows them as "mean ± std".
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    headers, cells = table_cells(rows)
    md = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join([":---", *["---:"] * (len(headers) - 1)]) + "|",
        *("| " + " | ".join(c) + " |" for c in cells),
    ]
    md_path = out_dir / "results.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    csv_path = out_dir / "results.csv"
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return md_path, csv_path
