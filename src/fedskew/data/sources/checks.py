"""Checks shared by the datasets' Params classes that no declared bound says (each raises a ConfigError naming
the key); their bounds are declared (:class:`~fedskew.core.params.Options`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedskew.core.params import check

__all__ = ["MAX_IMAGE_SIZE", "check_channels", "check_min", "check_names", "check_path"]

MAX_IMAGE_SIZE = 1024
"""The largest ``image_size`` (pixels per side) any dataset resizes or generates images to (each declares it:
``at_most = maximums(image_size=MAX_IMAGE_SIZE)``)."""


def check_min(key: str, value: int | None, minimum: int, *, optional: bool = False) -> None:
    """Require the integer option ``key`` to be ``>= minimum`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    check(value is not None and value >= minimum, key, value, f"an integer >= {minimum}")


def check_channels(value: int | None, *, optional: bool = False) -> None:
    """Require the ``channels`` option to be 1 or 3 (or ``None`` when ``optional``)."""
    check((optional and value is None) or value in (1, 3), "channels", value, "1 or 3")


def check_names(key: str, value: Sequence[str] | None) -> None:
    """Require a list option of names (``classes``, ``domains``) to be non-empty and distinct, or ``None``."""
    check(value is None or (len(value) > 0 and len(set(value)) == len(value)), key, value, "a list of distinct names")


def check_path(value: object) -> None:
    """Require the ``path`` option to be a path (a string) or ``None``."""
    check(value is None or isinstance(value, str | Path), "path", value, "a path (a string)")
