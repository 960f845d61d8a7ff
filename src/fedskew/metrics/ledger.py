"""The communication ledger: bytes on the wire, per direction and per round.

Methods differ less in what they send per message than in who talks to whom: FedAvg only exchanges
models with the server, FedAF uploads condensed images, HFLDD sends distilled data between clients.
Counting the three directions separately is what lets the report compare them fairly.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, ClassVar


class Ledger:
    """Bytes sent per direction per round.

    The engine calls :meth:`add` for every message; the per-round totals go into ``metrics.jsonl``
    and the state into checkpoints so that a resumed run keeps counting from where it stopped.
    :meth:`add` is thread-safe because clients may be served from a thread pool.
    """

    DIRECTIONS: ClassVar[tuple[str, ...]] = ("server_to_client", "client_to_server", "client_to_client")

    def __init__(self) -> None:
        self._rounds: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(direction: str) -> str:
        return f"bytes_{direction}"

    def add(self, direction: str, nbytes: int, round: int) -> None:
        """Record ``nbytes`` sent in ``direction`` during ``round``.

        Raises
        ------
        ValueError
            For an unknown direction or a negative byte count: either is a bug in the caller, and
            silently accepting it would corrupt every traffic comparison.
        """
        if direction not in self.DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}; allowed: {', '.join(self.DIRECTIONS)}")
        n = operator.index(nbytes)
        if n < 0:
            raise ValueError(f"byte count must be >= 0, got {n}")
        r = operator.index(round)
        with self._lock:
            counts = self._rounds.setdefault(r, dict.fromkeys(self.DIRECTIONS, 0))
            counts[direction] += n

    def round_totals(self, round: int) -> dict[str, int]:
        """Bytes per direction in ``round`` (zeros for a round with no traffic).

        Keys are ``bytes_server_to_client`` etc., the names used in ``metrics.jsonl``.
        """
        with self._lock:
            counts = self._rounds.get(operator.index(round), {})
            return {self._key(d): counts.get(d, 0) for d in self.DIRECTIONS}

    def totals(self) -> dict[str, int]:
        """Bytes per direction over all rounds, keyed like :meth:`round_totals`."""
        with self._lock:
            return {self._key(d): sum(counts[d] for counts in self._rounds.values()) for d in self.DIRECTIONS}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able copy: ``{"rounds": {"<round>": {"<direction>": bytes}}}`` with plain ints."""
        with self._lock:
            return {"rounds": {str(r): dict(counts) for r, counts in sorted(self._rounds.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with a :meth:`state_dict` (e.g. read back from a checkpoint).

        Raises
        ------
        ValueError
            If the state has unknown directions or non-integer counts, so that a corrupt
            checkpoint fails loudly instead of skewing the totals.
        """
        rounds: dict[int, dict[str, int]] = {}
        for r, counts in state["rounds"].items():
            unknown = set(counts) - set(self.DIRECTIONS)
            if unknown:
                raise ValueError(f"unknown directions in ledger state: {sorted(unknown)}")
            full = dict.fromkeys(self.DIRECTIONS, 0)
            for d, n in counts.items():
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise ValueError(f"bad byte count {n!r} for round {r}, direction {d}")
                full[d] = n
            rounds[int(r)] = full
        with self._lock:
            self._rounds = rounds
