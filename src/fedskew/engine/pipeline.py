"""What happens to a round's requests and replies between the algorithm and the runner: a chain of small
steps, each a function of one :class:`Delivery`, testable without a federation (as Flower's mods are).

On the way down, :meth:`ReplyPipeline.send` counts each message on the ledger and draws the client's
fate (a simulated dropout never gets its job). On the way up, every outcome passes the
:data:`TRANSPORT` steps (what happens to a reply on its way: a malicious client's model replacement,
corruption, the upload on the ledger, a straggler's late arrival), then the :data:`CHECKS` (the reply's
arrays against the method's spec, its scalar metrics against their ranges, its sample count against
the client's data). A step returns None to pass the reply on, or a :class:`Drop` saying why it stops
there. :class:`RoundBook` is one record of a round's bookkeeping: who took part, with how many samples,
who failed and whose reply was rejected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedskew.algorithms.base import Replies
from fedskew.config.schema import Faults
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.faults import corrupt_reply, model_replacement
from fedskew.engine.replies import check_reply
from fedskew.engine.runner import ClientJob, NoReply, Outcome
from fedskew.metrics import Ledger

log = logging.getLogger("fedskew")


@dataclass
class RoundBook:
    """One round's bookkeeping: the clients whose replies the algorithm got (in order), their claimed
    samples (in all and per client), and the ``[client, reason]`` lists of failures and rejections."""

    round: int = 0
    clients: list[int] = field(default_factory=list)
    samples: float = 0.0
    claims: dict[int, float] = field(default_factory=dict)
    failed: list[list[Any]] = field(default_factory=list)
    rejected: list[list[Any]] = field(default_factory=list)

    def accept(self, cid: int, reply: Message) -> None:
        if cid not in self.clients:
            self.clients.append(cid)
        samples = float(reply.metrics.get("num_samples", 0.0))
        self.samples += samples
        self.claims[cid] = self.claims.get(cid, 0.0) + samples

    def reject(self, cid: int, reason: str) -> None:
        """The server half dropped a reply it had accepted (an outlying update, a robust rule's cut)."""
        self.rejected.append([cid, reason])
        if cid in self.clients:
            self.clients.remove(cid)
        self.samples -= self.claims.pop(cid, 0.0)


@dataclass
class Delivery:
    """One job's way back: the job, the client's fate this round, the reply as it stands and what the
    exchange knows of the task (the method's reply spec and scalar ranges, the largest reply)."""

    job: ClientJob
    fate: str | None
    reply: Any
    task: Task


@dataclass(frozen=True)
class Task:
    """What a round's checks need to know of the task and the federation."""

    name: str
    spec: Any
    scalars: dict[str, tuple[float, float | None]]
    num_classes: int
    max_bytes: int
    sample_limit: Callable[[int], float]


@dataclass(frozen=True)
class Drop:
    """Why a reply stops at a step: ``"failed"`` (it never arrived) or ``"rejected"`` (it arrived, but
    cannot be used), with the reason recorded."""

    kind: str
    reason: str


Step = Callable[[Delivery], Drop | None]


# ---- transport: what happens to a reply on its way ----------------------------------------------------
def model_replacer(attackers: frozenset[int], scale: float) -> Step:
    """A malicious client's ``train`` reply becomes a boosted update in the opposite direction."""

    def step(d: Delivery) -> Drop | None:
        if d.task.name == "train" and d.job.cid in attackers and isinstance(d.reply, Message):
            d.reply = model_replacement(d.job.msg, d.reply, scale)
        return None

    return step


def corrupter(attack: str) -> Step:
    """A reply whose fate is ``corrupt`` is damaged on the way (fault injection)."""

    def step(d: Delivery) -> Drop | None:
        if d.fate == "corrupt" and isinstance(d.reply, Message):
            d.reply = corrupt_reply(d.reply, attack, d.task.num_classes, d.task.max_bytes)
        return None

    return step


def upload_counter(ledger: Ledger, direction: str | None, rnd: int) -> Step:
    """The reply's bytes go on the ledger (``direction`` None: this task's uploads are not counted)."""

    def step(d: Delivery) -> Drop | None:
        if direction is not None and isinstance(d.reply, Message):
            ledger.add(direction, d.reply.nbytes(), rnd)
        return None

    return step


def straggler(d: Delivery) -> Drop | None:
    """A straggler's reply arrives after the round moved on (it did the work, and used the link)."""
    return Drop("failed", "straggler") if d.fate == "straggler" else None


# ---- checks: whether an arrived reply can be used ------------------------------------------------------
def arrays_check(d: Delivery) -> Drop | None:
    """The reply's arrays against the method's spec (:func:`~fedskew.engine.replies.check_reply`)."""
    reason = check_reply(d.reply, d.task.spec, d.task.num_classes, d.task.max_bytes)
    return None if reason is None else Drop("rejected", reason)


def scalars_check(d: Delivery) -> Drop | None:
    """Each scalar metric the method declares is there and inside its range."""
    for name, (low, high) in d.task.scalars.items():
        if name not in d.reply.metrics:
            return Drop("rejected", f"metric {name!r} is missing")
        value = float(d.reply.metrics[name])
        if value < low or (high is not None and value > high):
            top = "inf" if high is None else high
            return Drop("rejected", f"metric {name!r} = {value!r} is outside [{low}, {top}]")
    return None


def samples_check(d: Delivery) -> Drop | None:
    """``num_samples``, when sent, is a whole number no larger than what the client can hold."""
    if "num_samples" not in d.reply.metrics:
        return None
    n = float(d.reply.metrics["num_samples"])
    limit = d.task.sample_limit(d.job.cid)
    if not n.is_integer():
        return Drop("rejected", f"num_samples = {n!r} is not a whole number")
    if n > limit:
        return Drop("rejected", f"claims {n:.0f} samples, but client {d.job.cid} holds at most {limit:.0f}")
    return None


CHECKS: tuple[Step, ...] = (arrays_check, scalars_check, samples_check)


class ReplyPipeline:
    """The exchange's two halves around a runner: :meth:`send` (requests down) and :meth:`receive`
    (replies up), with the run's faults, ledger and round book."""

    def __init__(self, faults: Faults, seed: int, num_clients: int, ledger: Ledger) -> None:
        self.faults = faults
        self.seed = seed
        self.ledger = ledger
        self.attackers = faults.attackers(seed, num_clients)
        self.book = RoundBook()

    def transport(self, up: str | None) -> tuple[Step, ...]:
        """The steps between a client and the server this round (``up``: the ledger's direction)."""
        return (
            model_replacer(self.attackers, self.faults.malicious_scale),
            corrupter(self.faults.attack),
            upload_counter(self.ledger, up, self.book.round),
            straggler,
        )

    def send(self, task: str, cid: int, msg: Message, down: str | None) -> str | None:
        """Count a request on the ledger and draw its client's fate; a dropout is booked as failed."""
        if down is not None:
            self.ledger.add(down, msg.nbytes(), self.book.round)
        fate = self.faults.fate(self.seed, self.book.round, cid, task)
        if fate == "dropout":
            self.book.failed.append([cid, "dropout"])
        return fate

    def receive(
        self, jobs: list[ClientJob], outcomes: Sequence[Outcome], fates: dict[int, str | None], task: Task,
        states: dict[int, dict[str, Any]], up: str | None,
    ) -> Replies:
        """The replies the algorithm gets, in job order; the others are booked as failed or rejected.
        Every client that answered has its new state in ``states``. When every reply that arrived is
        rejected the run stops: the method cannot go on without any."""
        transport = self.transport(up)
        replies: Replies = []
        arrived, refused = 0, []
        for job, outcome in zip(jobs, outcomes, strict=True):
            if isinstance(outcome, NoReply):
                self.book.failed.append([job.cid, outcome.reason])
                continue
            d = Delivery(job, fates[job.cid], outcome[0], task)
            states[job.cid] = outcome[1]
            drop = _first_drop(transport, d)
            if drop is not None:
                self.book.failed.append([job.cid, drop.reason])
                continue
            arrived += 1
            drop = _first_drop(CHECKS, d)
            if drop is not None:
                log.warning(
                    "round %d: rejected the %r reply of client %d: %s", job.round, task.name, job.cid, drop.reason
                )
                self.book.rejected.append([job.cid, drop.reason])
                refused.append(f"client {job.cid}: {drop.reason}")
                continue
            replies.append((job.cid, d.reply))
            self.book.accept(job.cid, d.reply)
        if arrived and len(refused) == arrived:
            shown = "; ".join(refused[:3]) + (f"; and {arrived - 3} more" if arrived > 3 else "")
            raise FedskewError(
                f"round {self.book.round}: every reply to {task.name!r} was rejected ({shown}); the run stops "
                "here, its metrics and last checkpoint are kept"
            )
        return replies


def _first_drop(steps: Sequence[Step], d: Delivery) -> Drop | None:
    for step in steps:
        drop = step(d)
        if drop is not None:
            return drop
    return None
