"""A worker stopped in the middle of sending its result back, as SIGTERM, Ctrl-C or the out-of-memory killer
leave one: the worker pool must still end in seconds (issue 44, item 15; :class:`fedskew.engine.workers.WorkerPool`).

``python -m tests.helpers.pool_faults stop|crash`` (from the repository root, ``src`` on the path) starts a
pool of two workers and has one of them write the first bytes of a result message, then

- ``stop``: stay (the message never ends); the workers get SIGTERM as ``fedskew.cli.process``'s stop sends it and the
  pool is closed, as a stopped run closes it;
- ``crash``: die at once, the other worker alive and idle; waiting for the result must end in
  :data:`~fedskew.engine.workers.BROKEN`.

It prints ``ended in S s`` (from the half-sent reply to the pool's end) and exits 0 once the pool has ended as it
should. Before the fix both waited forever: the executor's manager thread read the half message and waited for
its rest, which no end of file ever cut short.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import sys
import time
from typing import Any

ANNOUNCED = 1 << 20
"""The length the half-sent message announces (it carries 12 bytes of it)."""


def _result_queue() -> Any:
    """The result queue of the ``ProcessPoolExecutor`` worker this runs in (a local of its worker loop)."""
    frame = sys._getframe(1)
    while frame is not None and "result_queue" not in frame.f_locals:
        frame = frame.f_back  # type: ignore[assignment]
    assert frame is not None, "not called in a ProcessPoolExecutor worker"
    return frame.f_locals["result_queue"]


def half_a_reply(then: str) -> None:
    """Write a result message's header and its first 12 bytes, then sleep (``"stay"``) or die (``"die"``)."""
    _result_queue()._writer._send(struct.pack("!i", ANNOUNCED) + b"half a reply")
    if then == "die":
        os._exit(1)
    time.sleep(600)


def main(kind: str) -> int:
    from fedskew.core.device import Compute
    from fedskew.core.errors import FedskewError
    from fedskew.engine.workers import WorkerPool
    from tests.helpers.configs import federation_from, tiny_config

    cfg = tiny_config()
    fed = federation_from(cfg, 0)
    pool = WorkerPool(fed, 2, Compute(), ["cpu"])
    future = pool.submit(half_a_reply, "stay" if kind == "stop" else "die")
    time.sleep(2.0)  # the half message is in the pipe; the executor's thread reads it and waits for the rest
    start = time.monotonic()
    if kind == "stop":
        for child in multiprocessing.active_children():  # as fedskew.cli.process's SIGTERM handler stops the workers
            child.terminate()
        pool.close()
    else:
        try:
            pool.gather([future])
        except FedskewError as e:
            assert "a worker process died" in str(e), e
        else:
            raise AssertionError("the result of a worker that died came back")
        pool.close()
    print(f"ended in {time.monotonic() - start:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
