"""Issue 44, the fourth reliability pass: grids never run something other than what they say (failures 1 to 6
and 11 to 13). Each failure's reproducer is its test's input, on the issue's synthetic config (``syn.toml``: 4
clients, 200 images of 8x8, FedAvg, 2 rounds); :func:`test_each_run_is_the_grid_point_its_label_names` is the
rule around them, for every kind of swept key.

The rules are :mod:`fedskew.config.grid`'s (docs/reliability.md, "The fourth pass (issue 44): grids"). Most
tests resolve configs directly (fast); two run ``fedskew`` as a separate process, as a user does.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from fedskew.api import plan, select_labels
from fedskew.config import dump, read_config, resolve
from fedskew.config.grid import MAX_GRID_RUNS, shown_value
from fedskew.config.schema import full_config
from fedskew.config.variants import config_value
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.runs import check_label
from tests.helpers.cli import fedskew, one_error
from tests.helpers.configs import tiny_config


def syn(**over: Any) -> dict[str, Any]:
    """The issue's ``syn.toml``: 4 clients, 200 synthetic images of 8x8, FedAvg, 2 rounds (as a parsed file)."""
    cfg = tiny_config(rounds=2, dataset={"num_train": 200}, partition={"num_clients": 4}, **over)
    cfg.pop("label")
    cfg["seeds"] = [0]
    return cfg


def write_syn(path: Path, **over: Any) -> Path:
    path.write_text(dump(syn(**over)))
    return path


TWO_VARIANTS = [{"label": "FedAvg"}, {"label": "Centralised", "algorithm.name": "centralized"}]
"""The default experiment's variants: one runs the config's method, one names its own."""


def runs_of(raw: dict[str, Any], overrides: dict[str, Any] | None = None) -> list[tuple[str, str, int]]:
    """(label, method, seed) of each run."""
    return [(r.label, r.config["algorithm"]["name"], r.config["seed"]) for r in resolve(raw, overrides or {})]


# ---- 1. a grid over algorithm.name runs each named method --------------------------------------------------
def test_a_grid_over_the_method_runs_each_named_method() -> None:
    """`fedskew run syn2.toml rounds=1 'algorithm.name=["ditto","apfl"]'` ran one `fedavg-seed0`."""
    expected = [("ditto", "ditto", 0), ("apfl", "apfl", 0)]
    assert runs_of(syn(), {"rounds": 1, "algorithm.name": ["ditto", "apfl"]}) == expected
    assert runs_of({**syn(), "sweep": {"algorithm.name": ["ditto", "apfl"]}}) == expected


def test_a_grid_over_the_method_keeps_the_variants() -> None:
    """The config's other variants are not dropped: a variant that runs the config's method is swept over the
    method; one that names its own method keeps it (its label says so), as a variant keeps any key it sets."""
    raw = {**syn(), "variants": TWO_VARIANTS}
    expected = [("FedAvg, algorithm=ditto", "ditto", 0), ("FedAvg, algorithm=apfl", "apfl", 0),
                ("Centralised", "centralized", 0)]
    assert runs_of(raw, {"algorithm.name": ["ditto", "apfl"]}) == expected
    assert runs_of({**raw, "sweep": {"algorithm.name": ["ditto", "apfl"]}}) == expected
    # The method's own options follow it: mu goes to the FedProx points only.
    runs = resolve({**raw, "sweep": {"algorithm.name": ["ditto", "fedprox"], "algorithm.mu": [0.1, 0.2]}})
    assert [(r.label, r.config["algorithm"].get("mu")) for r in runs] == [
        ("FedAvg, algorithm=ditto", None), ("FedAvg, algorithm=fedprox, mu=0.1", 0.1),
        ("FedAvg, algorithm=fedprox, mu=0.2", 0.2), ("Centralised", None)]
    # A grid over the method that no variant takes (each names its own) is refused, not ignored.
    own = {**syn(), "variants": [{"label": "P", "algorithm.name": "fedprox"}, TWO_VARIANTS[1]]}
    with pytest.raises(ConfigError, match=r"sweeps algorithm\.name, but every variant sets it itself \(P, Cent"):
        resolve(own, {"algorithm.name": ["ditto", "apfl"]})


