"""Process control of a ``fedskew`` command: SIGTERM and Ctrl-C stop a run the same way, a watchdog ends the
process should the stop hang, and multiprocessing's harmless peer-reset tracebacks are kept off the terminal.

All of it lives in one :class:`StopGuard` per command (``with StopGuard(...)`` in :func:`fedskew.cli.main`),
so that nothing of one command's stop is left over for the next one in the same process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

STOP_GRACE_S = 5.0
"""Seconds a stopped run (SIGTERM, Ctrl-C) has to wind down before the process ends regardless. Its files
are safe at any moment (checkpoints are written whole and renamed, metrics are rewritten from the checkpoint
on resume), so a stop never waits on a stuck worker pool: under Slurm or Kubernetes a grace period longer
than this is never exceeded, and the run resumes from its last finished round."""

RESUME_HINT = "a run continues from its last checkpoint with `fedskew run --resume RUN_DIR`"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops and cleans up exactly as after Ctrl-C."""


class StopGuard:
    """SIGTERM and Ctrl-C handling, the stop's watchdog and the quiet ``sys.excepthook`` of one command.

    Entered in the main thread, it installs its handlers (SIGINT only where Python's default handler is in
    place: a SIGINT the process was started to ignore stays ignored) and :func:`quiet_peer_resets`; on exit
    it puts the previous handlers back. ``in_process``: the command was called from Python (``main([...])``),
    which goes on after it, so leaving cancels a running watchdog; the ``fedskew`` command itself keeps it
    through the interpreter's exit, where a stuck pool's exit handler would otherwise hang.
    """

    def __init__(self, *, in_process: bool, grace_s: float = STOP_GRACE_S) -> None:
        self.in_process = in_process
        self.grace_s = grace_s
        self.stopping_since: float | None = None
        """When the first stop signal came (``time.monotonic()``); None before."""
        self.cancelled = threading.Event()
        """Set when the watchdog must not end the process (the command returned to a Python caller)."""
        self.reported = threading.Event()
        """Set once the stop's line is printed; the watchdog then adds none."""
        self._main_thread = threading.current_thread() is threading.main_thread()
        self._previous_term: Any = None
        self._previous_int: Any = None

    def __enter__(self) -> StopGuard:
        if self._main_thread:
            self._previous_term = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._previous_int = signal.getsignal(signal.SIGINT)
            if self._previous_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, self._on_sigint)
            sys.excepthook = quiet_peer_resets(sys.excepthook)  # type: ignore[assignment]
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._main_thread and self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)
        if self._main_thread and self._previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._previous_int)
        if self.in_process:  # this process goes on, so no watchdog may end it
            self.cancelled.set()

    def stopped(self, what: str, code: int) -> int:
        """Say on stderr that the command was stopped (``what``: terminated, interrupted) and how a run
        continues; returns ``code``, the exit code."""
        self.reported.set()
        print(f"fedskew: {what}; {RESUME_HINT}", file=sys.stderr)
        return code

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Ctrl-C reaches every process of the terminal's group; SIGTERM only this one. Stop the worker
        # processes too (they would also die with this process, but only after their current job).
        self.stop(143, "terminated")
        raise Terminated

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.stop(130, "interrupted")
        raise KeyboardInterrupt

    def stop(self, code: int, what: str) -> None:
        """Ask the worker processes to end and make sure this process ends within ``grace_s`` seconds.

        The workers get SIGTERM now and SIGKILL a second later if still alive; a watchdog thread then ends this
        process with ``code`` should the main thread still be winding down (a pool stuck on a dead worker's lock).
        A second signal adds nothing: the first one's watchdog is running.
        """
        if self.stopping_since is not None:
            return
        self.stopping_since = time.monotonic()
        workers = multiprocessing.active_children()
        for child in workers:
            child.terminate()
        threading.Thread(target=self._watchdog, args=(workers, code, what), name="fedskew-stop-watchdog",
                         daemon=True).start()

    def _watchdog(self, workers: list[multiprocessing.process.BaseProcess], code: int, what: str) -> None:
        time.sleep(1.0)
        for child in workers:
            if child.is_alive():
                child.kill()
        if self.cancelled.wait(max(self.grace_s - 1.0, 0.0)):
            return
        if not self.reported.is_set():
            print(f"fedskew: {what}; {RESUME_HINT} (ended after {self.grace_s:.0f} s of winding down)",
                  file=sys.stderr, flush=True)
        os._exit(code)


def quiet_peer_resets(hook: object) -> object:
    """``sys.excepthook`` without the traceback multiprocessing's fd-sharing thread prints when a worker
    it was handing a shared tensor to dies mid-handshake (SIGTERM or Ctrl-C while a round is in flight).

    That thread reports the ``ConnectionError`` or ``EOFError`` itself and carries on; a worker that really died is
    reported by the pool (:data:`fedskew.engine.workers.BROKEN`). Everything else goes to ``hook``.
    """

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        sharer = any(f.filename.endswith("resource_sharer.py") for f in traceback.extract_tb(tb))
        if sharer and issubclass(kind, (ConnectionError, EOFError)):
            return
        hook(kind, value, tb)  # type: ignore[operator]

    if getattr(hook, "quiet_peer_resets", False):
        return hook
    excepthook.quiet_peer_resets = True  # type: ignore[attr-defined]
    return excepthook
