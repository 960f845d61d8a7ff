"""Progress output that suits where it goes: a tqdm bar in a terminal, plain lines in a log file.

tqdm redraws its bar with carriage returns and cursor-movement escape codes; written to a file (a batch
job's log, ``fedskew run ... 2> log``) every redraw and every nested bar becomes a line of noise. So
:func:`progress_bar` returns a tqdm bar only when its stream is a terminal, and otherwise a
:class:`PlainProgress`: the same interface (``update``, ``set_postfix``, ``set_description``, ``write``,
``close``, a context manager), writing one plain line per step or per ``every_s`` seconds, whichever is
rarer, plus a last line when it ends. ``FEDSKEW_PROGRESS`` picks a kind regardless of the stream:
``bar``, ``plain`` or ``off``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm import tqdm

ENV = "FEDSKEW_PROGRESS"
"""Environment variable that forces a kind of progress output: ``bar``, ``plain`` or ``off``."""


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or replaced streams (pytest's capture) say no
        return False


class PlainProgress:
    """A tqdm-compatible progress writer for streams that are not terminals: plain lines, no escape codes.

    A line reads ``desc: 3/60 round, acc=55.1% (12 s)``. One is written after an update when ``every_s``
    seconds have passed since the last line (``every_s=0``: after every update, one line per round), and
    one when the work is complete or the writer is closed with progress not yet reported.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, total: float | None = None, desc: str = "",
                 unit: str = "it", initial: float = 0, every_s: float = 10.0, file: IO[str] | None = None) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self.every_s = every_s
        self.file = file
        self.postfix = ""
        self.start = time.monotonic()
        self._last_line = -float("inf") if every_s <= 0 else self.start
        self._reported = initial
        self.closed = False

    # the parts of tqdm's interface fedskew uses
    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last_line >= self.every_s or (self.total is not None and self.n >= self.total):
            self._line(now)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        pass

    def write(self, s: str) -> None:
        print(s, file=self._stream(), flush=True)

    def close(self) -> None:
        if not self.closed and self.n != self._reported:
            self._line(time.monotonic())
        self.closed = True

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("PlainProgress made without an iterable is not iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def _stream(self) -> IO[str]:
        return self.file if self.file is not None else sys.stderr  # looked up late: tests replace sys.stderr

    def line(self) -> str:
        """What the next line would say."""
        count = f"{self.n:g}/{self.total:g}" if self.total is not None else f"{self.n:g}"
        elapsed = time.monotonic() - self.start
        return (f"{self.desc}: " if self.desc else "") + f"{count} {self.unit}" + (
            f", {self.postfix}" if self.postfix else "") + f" ({elapsed:.0f} s)"

    def _line(self, now: float) -> None:
        print(self.line(), file=self._stream(), flush=True)
        self._last_line = now
        self._reported = self.n


def progress_bar(iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", enabled: bool = True, initial: float = 0, leave: bool = True,
                 every_s: float = 10.0, file: IO[str] | None = None) -> Any:
    """A progress bar for ``iterable`` (or for ``update`` calls up to ``total``) fit for where it is written.

    Parameters
    ----------
    iterable, total, desc, unit, initial, leave
        As for ``tqdm``.
    enabled
        False: a disabled tqdm bar (every call a no-op), as ``--no-progress`` asks.
    every_s
        Where the stream is not a terminal: write a line at most every ``every_s`` seconds (0: after every
        update, one line per round), plus one when the work is complete.
    file
        The stream (default: standard error).

    Returns
    -------
    tqdm or PlainProgress
        tqdm's bar when ``file`` is a terminal (or ``FEDSKEW_PROGRESS=bar``), a :class:`PlainProgress`
        otherwise (or ``FEDSKEW_PROGRESS=plain``); a disabled tqdm bar when ``enabled`` is false or
        ``FEDSKEW_PROGRESS=off``.
    """
    kind = os.environ.get(ENV, "").strip().lower()
    if kind not in ("", "bar", "plain", "off"):
        kind = ""
    stream = file if file is not None else sys.stderr
    if not enabled or kind == "off":
        return tqdm(iterable, total=total, disable=True)
    if kind == "bar" or (kind == "" and _is_terminal(stream)):
        return tqdm(iterable, total=total, desc=desc or None, unit=unit, initial=initial, leave=leave, file=stream)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, every_s=every_s, file=file)
