"""docs/fidelity.md: the four papers' headline claims against fedskew's runs, generated so it cannot drift.

    python benchmarks/fidelity_table.py --out docs/fidelity.md   # regenerate the page
    python benchmarks/fidelity_table.py --check                  # exit 1 if docs/fidelity.md differs
    python benchmarks/fidelity_table.py                          # print the page

The claims, their paper numbers, rules, scale-downs and commands are in ``benchmarks/fidelity_claims.toml``
(its header describes the format). A claim's arms are either archived runs (a glob of run folders under
``results/``, written by ``benchmarks/archive_runs.py``), whose mean +- std over seeds is computed here
with ``fedskew.report.tables.comparison_table``, or figures recorded from docs/results.md for runs whose
folders were not kept; the page says which. The status follows the numbers: a claim's ``holds`` and
``partial`` rules are evaluated on the arms' means as shown.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import operator
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedskew.core.errors import FedskewError
from fedskew.report.tables import comparison_table, separate_experiments
from fedskew.runs import SUMMARY_FILE, load_run

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "benchmarks" / "fidelity_claims.toml"
DOC = ROOT / "docs" / "fidelity.md"
REGENERATE = "python benchmarks/fidelity_table.py --out docs/fidelity.md"

HOLDS, PARTIAL, DOES_NOT_HOLD = "holds", "partial", "does not hold"
NOT_MEASURABLE, NOT_RUN = "not measurable here", "not run yet"
FIXED_STATUSES = (NOT_MEASURABLE, NOT_RUN)
"""Statuses a claim may state itself (with a ``reason``): the ones no numbers decide."""

RECORDED_NOTE = "*recorded: copied from docs/results.md, not recomputed from archived runs*"

CLAIM_KEYS = {
    "id": "a unique name, lower case with dashes",
    "paper": "the paper, short",
    "ref": "table or figure",
    "claim": "the claim in words",
    "paper_number": "the paper's figure(s)",
    "measure": "what the figures are, in words (e.g. best accuracy within 20 rounds, %)",
    "metric": "a column of fedskew.report.tables.comparison_table (best_acc, final_acc, acc@R, mean_drop, ...)",
    "labels": "arm key -> label shown; keys are the names the rules use",
    "runs": "arm key -> glob of archived run folders under results/",
    "recorded": "arm key -> 'MEAN' or 'MEAN ± STD' copied from docs/results.md",
    "recorded_seeds": "the seeds of the recorded figures",
    "source": "where in docs/results.md the recorded figures are",
    "holds": "rule on the arms' means (and KEY_std) under which the claim holds",
    "partial": "weaker rule under which it holds in part",
    "show": "expressions shown beside the status (differences, ratios)",
    "status": f"only for claims without figures: one of {', '.join(FIXED_STATUSES)}",
    "reason": "why a claim has no figures",
    "scale_downs": "how the runs differ from the paper's",
    "commands": "the commands that made the runs",
    "notes": "more, for the details section",
    "paper_config": "the paper-scale config, for the paper-scale column",
    "paper_scale": "an optional second measurement at the paper's scale (GPU): runs/recorded/source/commands/...",
    "section": "the table the row stands in: one of '', 'peer tables', 'label-skew family' (default '')",
}
SECTIONS = {
    "": "",
    "peer tables": "Rows from a peer's published table, run in the peer's setting: the peer's number is the "
    "paper's column, and a rule judges the order of the methods or a gap between them, not absolute accuracy.",
    "label-skew family": "The label-skew methods in the FedAF paper's setting (Fashion-MNIST, 10 clients, "
    "Dirichlet 0.02, the ConvNet) at the scale of `experiments/fedaf/fmnist_quick.toml`, beside FedAvg, FedDM and "
    "FedAF. Each paper claims a gain over FedAvg under strong label skew; each rule was written before the runs "
    "(issue 48, point 4) and judges the direction on the mean best accuracy over the seeds archived.",
}
"""The page's tables: the papers' claims (``""``), then each further section under its heading, with its text."""
MEASUREMENT_KEYS = ("runs", "recorded", "recorded_seeds", "source", "scale_downs", "commands", "notes")
"""The keys a ``paper_scale`` table may hold (it shares the claim's labels, metric and rules)."""


def _error(where: str, message: str) -> FedskewError:
    return FedskewError(f"{where}: {message}")


# ---- rules: a small, safe expression language over the arms' means ---------------------------------------

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"abs": abs, "min": min, "max": max}


