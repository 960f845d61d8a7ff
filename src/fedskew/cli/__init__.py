"""The ``fedskew`` command line: :func:`main` (the console entry point ``fedskew.cli:main``).

One module per command (``run``, ``partition``, ``report``, ``deploy``, ``audit``, ``condense``, ``listing``
for ``list``), each with its arguments (``add_parser``) and its ``cmd_*``; what they share is in
:mod:`~fedskew.cli.common`, the top-level parser in :mod:`~fedskew.cli.parser`, signals and the stop's
watchdog in :mod:`~fedskew.cli.process`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fedskew.cli.parser import parse_args
from fedskew.cli.process import StopGuard, Terminated
from fedskew.core.errors import FedskewError
from fedskew.plugins import load_plugins
from fedskew.runs import describe_os_error

__all__ = ["main", "parse_args"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error a user can cause ends in one line ``fedskew: error: ...`` and exit code 2.

    One line, no traceback, for: :class:`FedskewError` (bad input, missing data, a run folder in use),
    ``OSError`` (a full disk, a read-only or unwritable folder, a file where a folder should be), and
    running out of memory (``MemoryError``, PyTorch's failed allocations). Ctrl-C (exit 130) and SIGTERM
    (exit 143) stop a run the same way: its worker processes end and it can continue from its last
    checkpoint (:class:`~fedskew.cli.process.StopGuard`).
    """
    args = parse_args(argv)
    with StopGuard(in_process=argv is not None) as guard:
        try:
            load_plugins(args.imports)  # before anything runs: a plug-in that fails is one line
            return int(args.func(args))
        except FedskewError as e:
            return _error(str(e))
        except OSError as e:
            return _error(describe_os_error(e))
        except MemoryError as e:
            return _error(f"out of memory ({e or 'MemoryError'}); make the dataset, model or batch smaller")
        except RuntimeError as e:
            if not _out_of_memory(e):
                raise
            last = str(e).strip().splitlines()[-1]
            return _error(f"out of memory ({last}); make the dataset, model or batch smaller")
        except Terminated:
            return guard.stopped("terminated", 143)
        except KeyboardInterrupt:
            return guard.stopped("interrupted", 130)


def _out_of_memory(e: RuntimeError) -> bool:
    """PyTorch reports a failed allocation as a RuntimeError: ``torch.OutOfMemoryError`` on a GPU, a
    message ``DefaultCPUAllocator: can't allocate memory`` on the CPU."""
    return type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


def _error(line: str) -> int:
    print(f"fedskew: error: {' '.join(line.splitlines())}", file=sys.stderr)  # one line, whatever the message
    return 2
