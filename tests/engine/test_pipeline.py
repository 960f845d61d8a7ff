"""The reply pipeline's steps, each on its own: no federation, no runner, no round loop."""

from __future__ import annotations

import pytest
import torch

from fedskew.config.schema import Faults
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.pipeline import (
    Delivery,
    Drop,
    ReplyPipeline,
    RoundBook,
    Task,
    arrays_check,
    corrupter,
    samples_check,
    scalars_check,
    straggler,
    upload_counter,
)
from fedskew.engine.runner import ClientJob, NoReply
from fedskew.metrics import Ledger

SPEC = {"w": ((3,), torch.float32)}
TASK = Task("train", SPEC, {"num_samples": (0.0, None)}, num_classes=4, max_bytes=10_000, sample_limit=lambda c: 50)


def reply(n: float = 10.0, w: torch.Tensor | None = None) -> Message:
    return Message(arrays={"w": torch.zeros(3) if w is None else w}, metrics={"num_samples": n})


def delivery(msg: object, fate: str | None = None, cid: int = 0) -> Delivery:
    return Delivery(ClientJob("train", cid, 1, Message(arrays={"w": torch.ones(3)}), {}), fate, msg, TASK)


def test_each_check_passes_a_good_reply_and_names_what_is_wrong_with_a_bad_one() -> None:
    assert arrays_check(delivery(reply())) is None
    assert scalars_check(delivery(reply())) is None
    assert samples_check(delivery(reply())) is None
    bad = arrays_check(delivery(reply(w=torch.full((3,), float("nan")))))
    assert bad is not None and bad.kind == "rejected" and "nan" in bad.reason.lower()
    missing = Message(arrays={"w": torch.zeros(3)}, metrics={})
    assert scalars_check(delivery(missing)) == Drop("rejected", "metric 'num_samples' is missing")
    assert samples_check(delivery(reply(2.5))) == Drop("rejected", "num_samples = 2.5 is not a whole number")
    assert samples_check(delivery(reply(51))).reason == "claims 51 samples, but client 0 holds at most 50"


def test_transport_steps_act_only_on_their_fate() -> None:
    assert straggler(delivery(reply(), fate="straggler")) == Drop("failed", "straggler")
    assert straggler(delivery(reply(), fate=None)) is None
    d = delivery(reply(), fate="corrupt")
    corrupter("nan")(d)
    assert torch.isnan(d.reply.arrays["w"]).any()
    clean = delivery(reply())
    corrupter("nan")(clean)
    assert not torch.isnan(clean.reply.arrays["w"]).any()
    ledger = Ledger()
    upload_counter(ledger, "client_to_server", 1)(delivery(reply()))
    assert ledger.round_totals(1)["bytes_client_to_server"] == 12
    upload_counter(ledger, None, 1)(delivery(reply()))  # an exchange whose uploads are already paid for
    assert ledger.round_totals(1)["bytes_client_to_server"] == 12


def test_the_pipeline_books_every_client_once_and_keeps_the_good_replies() -> None:
    pipeline = ReplyPipeline(Faults(), seed=0, num_clients=4, ledger=Ledger())
    pipeline.book = RoundBook(1)
    jobs = [ClientJob("train", c, 1, Message(arrays={"w": torch.ones(3)}), {}) for c in range(4)]
    outcomes = [(reply(10), {"s": 0}), NoReply("node lost"), (reply(2.5), {"s": 2}), (reply(20), {"s": 3})]
    states: dict[int, dict[str, int]] = {}
    replies = pipeline.receive(jobs, outcomes, dict.fromkeys(range(4)), TASK, states, "client_to_server")
    assert [cid for cid, _ in replies] == [0, 3]
    book = pipeline.book
    assert book.clients == [0, 3] and book.samples == 30
    assert book.failed == [[1, "node lost"]]
    assert book.rejected == [[2, "num_samples = 2.5 is not a whole number"]]
    assert states == {0: {"s": 0}, 2: {"s": 2}, 3: {"s": 3}}  # every client that answered keeps its state
    book.reject(3, "outlier")  # the server half's own cut takes the client and its samples back out
    assert book.clients == [0] and book.samples == 10 and book.rejected[-1] == [3, "outlier"]


def test_a_round_whose_every_arrived_reply_is_rejected_stops() -> None:
    pipeline = ReplyPipeline(Faults(), seed=0, num_clients=2, ledger=Ledger())
    pipeline.book = RoundBook(3)
    jobs = [ClientJob("train", c, 3, Message(), {}) for c in range(2)]
    with pytest.raises(FedskewError, match=r"^round 3: every reply to 'train' was rejected"):
        pipeline.receive(jobs, [(reply(2.5), {}), (reply(0.5), {})], {0: None, 1: None}, TASK, {}, None)


def test_a_dropout_is_booked_before_its_job_is_sent() -> None:
    faults = Faults(dropout=0.5)
    pipeline = ReplyPipeline(faults, seed=0, num_clients=20, ledger=Ledger())
    pipeline.book = RoundBook(1)
    fates = {c: pipeline.send("train", c, reply(), "server_to_client") for c in range(20)}
    dropped = sorted(c for c, f in fates.items() if f == "dropout")
    assert dropped and [c for c, _ in pipeline.book.failed] == dropped
    assert fates == {c: faults.fate(0, 1, c, "train") for c in range(20)}  # the run's deterministic draw