def test_a_single_method_on_the_command_line_still_replaces_the_variants() -> None:
    """Unchanged and documented: `algorithm.name=ditto` (one value, no [sweep] of it) is one run of ditto."""
    assert runs_of({**syn(), "variants": TWO_VARIANTS}, {"algorithm.name": "ditto"}) == [("ditto", "ditto", 0)]


# ---- 2. a plain override of a swept key -----------------------------------------------------------------------
def test_a_plain_override_of_a_swept_key_is_a_grid_of_that_value() -> None:
    """`[sweep] "partition.alpha" = [0.1, 0.5]` run with `partition.alpha=0.9` made two runs labelled 0.1 and 0.5,
    both run with 0.9. The command line replaces the sweep's values: one run, labelled and run with 0.9."""
    raw = {**syn(), "sweep": {"partition.alpha": [0.1, 0.5]}}
    runs = resolve(raw, {"partition.alpha": 0.9})
    assert [(r.label, r.config["partition"]["alpha"]) for r in runs] == [("fedavg, alpha=0.9", 0.9)]
    # A list on the command line replaces the sweep's list in the same way.
    runs = resolve(raw, {"partition.alpha": [0.3, 0.7]})
    assert [(r.label, r.config["partition"]["alpha"]) for r in runs] == [
        ("fedavg, alpha=0.3", 0.3), ("fedavg, alpha=0.7", 0.7)]
    # A value of the grid picks its point: the same label and folder as in the whole grid.
    whole = {r.folder_name for r in resolve(raw)}
    assert {r.folder_name for r in resolve(raw, {"partition.alpha": 0.5})} <= whole


# ---- 3. a swept key that no run has ------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["command line", "sweep"])
@pytest.mark.parametrize("key, needle", [
    ("algorithm.bogus", r"no run's algorithm \(fedavg\) has the option 'bogus'; fedavg's options: clients_per_round"),
    ("partition.alhpa", r"no run's partitioner \(dirichlet\) has the option 'alhpa'"),
    ("model.hiden", r"no run's model \(mlp\) has the option 'hiden'"),
    ("faults.dropuot", r"unknown key 'faults.dropuot'"),
    ("roundz", r"unknown config key 'roundz'"),
])
def test_a_swept_key_that_no_run_has_is_refused(source: str, key: str, needle: str) -> None:
    """`'algorithm.bogus=[1,2]'` (or a [sweep] with a typo) was one plain run; the same key with one value is
    refused, and so is the grid now."""
    if source == "sweep":
        raw, overrides = {**syn(), "sweep": {key: [1, 2]}}, {}
    else:
        raw, overrides = syn(), {key: [1, 2]}
    with pytest.raises(ConfigError, match=needle):
        resolve(raw, overrides)


def test_a_key_swept_where_some_variants_lack_it_goes_to_the_others() -> None:
    """The rule behind failure 3: a key applies to the runs whose component has it (an IID partition has no alpha)
    and to those that do not set it themselves; refused only where it applies to no run."""
    raw = {**syn(), "variants": [{"label": "IID", "partition.name": "iid"}, {"label": "Dir"}]}
    runs = resolve(raw, {"partition.alpha": [0.1, 0.3]})
    assert [(r.label, r.config["partition"].get("alpha")) for r in runs] == [
        ("IID", None), ("Dir, alpha=0.1", 0.1), ("Dir, alpha=0.3", 0.3)]
    pinned = {**syn(), "variants": [{"label": "A", "partition.alpha": 0.2}, {"label": "B"}]}
    assert [(r.label, r.config["partition"]["alpha"]) for r in resolve(pinned, {"partition.alpha": [0.1, 0.3]})] == [
        ("A", 0.2), ("B, alpha=0.1", 0.1), ("B, alpha=0.3", 0.3)]  # a variant keeps a key it sets
    with pytest.raises(ConfigError, match=r"every variant sets it itself \(A\)"):
        resolve({**syn(), "variants": [{"label": "A", "partition.alpha": 0.2}]}, {"partition.alpha": [0.1, 0.3]})