def rule_names(expression: str, where: str) -> set[str]:
    """The variable names of a rule, after checking that it uses only what :func:`evaluate` allows."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise _error(where, f"rule {expression!r} is not a valid expression") from None
    names = set()
    allowed = (
        ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
        ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Call, *_BINARY, *_COMPARE,
    )  # fmt: skip
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise _error(where, f"rule {expression!r} uses {type(node).__name__}; allowed: arm names, numbers, "
                         "+ - * /, comparisons, and/or/not, abs/min/max")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise _error(where, f"rule {expression!r} holds {node.value!r}; only numbers are allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
            raise _error(where, f"rule {expression!r} calls something other than abs, min or max")
        if isinstance(node, ast.Name) and node.id not in _FUNCTIONS:
            names.add(node.id)
    return names


def evaluate(expression: str, env: dict[str, float]) -> Any:
    """The value of a rule checked by :func:`rule_names`, with ``env`` giving every name's value."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BoolOp):
            values = [bool(ev(v)) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            return not value if isinstance(node.op, ast.Not) else (-value if isinstance(node.op, ast.USub) else value)
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = ev(right_node)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # rule_names refuses it first

    return ev(ast.parse(expression, mode="eval"))


# ---- the manifest ----------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """The figures of one claim at one scale: archived runs and/or figures recorded from docs/results.md."""

    runs: dict[str, str] = field(default_factory=dict)
    recorded: dict[str, str] = field(default_factory=dict)
    recorded_seeds: list[int] = field(default_factory=list)
    source: str = ""
    scale_downs: str = ""
    commands: list[str] = field(default_factory=list)
    notes: str = ""


@dataclass
class Claim:
    """One row of docs/fidelity.md, as the manifest states it (see :data:`CLAIM_KEYS`)."""

    id: str
    paper: str
    ref: str
    claim: str
    paper_number: str
    measure: str = ""
    metric: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    measured: Measurement = field(default_factory=Measurement)
    holds: str = ""
    partial: str = ""
    show: list[str] = field(default_factory=list)
    status: str = ""
    reason: str = ""
    paper_config: str = ""
    paper_scale: Measurement | None = None
    section: str = ""


@dataclass
class Manifest:
    claims: list[Claim]
    coverage: list[dict[str, Any]]


def _strings(table: Any, where: str, key: str) -> dict[str, str]:
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise _error(where, f"{key} must be a table of strings, got {table!r}")
    return dict(table)


def _measurement(table: dict[str, Any], where: str) -> Measurement:
    seeds = table.get("recorded_seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise _error(where, f"recorded_seeds must be a list of integers, got {seeds!r}")
    commands = table.get("commands", [])
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise _error(where, f"commands must be a list of strings, got {commands!r}")
    return Measurement(
        runs=_strings(table.get("runs", {}), where, "runs"),
        recorded=_strings(table.get("recorded", {}), where, "recorded"),
        recorded_seeds=seeds,
        source=str(table.get("source", "")),
        scale_downs=str(table.get("scale_downs", "")),
        commands=commands,
        notes=str(table.get("notes", "")),
    )


def _check_arms(claim: Claim, m: Measurement, where: str) -> None:
    arms = set(claim.labels)
    both = set(m.runs) & set(m.recorded)
    if both:
        raise _error(where, f"arm {sorted(both)[0]!r} has both runs and a recorded figure; give one")
    given = set(m.runs) | set(m.recorded)
    if given != arms:
        missing, extra = sorted(arms - given), sorted(given - arms)
        raise _error(where, f"every arm in labels needs runs or a recorded figure (missing: {missing}, "
                     f"not in labels: {extra})")
    for key, value in m.recorded.items():
        parse_recorded(value, f"{where}, recorded.{key}")
    if m.recorded and not (m.source and m.recorded_seeds):
        raise _error(where, "recorded figures need a source (the section of docs/results.md) and recorded_seeds")
    if m.runs and not claim.metric:
        raise _error(where, "archived runs need a metric (a column of comparison_table)")
    for key, pattern in m.runs.items():
        if Path(pattern).is_absolute() or not pattern.startswith("results/"):
            raise _error(where, f"runs.{key} = {pattern!r} must be a glob under results/ (relative)")


def _claim(table: Any, index: int) -> Claim:
    where = f"claims[{index}]"
    if not isinstance(table, dict):
        raise _error(where, "must be a table")
    where = f"claim {table.get('id', index)!r}"
    unknown = sorted(set(table) - set(CLAIM_KEYS))
    if unknown:
        raise _error(where, f"unknown key {unknown[0]!r}; allowed: {', '.join(CLAIM_KEYS)}")
    for key in ("id", "paper", "ref", "claim", "paper_number"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise _error(where, f"{key} must be a non-empty string")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", table["id"]):
        raise _error(where, "id must be lower case letters and digits joined by dashes")
    show = table.get("show", [])
    if not isinstance(show, list) or not all(isinstance(s, str) for s in show):
        raise _error(where, f"show must be a list of strings, got {show!r}")
    claim = Claim(
        id=table["id"],
        paper=table["paper"],
        ref=table["ref"],
        claim=table["claim"],
        paper_number=table["paper_number"],
        measure=str(table.get("measure", "")),
        metric=str(table.get("metric", "")),
        labels=_strings(table.get("labels", {}), where, "labels"),
        measured=_measurement(table, where),
        holds=str(table.get("holds", "")),
        partial=str(table.get("partial", "")),
        show=show,
        status=str(table.get("status", "")),
        reason=str(table.get("reason", "")),
        paper_config=str(table.get("paper_config", "")),
        section=str(table.get("section", "")),
    )
    if claim.section not in SECTIONS:
        raise _error(where, f"section = {claim.section!r}; allowed: {', '.join(repr(s) for s in SECTIONS)}")
    if "paper_scale" in table:
        ps = table["paper_scale"]
        if not isinstance(ps, dict) or set(ps) - set(MEASUREMENT_KEYS):
            raise _error(where, f"paper_scale must be a table of {', '.join(MEASUREMENT_KEYS)}")
        claim.paper_scale = _measurement(ps, f"{where}, paper_scale")
    if claim.status:
        if claim.status not in FIXED_STATUSES or not claim.reason:
            raise _error(where, f"status = {claim.status!r}: a claim may state only {' or '.join(FIXED_STATUSES)}, "
                         "with a reason; other statuses follow from its figures")
        if claim.labels or claim.measured.runs or claim.measured.recorded:
            raise _error(where, "a claim with a stated status has no figures; remove labels, runs and recorded")
        return claim
    if not claim.labels or not claim.holds or not claim.measure:
        raise _error(where, "a claim needs labels, measure and a holds rule (or a status with a reason)")
    names = set(claim.labels) | {f"{k}_std" for k in claim.labels}
    for key in claim.labels:
        if not key.isidentifier():
            raise _error(where, f"arm key {key!r} must be a name (letters, digits, _), as rules use it")
    for expression in [claim.holds, claim.partial, *claim.show]:
        if expression:
            unknown_names = rule_names(expression, where) - names
            if unknown_names:
                raise _error(where, f"rule {expression!r} names {sorted(unknown_names)[0]!r}, not an arm; "
                             f"arms: {', '.join(claim.labels)}")
    _check_arms(claim, claim.measured, where)
    if claim.paper_scale is not None:
        _check_arms(claim, claim.paper_scale, f"{where}, paper_scale")
    return claim


def load_manifest(path: Path) -> Manifest:
    """Read and check the manifest: every problem is one line naming the claim and the key."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None
    unknown = sorted(set(data) - {"claims", "coverage"})
    if unknown:
        raise FedskewError(f"{path}: unknown top-level key {unknown[0]!r}; allowed: claims, coverage")
    claims = [_claim(t, i) for i, t in enumerate(data.get("claims", []))]
    ids = [c.id for c in claims]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise FedskewError(f"{path}: claim id {duplicated[0]!r} is used more than once")
    coverage = data.get("coverage", [])
    for entry in coverage:
        if not isinstance(entry, dict) or not isinstance(entry.get("spec"), str) or not isinstance(
            entry.get("rows"), list
        ):
            raise FedskewError(f"{path}: a coverage entry needs spec (a string) and rows (claim ids), got {entry!r}")
        missing = [r for r in entry["rows"] if r not in ids]
        if missing or not entry["rows"]:
            raise FedskewError(f"{path}: coverage {entry['spec']!r} names no row or a missing one: {missing}")
    return Manifest(claims, coverage)


# ---- figures ---------------------------------------------------------------------------------------------

_RECORDED = re.compile(r"([+-]?\d[\d,]*(?:\.\d+)?)(?:\s*±\s*(\d[\d,]*(?:\.\d+)?))?")


def parse_recorded(text: str, where: str) -> tuple[float, float | None]:
    """``"40.39 ± 1.05"`` -> (40.39, 1.05); ``"2,143"`` -> (2143.0, None)."""
    match = _RECORDED.fullmatch(text.strip())
    if not match:
        raise _error(where, f"{text!r} is not a figure; write MEAN or MEAN ± STD as docs/results.md has it")
    std = match[2]
    return float(match[1].replace(",", "")), (float(std.replace(",", "")) if std else None)


@dataclass
class Figure:
    """One arm's figure: mean (and std) as shown, the seeds, and where it came from."""

    mean: float
    std: float | None
    text: str
    seeds: list[int]
    recorded: bool
    folders: list[str] = field(default_factory=list)


def _digits(metric: str) -> int:
    return 5 if metric == "class_var" else 3 if metric.startswith("mb_") else 1 if metric == "rounds_to_target" else 2


def archived_figure(claim: Claim, key: str, pattern: str, root: Path) -> Figure | None:
    """Mean +- std over the finished runs matching ``pattern`` (None if none has finished)."""
    folders = sorted(p for p in root.glob(pattern) if (p / SUMMARY_FILE).is_file())
    if not folders:
        return None
    runs = [dataclasses.replace(load_run(p), label=claim.labels[key]) for p in folders]
    row = comparison_table(separate_experiments(runs))[0]
    if row.get(claim.metric) is None:
        columns = ", ".join(k for k, v in row.items() if isinstance(v, float) and not k.endswith("_std"))
        raise FedskewError(f"claim {claim.id!r}: metric {claim.metric!r} is not a column of the runs' table; "
                           f"columns: {columns}")
    mean, std = float(row[claim.metric]), row.get(f"{claim.metric}_std")
    digits = _digits(claim.metric)
    text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    seeds = sorted(int(r.summary["seed"]) for r in runs if isinstance(r.summary.get("seed"), int))
    return Figure(mean, std, text, seeds, recorded=False, folders=[p.relative_to(root).as_posix() for p in folders])


def figures(claim: Claim, m: Measurement, root: Path) -> tuple[dict[str, Figure], list[str]]:
    """Every arm's figure in label order, and the globs that matched no finished run."""
    found: dict[str, Figure] = {}
    missing = []
    for key in claim.labels:
        if key in m.recorded:
            mean, std = parse_recorded(m.recorded[key], claim.id)
            found[key] = Figure(mean, std, m.recorded[key].strip(), m.recorded_seeds, recorded=True)
        else:
            figure = archived_figure(claim, key, m.runs[key], root)
            if figure is None:
                missing.append(m.runs[key])
            else:
                found[key] = figure
    return found, missing


@dataclass
class Verdict:
    status: str
    detail: str


def verdict(claim: Claim, found: dict[str, Figure], missing: list[str]) -> Verdict:
    """The status the rules give on the figures' means (``not run yet`` while an arm has no finished run)."""
    if missing:
        return Verdict(NOT_RUN, "no finished run matches " + ", ".join(f"`{p}`" for p in missing))
    env: dict[str, float] = {}
    for key, fig in found.items():
        env[key] = fig.mean
        if fig.std is not None:
            env[f"{key}_std"] = fig.std
    for expression in filter(None, [claim.holds, claim.partial, *claim.show]):
        needs_std = {n for n in rule_names(expression, claim.id) if n.endswith("_std")} - set(env)
        if needs_std:
            raise FedskewError(f"claim {claim.id!r}: rule {expression!r} needs {sorted(needs_std)[0]}, but that arm "
                               "has a single seed")
    if evaluate(claim.holds, env):
        status = HOLDS
    elif claim.partial and evaluate(claim.partial, env):
        status = PARTIAL
    else:
        status = DOES_NOT_HOLD
    rule = f"holds if `{claim.holds}`" + (f"; partial if `{claim.partial}`" if claim.partial else "")
    shown = [f"`{s}` = {evaluate(s, env):.2f}" for s in claim.show]
    return Verdict(status, "<br>".join([rule, *shown]))


# ---- the page --------------------------------------------------------------------------------------------

INTRO = f"""\
# Fidelity: the papers' headline claims against fedskew's runs

<!-- Generated by benchmarks/fidelity_table.py from benchmarks/fidelity_claims.toml and results/; do not edit.
     Regenerate: {REGENERATE} -->

One row per headline claim of the four papers (`shared/SPEC.md`): the paper's number, fedskew's
measurement (mean ± sample std over seeds), how the runs were scaled down, and a status computed from the
figures by the rule in the row. The page is generated: `{REGENERATE}` rebuilds it from
`benchmarks/fidelity_claims.toml` and the run folders archived under `results/` (`config.toml`,
`metrics.jsonl`, `summary.json` of each run), and a test fails when it differs; figures marked *recorded*
are copied from docs/results.md because their run folders were not kept. The four papers' runs are scaled
down to fit this project's 2-core CPU machine (fewer rounds, condensation steps and seeds, smaller models or
training sets, CIFAR-10 (JPEG) for CIFAR-10, Fashion-MNIST for MNIST) while keeping the paper's protocol
otherwise, so a rule judges the claim's direction and, where one is named, a reduced-scale size, not the
paper's absolute accuracies. Rows whose scale-downs say "none" (the NIID-Bench peer rows) ran in the paper's
own setting; their "paper scale" column points back to the measurement, and they differ from the paper in
seeds and random streams only.

Status: **{HOLDS}** (the rule's `holds` condition is met by the means), **{PARTIAL}** (only its weaker
`partial` condition), **{DOES_NOT_HOLD}**, **{NOT_RUN}** (measurable here, no finished run) or
**{NOT_MEASURABLE}** (with the reason). Rules name the arms by the keys in brackets. Commands, sources and
notes for each row follow the table.
"""

HEADER = ["claim", "paper", "paper's number", "fedskew (mean ± std, seeds)", "scale-downs", "status", "paper scale"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _seeds(seeds: list[int]) -> str:
    if not seeds:
        return "seeds unknown"
    return f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}: {', '.join(map(str, seeds))}"


def _figures_cell(claim: Claim, found: dict[str, Figure], m: Measurement) -> str:
    lines = []
    for key, label in claim.labels.items():
        fig = found.get(key)
        if fig is None:
            lines.append(f"{label} [{key}]: no finished run in `{m.runs[key]}`")
            continue
        origin = "recorded" if fig.recorded else "archived runs"
        lines.append(f"{label} [{key}]: **{fig.text}** ({_seeds(fig.seeds)}; {origin})")
    lines.append(claim.measure)
    if any(f.recorded for f in found.values()):
        lines.append(RECORDED_NOTE)
    return "<br>".join(_cell(x) for x in lines)


@dataclass
class Row:
    claim: Claim
    found: dict[str, Figure]
    missing: list[str]
    verdict: Verdict
    paper_scale: tuple[dict[str, Figure], list[str], Verdict] | None


def build_rows(manifest: Manifest, root: Path) -> list[Row]:
    """Every claim's figures and verdict, reading the archived runs under ``root``."""
    rows = []
    for claim in manifest.claims:
        if claim.status:
            rows.append(Row(claim, {}, [], Verdict(claim.status, claim.reason), None))
            continue
        found, missing = figures(claim, claim.measured, root)
        paper_scale = None
        if claim.paper_scale is not None:
            ps_found, ps_missing = figures(claim, claim.paper_scale, root)
            paper_scale = (ps_found, ps_missing, verdict(claim, ps_found, ps_missing))
        rows.append(Row(claim, found, missing, verdict(claim, found, missing), paper_scale))
    return rows


def _at_paper_scale(c: Claim) -> bool:
    """Whether the claim's own measurement is already at the paper's scale (its scale-downs say "none")."""
    return c.measured.scale_downs.strip().lower().startswith("none")


def _table_row(row: Row) -> str:
    c = row.claim
    measured = f"— ({c.status})" if c.status else _figures_cell(c, row.found, c.measured)
    status = f"**{row.verdict.status}**<br>{_cell(row.verdict.detail)}"
    if row.paper_scale is None and _at_paper_scale(c):
        paper_scale = "the measured column (no scale-down)"
    elif row.paper_scale is None:
        paper_scale = "not run" + (f" (`{c.paper_config}`)" if c.paper_config else "")
    else:
        assert c.paper_scale is not None
        found, _, v = row.paper_scale
        paper_scale = _figures_cell(c, found, c.paper_scale) + f"<br>**{v.status}**"
    cells = [
        f"[{c.id}](#{c.id}): {_cell(c.claim)}",
        _cell(f"{c.paper}, {c.ref}"),
        _cell(c.paper_number),
        measured,
        _cell(c.measured.scale_downs) or "—",
        status,
        paper_scale,
    ]
    return "| " + " | ".join(cells) + " |"


def _details(row: Row) -> list[str]:
    c = row.claim
    out = [f"### {c.id}", "", f"{c.paper}, {c.ref}: {c.claim}", ""]
    for title, m, found in [("Measured", c.measured, row.found)] + (
        [("Paper scale", c.paper_scale, row.paper_scale[0])] if c.paper_scale and row.paper_scale else []
    ):
        if m.recorded:
            out.append(f"- {title}, recorded from {m.source}: " + ", ".join(c.labels[k] for k in m.recorded) + ".")
        for key, pattern in m.runs.items():
            fig = found.get(key)
            used = ", ".join(f"`{f}`" for f in fig.folders) if fig else "none finished yet"
            out.append(f"- {title}, {c.labels[key]}: archived runs `{pattern}` ({used}).")
        if m.commands:
            out += ["", "```bash", *m.commands, "```", ""]
        if m.notes:
            out += [" ".join(m.notes.split()), ""]
    if c.status:
        out += [f"Status: **{c.status}**. {' '.join(c.reason.split())}", ""]
    if out[-1] != "":
        out.append("")
    return out


def render(manifest: Manifest, root: Path) -> str:
    """The whole page."""
    rows = build_rows(manifest, root)
    lines = [INTRO]
    for section, text in SECTIONS.items():
        these = [r for r in rows if r.claim.section == section]
        if not these:
            continue
        if section:
            lines += ["", f"## {section[0].upper()}{section[1:]}", "", text, ""]
        lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += [_table_row(r) for r in these]
    counts = {s: sum(r.verdict.status == s for r in rows) for s in (HOLDS, PARTIAL, DOES_NOT_HOLD, NOT_RUN,
                                                                    NOT_MEASURABLE)}
    recorded = sum(any(f.recorded for f in r.found.values()) for r in rows)
    archived = sum(any(not f.recorded for f in r.found.values()) for r in rows)
    lines += [
        "",
        f"{len(rows)} claims: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f". Rows with recorded "
        f"figures: {recorded}; rows with figures computed from archived runs: {archived}.",
        "",
        "## SPEC.md's claims and their rows",
        "",
    ]
    lines += [f"- {e['spec']}: " + ", ".join(f"[{r}](#{r})" for r in e["rows"]) for e in manifest.coverage]
    lines += ["", "## Commands, sources and notes", ""]
    for r in rows:
        lines += _details(r)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the page here (e.g. docs/fidelity.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page (--out, default docs/fidelity.md) "
                        "differs from what would be generated")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the claims (default: %(default)s)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder the runs' globs start from (the "
                        "repository root)")
    args = parser.parse_args(argv)
    try:
        text = render(load_manifest(args.manifest), args.root)
    except FedskewError as e:
        print(f"fidelity_table.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        page = args.out or DOC
        current = page.read_text(encoding="utf-8") if page.is_file() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(page), "generated", lineterm="")
            print("\n".join(list(diff)[:40]))
            print(f"{page} is out of date: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
