"""The condensation family's parameters: the nested [algorithm.server] table, the renamed keys and
``wire_dtype``."""

from __future__ import annotations

import tomllib

import pytest

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import parse_overrides, resolve
from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params, params_doc


def _runs(text: str, *overrides: str) -> list[dict]:
    return [r.config for r in resolve(tomllib.loads(text), parse_overrides(list(overrides)))]


BASE = """
[dataset]
name = "digits"
[partition]
name = "iid"
num_clients = 4
[algorithm]
name = "{name}"
"""


@pytest.mark.parametrize(("name", "default"), [("feddc", (10, 256, 0.01, 0.0)), ("feddm", (500, 256, 0.001, 0.9)),
                                               ("fedaf", (500, 256, 0.001, 0.9))])
def test_server_table_keeps_each_methods_defaults_and_takes_keys_one_by_one(name: str, default: tuple) -> None:
    cls = ALGORITHMS.get(name).Params
    s = build_params(cls, {}).server
    assert (s.epochs, s.batch_size, s.lr, s.momentum) == default
    s = build_params(cls, {"server": {"lr": 0.5}}).server
    assert (s.epochs, s.batch_size, s.lr, s.momentum) == (default[0], default[1], 0.5, default[3])


def test_server_table_from_toml_dotted_keys_and_the_command_line() -> None:
    text = BASE.format(name="fedaf") + "server.epochs = 7\n"
    (cfg,) = _runs(text, "algorithm.server.lr=0.25")
    assert cfg["algorithm"]["server"] == {"epochs": 7, "lr": 0.25}
    p = build_params(ALGORITHMS.get("fedaf").Params, {k: v for k, v in cfg["algorithm"].items() if k != "name"})
    assert (p.server.epochs, p.server.lr, p.server.batch_size) == (7, 0.25, 256)


@pytest.mark.parametrize(("name", "key", "new"), [
    ("feddm", "lr", "server.lr"), ("fedaf", "epochs", "server.epochs"), ("fedaf", "momentum", "server.momentum"),
    ("feddc", "server_lr", "server.lr"), ("feddc_plus", "server_batch_size", "server.batch_size"),
    ("scaffold", "global_lr", "server_lr"),
])
def test_a_moved_key_ends_in_one_line_naming_the_new_one(name: str, key: str, new: str) -> None:
    with pytest.raises(ConfigError, match=rf"^'algorithm\.{key}' is now 'algorithm\.{new}'; rename the key$"):
        _runs(BASE.format(name=name), f"algorithm.{key}=1")


def test_bad_server_values_name_the_nested_key() -> None:
    with pytest.raises(ConfigError, match=r"^algorithm\.server\.lr must be > 0, got -1\.0$"):
        _runs(BASE.format(name="feddm"), "algorithm.server.lr=-1")
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.server\.nope'; allowed: batch_size, epochs"):
        _runs(BASE.format(name="feddc"), "algorithm.server.nope=1")
    with pytest.raises(ConfigError, match=r"^algorithm\.server must be a table, got 3$"):
        _runs(BASE.format(name="feddc"), "algorithm.server=3")


def test_lr_is_the_clients_rate_for_feddc_and_fedavg_variants_keep_theirs() -> None:
    text = BASE.format(name="fedavg") + 'lr = 0.05\n[[variants]]\nlabel = "A"\n[[variants]]\nlabel = "B"\n' \
        '"algorithm.name" = "feddm"\n'
    fedavg, feddm = _runs(text)
    assert fedavg["algorithm"]["lr"] == 0.05
    assert "lr" not in feddm["algorithm"]  # FedDM has no client lr: the base's is not carried over


def test_list_shows_the_nested_keys() -> None:
    doc = {name: default for name, _, default in params_doc(ALGORITHMS.get("feddm").Params)}
    assert doc["server.lr"] == 0.001 and doc["server.epochs"] == 500 and "server" not in doc


@pytest.mark.parametrize("name", ["feddc", "feddc_plus", "feddm", "fedaf"])
def test_every_uploading_method_takes_wire_dtype_uint8_by_default(name: str) -> None:
    cls = ALGORITHMS.get(name).Params
    assert build_params(cls, {}).wire_dtype == "uint8"
    assert build_params(cls, {"wire_dtype": "float16"}).wire_dtype == "float16"
    with pytest.raises(ConfigError) as err:
        _runs(BASE.format(name=name), "algorithm.wire_dtype=int8")
    assert str(err.value) == "algorithm.wire_dtype must be one of 'uint8', 'float16', 'float32', got 'int8'"