@pytest.mark.parametrize("key, needle", [
    ("label", "a grid cannot sweep label"), ("name", "a grid cannot sweep name"),
    ("algorithm", "a grid cannot sweep the whole table algorithm"), ("plugins", None),
])
def test_keys_that_cannot_be_swept_are_refused(key: str, needle: str | None) -> None:
    if needle is None:  # plugins takes a list: a list of them is the plug-ins, not a grid
        with pytest.raises(ConfigError, match="plugin"):
            resolve({**syn(), "sweep": {key: ["a.py", "b.py"]}})
        return
    with pytest.raises(ConfigError, match=needle):
        resolve({**syn(), "sweep": {key: [{"name": "x"}] if key == "algorithm" else ["x", "y"]}})


# ---- 4. --only within a grid -------------------------------------------------------------------------------
def test_only_selects_a_variant_and_all_its_grid_points(tmp_path: Path) -> None:
    """`--only LABEL` wanted every grid point's full label; a variant's label now selects all its points."""
    raw = {**syn(), "variants": TWO_VARIANTS}
    runs = resolve(raw, {"partition.alpha": [0.1, 0.5]})
    assert [r.label for r in select_labels(runs, ["FedAvg"])] == ["FedAvg, alpha=0.1", "FedAvg, alpha=0.5"]
    assert [r.label for r in select_labels(runs, ["Centralised, alpha=0.5"])] == ["Centralised, alpha=0.5"]
    assert len(select_labels(runs, ["FedAvg", "Centralised"])) == 4
    with pytest.raises(FedskewError, match=r"this config's labels: 'FedAvg', 'Centralised', or a grid point's "
                                           r"full label \(4 points, e.g. 'FedAvg, alpha=0.1'\)"):
        select_labels(runs, ["FedProx"])
    # Through plan (what `fedskew run --only` calls), with --label after it.
    kept, _ = plan(raw, {"partition.alpha": [0.1, 0.5]}, out=tmp_path / "o", only=["Centralised"],
                   label="{label} (upper bound)")
    assert [r.label for r in kept] == ["Centralised, alpha=0.1 (upper bound)", "Centralised, alpha=0.5 (upper bound)"]


# ---- 5. labels short by construction; a long one says how to name the points -----------------------------------
LONG_VARIANT = [{"label": "FedAvg with a rather long descriptive label for the paper's table"}]
THREE_KEYS = {"partition.alpha": [0.1, 0.5], "algorithm.local_epochs": [1, 2], "dataset.train_fraction": [0.5, 1.0]}


def test_an_ordinary_grid_over_three_keys_has_short_labels() -> None:
    runs = resolve({**syn(), "variants": [{"label": "FedAvg, Dirichlet skew"}]}, dict(THREE_KEYS))
    assert runs[0].label == "FedAvg, Dirichlet skew, alpha=0.1, local_epochs=1, train_fraction=0.5"
    assert len(runs) == 8 and len({r.folder_name for r in runs}) == 8
    # Two keys with one last part are told apart by a longer suffix; a table's name by the table.
    both = resolve(syn(), {"algorithm.name": "apfl", "partition.alpha": [0.1], "algorithm.alpha": [0.2, 0.3],
                           "model.name": ["mlp"]})
    assert [r.label for r in both] == ["apfl, partition.alpha=0.1, algorithm.alpha=0.2, model=mlp",
                                       "apfl, partition.alpha=0.1, algorithm.alpha=0.3, model=mlp"]


def test_a_label_too_long_names_the_sweep_and_the_way_out(tmp_path: Path) -> None:
    raw = {**syn(), "variants": LONG_VARIANT}
    with pytest.raises(ConfigError) as e:
        resolve(raw, dict(THREE_KEYS))
    line = str(e.value)
    assert "\n" not in line
    assert "sweep over partition.alpha, algorithm.local_epochs, dataset.train_fraction" in line
    assert "has 112 characters, more than 100; name the points with --label TEMPLATE" in line
    # The way out it names works: --label (after --only, which still takes the variant's own label) ...
    template = "a={partition.alpha}, e={algorithm.local_epochs}, f={dataset.train_fraction}"
    runs, _ = plan(raw, dict(THREE_KEYS), out=tmp_path / "o", only=[LONG_VARIANT[0]["label"]], label=template)
    assert [r.label for r in runs][:2] == ["a=0.1, e=1, f=0.5", "a=0.1, e=1, f=1.0"] and len(runs) == 8
    assert all(r.typed.run.label == r.label for r in runs)
    # ... and so does the label override, from which the point's label is made.
    assert resolve(raw, {**THREE_KEYS, "label": template})[7].label == "a=0.5, e=2, f=1.0"


