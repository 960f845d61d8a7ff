"""Config files and command-line overrides: reading TOML, dotted keys, writing a resolved config."""

from __future__ import annotations

import math
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from fedskew.config.schema import SECTIONS, TOP_LEVEL
from fedskew.core.errors import ConfigError
from fedskew.plugins import check_specs, normalise


def builtin_configs() -> list[str]:
    """Names of the configs shipped inside the package (``fedskew run default``)."""
    return sorted(p.name[:-5] for p in resources.files("fedskew.configs").iterdir() if p.name.endswith(".toml"))


def read_config(source: str | Path | None) -> dict[str, Any]:
    """Parse a config file, or a built-in config by name (None: ``default``).

    The files a file's ``plugins`` names are made absolute against the file's folder (see
    :func:`with_plugin_base`); they are imported when the config is resolved.
    """
    if source is None:
        source = "default"
    path = Path(source)
    if not path.exists() and str(source) in builtin_configs():
        text = resources.files("fedskew.configs").joinpath(f"{source}.toml").read_text(encoding="utf-8")
        where = f"built-in config {source!r}"
    elif path.is_dir():
        raise ConfigError(f"config {path} is a folder, not a TOML file")
    elif path.exists():
        text, where = read_text(path, "config"), str(path)
    else:
        raise ConfigError(
            f"config {str(source)!r} not found: give a TOML file or one of the built-in configs "
            f"({', '.join(builtin_configs())})"
        )
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: invalid TOML: {e}") from None
    return with_plugin_base(raw, path.resolve().parent, where)


def with_plugin_base(raw: dict[str, Any], base: Path, where: str = "config") -> dict[str, Any]:
    """``raw`` with the files of its ``plugins`` key as absolute paths, relative ones taken from ``base``
    (the config file's folder); a ``plugins`` value that is not a list of strings is a ConfigError."""
    if "plugins" not in raw:
        return raw
    specs = check_specs(raw["plugins"], f"{where}: plugins")
    return {**raw, "plugins": [normalise(spec, base) for spec in specs]}


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; a file that cannot be read or is not UTF-8 is a one-line ConfigError."""
    try:
        data = path.read_bytes()
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        raise ConfigError(f"cannot read {what} {path}: {reason}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at position {e.start}); save it as UTF-8"
        ) from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """``path`` parsed as TOML, every failure (unreadable, not UTF-8, invalid TOML) a one-line ConfigError."""
    try:
        return tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path}: invalid TOML: {e}") from None


def parse_value(text: str) -> Any:
    """A command-line value as TOML (``0.1``, ``true``, ``[1, 2]``, ``"x"``); bare words stay strings, also in a
    list (``[fedavg,fedprox]`` is ``["fedavg", "fedprox"]``, no shell-proof TOML quoting needed)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    inner = text.strip()[1:-1] if text.strip().startswith("[") and text.strip().endswith("]") else None
    if inner is not None and not any(c in inner for c in "[]{}\"\'") and inner.strip():
        items = inner.split(",")
        return [parse_value(item.strip()) for item in (items[:-1] if not items[-1].strip() else items)]
    return text


def same_value(a: Any, b: Any) -> bool:
    """``a == b`` for config values, where a NaN equals a NaN: TOML stores ``faults.attack = nan`` as a float
    NaN, which never equals itself, and a recorded config must still equal itself (``--resume``)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def flat_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys: ``{"partition": {"alpha": 0.1}}`` -> ``{"partition.alpha": 0.1}``."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat_keys(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "rounds=5"]`` -> ``{"a.b": 1, "rounds": 5}``; a malformed item is a ConfigError."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value (for example rounds=5)")
        out[key.strip()] = parse_value(value.strip())
    return out


def set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    """Set ``cfg["a"]["b"] = value`` for ``key = "a.b"``, checking the top-level key is known."""
    parts = key.split(".")
    top = parts[0]
    if top not in TOP_LEVEL or top in ("variants", "sweep"):
        allowed = ", ".join(k for k in TOP_LEVEL if k not in ("variants", "sweep"))
        raise ConfigError(f"unknown config key {key!r}; allowed top-level keys: {allowed}")
    if top in SECTIONS:
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a table; set its entries, for example {key}.name=...")
            cfg[top] = dict(value)
            return
        if len(parts) == 3 and top == "algorithm":  # a nested table of the algorithm (algorithm.server.lr)
            table = cfg.setdefault(top, {}).setdefault(parts[1], {})
            if not isinstance(table, dict):
                raise ConfigError(f"config key {key!r}: algorithm.{parts[1]} is not a table")
            table[parts[2]] = value
            return
        if len(parts) != 2:
            deepest = f"{top}.<option>" + (" or algorithm.<table>.<option>" if top == "algorithm" else "")
            raise ConfigError(f"config key {key!r} is nested too deeply; use {deepest}")
        cfg.setdefault(top, {})[parts[1]] = value
    else:
        if len(parts) != 1:
            raise ConfigError(f"config key {key!r}: {top!r} is not a table")
        cfg[top] = value


def dump(cfg: dict[str, Any]) -> str:
    """TOML text of a resolved config (None values dropped: TOML has no null)."""

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return tomli_w.dumps(clean(cfg))
