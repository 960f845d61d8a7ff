"""Where a condensation may be run elsewhere: the hook between :mod:`fedskew.condense` and a batched runner.

The condensation code knows nothing of federated learning or of runners. A runner that condenses many
clients together (``clients_in_parallel``, :mod:`fedskew.engine.batched_runner`) installs a
:class:`CondensationHandOff` once per process (:func:`fedskew.components.batching.install_hand_offs`, which
the runner calls when it is made);
:func:`~fedskew.condense.distribution_matching.distribution_matching` and :func:`~fedskew.condense.kip.kip`
then offer their prepared request to it (:func:`hand_off`) and run the loop themselves when the hand-off
declines (None: no runner batches this thread, or the request cannot be batched). A method that has no
batched form (gradient matching) says so once (:func:`say_unbatched`), so a run under
``clients_in_parallel`` tells which of its work ran one client at a time.
"""

from __future__ import annotations

from typing import Any, Protocol


class CondensationHandOff(Protocol):
    def condense(self, request: Any) -> Any | None:
        """The condensed result of ``request`` (a :class:`~fedskew.condense.distribution_matching.DMRequest`
        or a :class:`~fedskew.condense.kip.KIPRequest`), or None to let the caller run it."""
        ...

    def unbatched(self, reason: str) -> None:
        """Note that a condensation runs one client at a time, and why (a no-op outside a batched runner)."""
        ...


_HAND_OFF: list[CondensationHandOff] = []


def install_condensation_hand_off(hand_off: CondensationHandOff) -> None:
    """Offer condensations to ``hand_off`` first (once per process)."""
    if all(h is not hand_off for h in _HAND_OFF):
        _HAND_OFF.append(hand_off)


def hand_off(request: Any) -> Any | None:
    """The first installed hand-off's result for ``request``, or None (the caller runs it)."""
    for h in _HAND_OFF:
        result = h.condense(request)
        if result is not None:
            return result
    return None


def say_unbatched(reason: str) -> None:
    """Tell the installed hand-offs that a condensation runs one client at a time, and why."""
    for h in _HAND_OFF:
        h.unbatched(reason)
