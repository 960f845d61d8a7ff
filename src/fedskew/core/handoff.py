"""Where work may be run elsewhere: the one hook between the code that does a client's work and a runner that
batches many clients' work together.

The trainer and the condensations know nothing of runners. :func:`~fedskew.components.trainer.train_local`
(a :class:`~fedskew.components.trainer.LocalTraining`) and
:func:`~fedskew.condense.kip.kip` (a ``KIPRequest``) offer their prepared request to the installed hand-off
(:func:`hand_off`) and do the work themselves when it declines (None: no runner batches this thread, or the
request cannot be batched). A runner that batches clients (``clients_in_parallel``,
:mod:`fedskew.engine.batched_runner`) installs its hand-off when it is made
(:func:`fedskew.components.batching.install_hand_off`); no import installs anything. Work that has no batched
form (distribution matching, gradient matching) says so once (:func:`say_unbatched`), so a run under
``clients_in_parallel`` tells which of its work ran one client at a time.
"""

from __future__ import annotations

from typing import Any, Protocol


class HandOff(Protocol):
    def offer(self, request: Any) -> Any | None:
        """The result of ``request`` (a local training or a condensation), or None to let the caller do it."""
        ...

    def unbatched(self, reason: str) -> None:
        """Note that a condensation runs one client at a time, and why (a no-op outside a batched runner)."""
        ...


_HAND_OFF: list[HandOff] = []


def install_hand_off(hand_off: HandOff) -> None:
    """Offer work to ``hand_off`` first (once per process; installing it again does nothing)."""
    if all(h is not hand_off for h in _HAND_OFF):
        _HAND_OFF.append(hand_off)


def hand_off(request: Any) -> Any | None:
    """The first installed hand-off's result for ``request``, or None (the caller does the work)."""
    for h in _HAND_OFF:
        result = h.offer(request)
        if result is not None:
            return result
    return None


def say_unbatched(reason: str) -> None:
    """Tell the installed hand-offs that a condensation runs one client at a time, and why."""
    for h in _HAND_OFF:
        h.unbatched(reason)
