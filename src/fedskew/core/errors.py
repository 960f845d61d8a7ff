"""Errors that reach the user.

Every problem a user can cause (a bad config value, a missing file, a corrupt archive) raises a
subclass of :class:`FedskewError`. The CLI prints such errors as one line, without a traceback;
anything else is a bug in fedskew and keeps its traceback.
"""

from __future__ import annotations


class FedskewError(Exception):
    """A problem with the user's input or environment, reported as one line."""


class ConfigError(FedskewError):
    """An invalid configuration key or value."""


class DataError(FedskewError):
    """A dataset that cannot be found, downloaded, verified or parsed."""