# ---- 6. a grid's size is bounded before it is planned ------------------------------------------------------------
@pytest.mark.parametrize("count", [1000, 100])
def test_a_grid_too_big_is_refused_before_any_point_is_made(count: int) -> None:
    """1000 x 1000 values were planned for over 150 s with memory growing; 100 x 100 started 10,000 runs."""
    values = [round(0.001 * (i + 1), 6) for i in range(count)]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as e:
            resolve(syn(), {"partition.alpha": values, "algorithm.lr": values})
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"makes {count * count:_} runs" in str(e.value) and f"more than the {MAX_GRID_RUNS:_} a grid" in str(e.value)
    assert seconds < 5 and peak < 20 * 2**20, (seconds, peak)


def test_the_bound_counts_variants_and_seeds_and_allows_its_limit() -> None:
    values = [round(0.001 * (i + 1), 6) for i in range(MAX_GRID_RUNS)]
    with pytest.raises(ConfigError, match=r"makes 1_200 runs \(200 \(algorithm.lr\) values, times the variants"):
        resolve({**syn(), "seeds": [0, 1, 2], "variants": TWO_VARIANTS, "sweep": {"algorithm.lr": values[:200]}})
    assert len(resolve({**syn(), "sweep": {"algorithm.lr": values}})) == MAX_GRID_RUNS


# ---- 11. a grid over the seed ------------------------------------------------------------------------------------
def test_a_grid_over_the_seed_is_the_seeds() -> None:
    """`seed=[0,1]` was refused with a line blaming a variant that does not exist."""
    assert runs_of(syn(), {"seed": [0, 1]}) == [("fedavg", "fedavg", 0), ("fedavg", "fedavg", 1)]
    assert runs_of({**syn(), "sweep": {"seed": [3, 4]}}) == [("fedavg", "fedavg", 3), ("fedavg", "fedavg", 4)]
    assert runs_of({**syn(), "sweep": {"seeds": [3, 4]}}, {"seed": 7}) == [("fedavg", "fedavg", 7)]  # command line
    with pytest.raises(ConfigError, match=r"give seed=\[\.\.\.\] or seeds=\[\.\.\.\] on the command line, not both"):
        resolve(syn(), {"seed": [0, 1], "seeds": [2]})
    with pytest.raises(ConfigError, match=r"sweep\.seed \(the seeds\) must be a non-empty list of distinct integers"):
        resolve({**syn(), "sweep": {"seed": [0, 0]}})


# ---- 12. values compared after typing ----------------------------------------------------------------------------
@pytest.mark.parametrize("key, values", [
    ("partition.alpha", [1, 1.0]), ("partition.alpha", [0.1, 0.10]), ("rounds", [3, 3.0]),
    ("algorithm.name", ["ditto", "ditto"]), ("faults.attack", ["nan", "nan"]),
])
def test_a_value_given_twice_is_refused_after_typing(key: str, values: list[Any]) -> None:
    """`'partition.alpha=[1,1.0]'` made two identical runs under two labels."""
    with pytest.raises(ConfigError, match=f"sweep over {re.escape(key)} repeats a value"):
        resolve(syn(), {key: values})


def test_swept_values_are_typed_as_the_option_takes_them() -> None:
    runs = resolve(syn(), {"partition.alpha": [1, 0.5], "rounds": [1, 2.0]})
    assert [(r.label, r.config["partition"]["alpha"], r.config["rounds"]) for r in runs][::3] == [
        ("fedavg, alpha=1.0, rounds=1", 1.0, 1), ("fedavg, alpha=0.5, rounds=2", 0.5, 2)]
    assert type(runs[0].config["partition"]["alpha"]) is float and type(runs[1].config["rounds"]) is int
    with pytest.raises(ConfigError, match=r"partition\.alpha must be a number, got 'x'"):
        resolve(syn(), {"partition.alpha": [0.1, "x"]})


