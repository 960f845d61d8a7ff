"""One vocabulary for configured classes (issue 47): declared bounds, help text and resumability live on the classes,
and what is generated from them (the top-level keys, the resumable set) follows them; one answer to "is this the
same run?"."""

from __future__ import annotations

import dataclasses

import pytest

from fedskew.config import read_config, resolve
from fedskew.config.resume import same_run, tables_of
from fedskew.config.schema import (
    RESUMABLE,
    TOP_LEVEL,
    EvalParams,
    Faults,
    RayParams,
    RunConfig,
    RunSettings,
    full_config,
)
from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, build_params, maximums, minimums, option, option_help, resumable_options
from tests.helpers.configs import tiny_config


class _Sized(Options):
    count: int = option(3, help="how many", resumable=True)
    share: float = option(0.5, help="a share")
    cap: int | None = None

    at_least = minimums(count=1, share=0.0)
    at_most = maximums(count=10, cap=100)


def test_declared_bounds_name_the_range_and_the_kind_of_value() -> None:
    assert _Sized(count=10, share=0.0, cap=None).count == 10
    with pytest.raises(ConfigError, match=r"^count must be an integer in \[1, 10\], got 0$"):
        _Sized(count=0)
    with pytest.raises(ConfigError, match=r"^count must be an integer in \[1, 10\], got 11$"):
        _Sized(count=11)
    with pytest.raises(ConfigError, match=r"^share must be >= 0, got -0.5$"):  # a float: no "integer"
        _Sized(share=-0.5)
    with pytest.raises(ConfigError, match=r"^cap must be an integer <= 100, got 101$"):  # int | None is an integer
        _Sized(cap=101)
    with pytest.raises(ConfigError, match=r"^x\.count must be an integer in \[1, 10\], got 12$"):
        build_params(_Sized, {"count": 12}, prefix="x.")


def test_help_and_resumability_are_read_from_the_fields() -> None:
    assert option_help(_Sized) == {"count": "how many", "share": "a share", "cap": ""}
    assert resumable_options(_Sized) == ("count",)


def test_the_top_level_keys_and_the_resumable_set_are_generated_from_the_classes() -> None:
    settings = [f.name for f in dataclasses.fields(RunSettings)]
    tables = [f.name for f in dataclasses.fields(RunConfig) if f.name not in ("run", "source")]
    assert list(TOP_LEVEL) == [*settings[:4], "seeds", *settings[4:], *tables, "variants", "sweep"]
    assert all(TOP_LEVEL[k] == option_help(RunSettings)[k] for k in settings)
    assert all(TOP_LEVEL[k] for k in TOP_LEVEL), [k for k in TOP_LEVEL if not TOP_LEVEL[k]]
    assert RESUMABLE == (
        "rounds", "workers", "workers_per_device", "server_threads", "checkpoint_every", "device", "amp", "sgd_impl",
        "compile", "tf32", "clients_in_parallel", "logging", "report", "privacy.target_epsilon",
    )


@pytest.mark.parametrize(
    ("cls", "table", "message"),
    [
        (RunSettings, {"rounds": 0}, "rounds must be an integer in [1, 1_000_000], got 0"),
        (RunSettings, {"workers": 2000}, "workers must be an integer in [0, 1024], got 2000"),
        (Faults, {"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
        (Faults, {"max_reply_mb": 0}, "max_reply_mb must be > 0, got 0.0"),
        (RayParams, {"num_gpus": -1}, "num_gpus must be >= 0, got -1.0"),
        (EvalParams, {"personalized_batch_size": 0}, "personalized_batch_size must be an integer >= 1, got 0"),
        (EvalParams, {"personalized_lr": 0}, "personalized_lr must be > 0, got 0.0"),
    ],
)
def test_run_tables_refuse_bad_values_in_one_line(cls: type, table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_params(cls, table)
    assert str(err.value) == message


def _config(**overrides: object) -> dict[str, object]:
    return resolve(read_config(None), {"rounds": 2, **overrides})[0].config


def test_same_run_ignores_what_a_resume_may_change_and_names_the_rest() -> None:
    stored = full_config(_config())
    assert same_run(stored, _config()) == []
    assert same_run(stored, _config(rounds=9, workers=2, **{"logging.tensorboard": False})) == []
    # A key of a table that is not resumable as a whole: a privacy budget may be raised, the mechanism not.
    private = full_config(tiny_config(privacy={"mode": "central", "target_epsilon": 4.0}))
    assert same_run(private, tiny_config(privacy={"mode": "central", "target_epsilon": 8.0})) == []
    assert same_run(private, tiny_config(privacy={"mode": "central", "target_epsilon": 8.0, "clip": 2.0})) == [
        "privacy.clip"]
    changed = same_run(stored, _config(**{"algorithm.lr": 0.5, "partition.alpha": 0.3, "seed": 3}))
    assert changed == ["algorithm.lr", "partition.alpha", "seed"]
    assert tables_of(changed) == ["algorithm", "partition", "seed"]
    # A record written before a default existed equals its full form: defaults are filled in on both sides.
    sparse = {k: v for k, v in stored.items() if k != "eval"}
    assert same_run(sparse, _config()) == []
