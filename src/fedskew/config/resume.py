"""Is this the same run? The one answer every way of resuming a run folder shares (``fedskew run --resume``, a
resumed experiment, a resumed Flower deployment, a checkpoint's own copy of the config)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fedskew.config.files import flat_keys, same_value, set_dotted
from fedskew.config.schema import RESUMABLE, RunConfig, comparable_config, full_config, typed_config
from fedskew.core.errors import ConfigError


def same_run(stored: Mapping[str, Any], now: Mapping[str, Any] | RunConfig) -> list[str]:
    """The dotted keys in which the config a run folder holds (``stored``, as read from its ``config.toml``) and
    the config it is resumed with (``now``) differ, leaving out what a resume may change (:data:`RESUMABLE`);
    empty: the same run.

    Both sides are compared with every default filled in (:func:`~fedskew.config.schema.full_config`), so a
    record written before a default existed still equals its full form; a side that does not validate is
    compared as it is (it then differs from any valid config, in the keys that make it invalid).
    """
    then = flat_keys(comparable_config(dict(stored)))
    later = flat_keys(full_config(now) if isinstance(now, RunConfig) else comparable_config(dict(now)))
    return sorted(
        k for k in then.keys() | later.keys() if not resumable(k) and not same_value(then.get(k), later.get(k))
    )


def resumable(key: str) -> bool:
    """Whether a resume may change the dotted ``key``: a :data:`RESUMABLE` key, or any key of a resumable table."""
    return key in RESUMABLE or key.split(".")[0] in RESUMABLE


def same_length(stored: Mapping[str, Any], now: RunConfig) -> bool:
    """Whether the run a folder holds (``stored``) has the rounds ``now`` asks for (a finished run that ``now``
    extends is continued, not kept)."""
    return bool(comparable_config(dict(stored)).get("rounds") == now.run.rounds)


def check_resume_overrides(overrides: Mapping[str, Any]) -> None:
    """Refuse, in one line, an override a resumed run may not take (only :data:`RESUMABLE` keys)."""
    for key in overrides:
        if not resumable(key):
            raise ConfigError(f"--resume accepts only the overrides {', '.join(RESUMABLE)}, not {key!r}")


def resumed_config(stored: Mapping[str, Any], overrides: Mapping[str, Any]) -> RunConfig:
    """The typed config a run resumes with: the one its folder holds (``stored``) under ``overrides``
    (:func:`check_resume_overrides`)."""
    check_resume_overrides(overrides)
    cfg = copy.deepcopy(dict(stored))
    for key, value in overrides.items():
        set_dotted(cfg, key, value)
    cfg.setdefault("target_accuracy", None)  # records from before the key existed
    return typed_config(cfg)


def tables_of(keys: list[str]) -> list[str]:
    """The top-level keys and tables of dotted keys, in order, once each (``algorithm.lr`` -> ``algorithm``)."""
    return list(dict.fromkeys(k.split(".")[0] for k in keys))