# ---- 13. invisible and bidirectional characters -----------------------------------------------------------------
HIDDEN = ["\u202e", "\u200b", "\u2066", "\ufeff", "\x85", "\u2028"]


@pytest.mark.parametrize("char", HIDDEN, ids=[f"U+{ord(c):04X}" for c in HIDDEN])
def test_labels_refuse_invisible_and_bidirectional_characters(char: str) -> None:
    """A label with U+202E or U+200B could spoof a table or report.html; two labels that print alike were two
    runs. Refused wherever a label comes from: check_label, a variant, a grid's value, --label."""
    needle = f"no control, invisible or bidirectional format characters \\(U\\+{ord(char):04X}"
    with pytest.raises(ConfigError, match=needle):
        check_label(f"FedAvg{char}x")
    with pytest.raises(ConfigError, match=needle):
        resolve({**syn(), "variants": [{"label": f"Fed{char}Avg"}]})
    with pytest.raises(ConfigError, match=needle):
        resolve({**syn(), "sweep": {"model.name": ["mlp", f"mlp{char}"]}})
    with pytest.raises(ConfigError, match=needle):
        resolve(syn(), {"label": f"{{label}}{char}"})


def test_ordinary_labels_in_any_script_pass() -> None:
    for label in ("FedAvg", "FedAF w/o CDC", "Dirichlet α=0.1", "联邦平均", "FedAvg — baseline", "مرحبا"):
        assert check_label(label) == label


# ---- the rule: for every kind of swept key, each run is the grid point its label names ------------------------
KINDS: dict[str, dict[str, list[Any]]] = {
    "algorithm.name": {"algorithm.name": ["fedavg", "fedprox", "ditto"]},
    "algorithm.param": {"algorithm.lr": [0.1, 0.05], "algorithm.mu": [0.01, 0.1]},
    "algorithm.nested": {"algorithm.aggregation.rule": ["mean", "median"]},
    "partition": {"partition.name": ["dirichlet", "iid"], "partition.alpha": [0.1, 1], "partition.num_clients": [4, 5]},
    "model": {"model.name": ["mlp", "cnn"], "model.hidden": [[16], [8, 8]]},
    "dataset": {"dataset.train_fraction": [0.5, 1]},
    "top-level": {"rounds": [1, 3], "eval_every": [1, 2], "faults.dropout": [0.0, 0.2]},
    "seed": {"seed": [0, 1]},
}
SHORT = {"algorithm.name": "algorithm", "partition.name": "partition", "model.name": "model"}
POINTS = {"algorithm.name": 3, "algorithm.param": 4, "algorithm.nested": 2, "partition": 2 * 2 + 2, "model": 2 + 1,
          "dataset": 2, "top-level": 8, "seed": 2}
"""Runs of each grid without variants: alpha and num_clients belong to the Dirichlet points, the IID ones take
num_clients alone; hidden belongs to the MLP, not the CNN."""


