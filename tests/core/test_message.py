import pytest
import torch

from fedskew.core.errors import FedskewError
from fedskew.core.message import Message


def test_bytes_round_trip_is_lossless() -> None:
    m = Message(
        arrays={"w": torch.randn(3, 4), "img": torch.randint(0, 255, (2, 1, 4, 4), dtype=torch.uint8),
                "y": torch.tensor([1, 2], dtype=torch.int64), "empty": torch.zeros(0)},
        config={"lr": 0.1, "task": "train", "on": True},
        metrics={"num_samples": 12.0, "loss": float("nan")},
    )
    back = Message.from_bytes(m.to_bytes())
    assert set(back.arrays) == set(m.arrays)
    for k in m.arrays:
        assert torch.equal(back.arrays[k], m.arrays[k]) and back.arrays[k].dtype == m.arrays[k].dtype
    assert back.config == m.config and back.metrics["num_samples"] == 12.0
    assert back.metrics["loss"] != back.metrics["loss"]  # NaN survives, so the guard can reject it
    assert back.nbytes() == m.nbytes()


def test_garbage_is_a_clear_error_not_code_execution() -> None:
    import pickle

    with pytest.raises(FedskewError, match="undecodable"):
        Message.from_bytes(pickle.dumps({"evil": 1}))
    with pytest.raises(FedskewError, match="undecodable"):
        Message.from_bytes(b"\x00" * 4)
