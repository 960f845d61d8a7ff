"""The experiment configs shipped in ``experiments/`` resolve and validate without loading data.

docs/results.md gives commands on these files; a renamed parameter or a mistyped key in one of them
would otherwise surface only when somebody starts a long run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import RunSpec, parse_overrides, read_config, resolve

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
CONFIGS = sorted(EXPERIMENTS.rglob("*.toml"))


def test_the_experiments_folder_is_found() -> None:
    assert len(CONFIGS) >= 10, f"expected the shipped experiment configs under {EXPERIMENTS}"


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(EXPERIMENTS)) for p in CONFIGS])
def test_config_resolves_and_validates(path: Path) -> None:
    raw = read_config(path)
    runs = resolve(raw, where=str(path))  # validate() runs on every (variant, seed)
    assert runs, f"{path} expands to no runs"
    assert isinstance(raw.get("name"), str) and raw["name"], f"{path} has no name"
    labels = {r.label for r in runs}
    assert len(labels) == len(raw.get("variants") or [{}])


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem.endswith("_quick")], ids=lambda p: p.stem)
def test_each_quick_config_has_its_paper_scale_config_beside_it(path: Path) -> None:
    paper = path.with_name(path.name.replace("_quick.toml", "_paper.toml"))
    assert paper.is_file(), f"{path.name} has no {paper.name} beside it"
    assert paper in CONFIGS  # so test_config_resolves_and_validates covers it


@pytest.mark.parametrize("dataset", ["cifar10", "fmnist"])
def test_fedaf_quick_configs_hold_the_table_4_ablations(dataset: str) -> None:
    raw = read_config(EXPERIMENTS / "fedaf" / f"{dataset}_quick.toml")
    runs = {r.label: r.config["algorithm"] for r in resolve(raw) if r.config["seed"] == 0}
    assert set(runs) == {"FedAvg", "FedDM", "FedAF", "FedAF w/o CDC", "FedAF w/o LGKM"}
    assert runs["FedAF"]["name"] == runs["FedAF w/o CDC"]["name"] == runs["FedAF w/o LGKM"]["name"] == "fedaf"
    assert runs["FedAF w/o CDC"]["use_cdc"] is False and runs["FedAF w/o CDC"].get("use_lgkm", True) is True
    assert runs["FedAF w/o LGKM"]["use_lgkm"] is False and runs["FedAF w/o LGKM"].get("use_cdc", True) is True
    # The commands in docs/results.md: an alpha override reaches every variant.
    with_alpha = resolve(raw, parse_overrides(["partition.alpha=0.1"]))
    alphas = {r.config["partition"]["alpha"] for r in with_alpha}
    assert alphas == {0.1}


def assert_quick_config_plus(derived: str, quick: str, overrides: list[str], left_out: set[str]) -> list[RunSpec]:
    """The runs of ``derived`` are exactly those of ``quick`` with ``overrides``, minus the ``left_out`` labels.

    docs/results.md reports such configs' runs as the quick config plus overrides; if the two drift
    apart, the numbers in the docs are not the ones the derived config makes. Returns its runs.
    """
    runs = resolve(read_config(EXPERIMENTS / derived))
    quick_by_key = {
        (r.label, r.config["seed"]): r.config
        for r in resolve(read_config(EXPERIMENTS / quick), parse_overrides(overrides))
    }
    assert {(r.label, r.config["seed"]) for r in runs} == {k for k in quick_by_key if k[0] not in left_out}
    for run in runs:
        other = quick_by_key[(run.label, run.config["seed"])]
        differing = {k for k in run.config if run.config[k] != other.get(k)}
        assert differing == {"name", "description"}, (run.label, differing)
    return runs


def test_fedaf_fmnist_k200_config_is_the_quick_config_with_200_steps() -> None:
    runs = assert_quick_config_plus(
        "fedaf/fmnist_k200.toml", "fedaf/fmnist_quick.toml", ["algorithm.condense_iterations=200"],
        left_out={"FedAF w/o CDC", "FedAF w/o LGKM"},
    )
    for run in runs:
        if run.label != "FedAvg":  # FedAvg's resolved config has no condensation parameters
            assert run.config["algorithm"]["condense_iterations"] == 200


def test_feddc_k100_config_is_the_quick_config_with_batch_16_and_k_100() -> None:
    runs = assert_quick_config_plus(
        "feddc/cifar10_k100.toml", "feddc/cifar10_quick.toml",
        ["algorithm.batch_size=16", "algorithm.condense_iterations=100"], left_out={"FedDC+"},
    )
    for run in runs:
        assert run.config["algorithm"]["batch_size"] == 16


def niid_bench_header_overrides(path: Path) -> dict[str, list[str]]:
    """The partition overrides the header of ``path`` documents, by partition (``#C=1`` ... ``p_k ~ Dir(0.5)``)."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        body = line.removeprefix("#").strip()
        key, _, command = body.partition(":")
        if key in {"#C=1", "#C=2", "#C=3", "p_k ~ Dir(0.5)"} and "fedskew run" in command:
            found[key] = command.split("fmnist.toml", 1)[1].split()
    return found


def test_niid_bench_fmnist_header_commands_give_the_papers_partitions() -> None:
    path = EXPERIMENTS / "niid_bench" / "fmnist.toml"
    commands = niid_bench_header_overrides(path)
    assert set(commands) == {"#C=1", "#C=2", "#C=3", "p_k ~ Dir(0.5)"}
    raw = read_config(path)
    for key, words in commands.items():
        runs = resolve(raw, parse_overrides(words))
        assert {r.label for r in runs} == {"FedAvg", "FedProx", "SCAFFOLD", "FedNova"}
        for run in runs:
            part = {k: v for k, v in run.config["partition"].items() if k not in {"seed", "client_test_fraction"}}
            if key.startswith("#C="):
                expected = {"name": "classes_per_client", "num_clients": 10, "classes": int(key[-1]),
                            "assignment": "niid_bench"}
            else:
                expected = {"name": "dirichlet", "num_clients": 10, "alpha": 0.5, "min_size": 10}
            assert part == expected, (key, run.label, part)
            assert run.config["partition"].get("seed") is None  # each seed redraws the partition, as NIID-Bench's
            algo = run.config["algorithm"]
            assert (algo["clients_per_round"], algo["local_epochs"], algo["batch_size"]) == (10, 10, 64)
            assert (algo["lr"], algo["momentum"], algo["weight_decay"]) == (0.01, 0.9, 1e-5)
            assert run.config["rounds"] == 50 and run.config["model"]["name"] == "cnn"
    scaffold = next(r for r in resolve(raw) if r.label == "SCAFFOLD").config["algorithm"]
    assert (scaffold["correction"], scaffold["weighting"]) == ("weights", "samples")
    # FedProx runs fedprox's default mu, 0.01; the header's sweep over NIID-Bench's four values applies to it.
    assert ALGORITHMS.get("fedprox").Params.__dataclass_fields__["mu"].default == 0.01
    swept = resolve(raw, parse_overrides(["algorithm.mu=[0.001,0.01,0.1,1]"]))
    mus = sorted(r.config["algorithm"]["mu"] for r in swept if r.config["algorithm"]["name"] == "fedprox")
    assert mus == sorted([0.001, 0.01, 0.1, 1.0] * 3)


def test_niid_bench_label_skew_config_is_fmnist_at_c2_with_the_eight_methods() -> None:
    raw = read_config(EXPERIMENTS / "niid_bench" / "fmnist_label_skew.toml")
    everything = resolve(raw)
    assert {r.config["seed"] for r in everything} == {0, 1, 2}
    runs = {r.label: r.config for r in everything if r.config["seed"] == 0}
    names = {cfg["algorithm"]["name"] for cfg in runs.values()}
    assert names == {"fedlc", "fedrs", "fedntd", "fedrod", "ccvr", "feddecorr", "fedetf", "feddc_drift"}
    c2 = niid_bench_header_overrides(EXPERIMENTS / "niid_bench" / "fmnist.toml")["#C=2"]
    fedavg = next(r for r in resolve(read_config(EXPERIMENTS / "niid_bench" / "fmnist.toml"), parse_overrides(c2))
                  if r.label == "FedAvg" and r.config["seed"] == 0).config
    shared = ("batch_size", "lr", "momentum", "weight_decay", "local_epochs", "clients_per_round")
    for label, cfg in runs.items():
        assert cfg["partition"] == fedavg["partition"], label
        for key in ("dataset", "model", "rounds"):
            assert cfg[key] == fedavg[key], (label, key)
        differing = {k for k in shared if cfg["algorithm"][k] != fedavg["algorithm"][k]}
        assert differing == ({"momentum"} if cfg["algorithm"]["name"] == "feddc_drift" else set()), label