@pytest.mark.parametrize("where", ["sweep", "command line"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_run_is_the_grid_point_its_label_names(kind: str, where: str) -> None:
    """Each run's config (and the full config it records) holds the value its label names for every swept key,
    each applicable combination runs once, and a variant is never dropped; with and without variants."""
    grid = KINDS[kind]
    for variants in ([], [{"label": "A"}, {"label": "P", "algorithm.name": "fedavg"}]):
        base = syn(algorithm={"name": "fedprox"})  # a method with a parameter of its own (mu)
        raw = {**base, "variants": variants} if variants else base
        if where == "sweep":
            raw, overrides = {**raw, "sweep": dict(grid)}, {}
        else:
            if any(isinstance(v[0], list) for v in grid.values()):  # a key that takes a list: only in [sweep]
                continue
            overrides = dict(grid)
        runs = resolve(raw, overrides)
        if kind == "seed":
            assert sorted({r.config["seed"] for r in runs}) == [0, 1]
            assert len(runs) == 2 * max(1, len(variants))
            continue
        short = {k: SHORT.get(k, k.split(".")[-1]) for k in grid}
        keys = {name: k for k, name in short.items()}
        split = re.compile(", (?=(?:" + "|".join(map(re.escape, keys)) + ")=)")
        points = set()
        for run in runs:
            head, *parts = split.split(run.label)
            named = dict(p.split("=", 1) for p in parts)
            recorded = full_config(run.config)
            for name, text in named.items():
                key = keys[name]
                assert shown_value(config_value(run.config, key)) == text, (run.label, key)
                assert shown_value(config_value(recorded, key)) == text, (run.label, key)
            if "algorithm.name" in grid and not variants:
                assert head == run.config["algorithm"]["name"]  # no label of its own: the method it runs
            points.add((run.label, run.config["seed"]))
        assert len(points) == len(runs)  # no two runs under one label
        if not variants:
            assert len(runs) == POINTS[kind]
        assert {v["label"] for v in variants} <= {r.label.split(", ")[0] for r in runs}  # no variant dropped


# ---- end to end: `fedskew` as a process ------------------------------------------------------------------------
@pytest.mark.slow
def test_the_cli_runs_each_method_of_a_grid_under_its_label(tmp_path: Path) -> None:
    """The reproducer of failure 1, run: two runs, each recording the method its folder names."""
    cfg = write_syn(tmp_path / "syn.toml")
    res = fedskew("run", str(cfg), "rounds=1", 'algorithm.name=["ditto","apfl"]', "--out", "o", "--no-progress",
                  cwd=tmp_path)
    assert res.code == 0, res.err
    assert "fedskew: 2 run(s) -> o" in res.err
    for method in ("ditto", "apfl"):
        run = tmp_path / "o" / f"{method}-seed0"
        recorded = tomllib.loads((run / "config.toml").read_text())
        assert recorded["algorithm"]["name"] == method and recorded["label"] == method and recorded["rounds"] == 1
        assert json.loads((run / "summary.json").read_text())["algorithm"] == method


@pytest.mark.slow
def test_the_cli_refuses_a_bad_grid_in_one_line_and_writes_nothing(tmp_path: Path, inline: Any) -> None:
    """Failures 3, 6, 11 (no longer refused), 12 and 13 from the command line: exit 2, one `fedskew: error:` line,
    nothing written. One real process; the others run the same `main` in this process."""
    cfg = write_syn(tmp_path / "syn.toml")
    line = one_error(fedskew("run", str(cfg), "algorithm.bogus=[1,2]", "--out", "o", cwd=tmp_path))
    assert "sweeps algorithm.bogus, but no run's algorithm (fedavg) has the option 'bogus'" in line
    big = "[" + ",".join(str(i + 1) for i in range(1000)) + "]"
    for args, needle in [
        (("partition.alpha=[1,1.0]",), "sweep over partition.alpha repeats a value: 1 and 1.0 are both 1.0"),
        ((f"algorithm.local_epochs={big}", f"algorithm.batch_size={big}"), "makes 1_000_000 runs"),
        (("--label", "FedAvg\u202eevil"), "invisible or bidirectional format characters (U+202E"),
        (("model.name=[\"mlp\",\"mlp\u200b\"]",), "(U+200B, ZERO WIDTH SPACE)"),
        (("--only", "nope"), "--only: no run is labelled 'nope'"),
    ]:
        assert needle in one_error(inline("run", str(cfg), "rounds=1", "--out", "o", *args)), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["syn.toml"]


def test_the_default_config_keeps_its_variants_under_a_method_grid() -> None:
    """`fedskew run 'algorithm.name=["ditto","apfl"]'` on the default experiment: FedAvg's variant runs each
    method, Centralised stays."""
    assert runs_of(read_config(None), {"algorithm.name": ["ditto", "apfl"]}) == [
        ("FedAvg, algorithm=ditto", "ditto", 0), ("FedAvg, algorithm=apfl", "apfl", 0),
        ("Centralised", "centralized", 0)]
