"""Checkpoints: the run's state every ``checkpoint_every`` rounds and at the last, and its restore."""

from __future__ import annotations

import json
from typing import Any

import torch

from fedskew.core.device import to_cpu, to_device
from fedskew.core.errors import FedskewError
from fedskew.engine.callbacks.base import Loop, Record, RoundCallback, RoundTime
from fedskew.engine.checkpoint import load_checkpoint, save_checkpoint
from fedskew.runs import CHECKPOINTS_DIR

PRIVACY_KEY = "privacy"
"""The checkpoint entry of a private run's :meth:`~fedskew.privacy.run.RunPrivacy.state`."""


class Checkpoints(RoundCallback):
    """Saves the loop's state (:func:`save_state`) every ``checkpoint_every`` rounds and after the last round
    (``checkpoint_every = 0``: only after the last, so that a finished run can always be extended and an
    experiment's ``--resume`` continues it rather than starting it again)."""

    def round_end(self, loop: Loop, record: Record, records: list[Record], time: RoundTime) -> None:
        every, rounds = loop.config.run.checkpoint_every, loop.config.run.rounds
        if loop.round == rounds or (every > 0 and loop.round % every == 0):
            save_state(loop, records)


def save_state(loop: Loop, records: list[dict[str, Any]]) -> None:
    """The round, the global model, the server's and the clients' state, the ledger and the records."""
    server = loop.server
    payload = {
        "round": loop.round,
        "model": to_cpu(server.model.state_dict()),
        "server_state": to_device(
            {k: v for k, v in server.state.items() if not k.startswith("_")}, torch.device("cpu")
        ),
        "client_states": {str(k): v for k, v in loop.client_states.items()},
        "ledger": loop.ledger.state_dict(),
        "records": json.dumps(records),
    }
    if loop.privacy is not None:  # the accountants, the clip and the noise multiplier ([privacy])
        payload[PRIVACY_KEY] = loop.privacy.state()
    save_checkpoint(loop.run_dir / CHECKPOINTS_DIR, payload)


def restore_state(loop: Loop) -> list[dict[str, Any]]:
    """Put the last checkpoint's state back into ``loop``; its records."""
    ck = load_checkpoint(loop.run_dir / CHECKPOINTS_DIR)
    loop.round = int(ck["round"])
    loop.server.model.load_state_dict(ck["model"])
    loop.server.state.update(to_device(ck["server_state"], loop.device))
    loop.client_states = {int(k): v for k, v in ck["client_states"].items()}
    loop.ledger.load_state_dict(ck["ledger"])
    if loop.privacy is not None:
        if not isinstance(ck.get(PRIVACY_KEY), dict):
            raise FedskewError(f"{loop.run_dir / CHECKPOINTS_DIR}: the checkpoint of this private run keeps no "
                               "privacy state (its accountant): it cannot be resumed")
        loop.privacy.load_state(ck[PRIVACY_KEY])
    records: list[dict[str, Any]] = json.loads(ck["records"])
    return records
