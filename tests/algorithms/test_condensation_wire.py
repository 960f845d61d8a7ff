"""How condensation methods upload their sets (``wire_dtype``): the three formats, the clamp fraction the
8-bit one reports, the reply schema, the server's decoding, and a resumed run with float uploads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ClientContext, FederationInfo, ModelSpec
from fedskew.algorithms.condensation.wire import (
    SYN_IMAGES,
    SYN_LABELS,
    WIRE_CLAMPED,
    as_uint8,
    decode_images,
    round_clamped,
    synthetic_reply_spec,
    synthetic_upload,
)
from fedskew.condense import SyntheticSet
from fedskew.config import typed_config
from fedskew.core.message import Message
from fedskew.engine.replies import check_reply
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly

MEAN, STD = (0.5,), (0.25,)
"""Pixel p = (x * 0.25 + 0.5) * 255: x = -2 is pixel 0 and x = 2 pixel 255, both representable."""


def client(shape: tuple[int, int, int] = (1, 2, 2)) -> ClientContext:
    fed = FederationInfo(num_clients=1, num_classes=2, model=ModelSpec("mlp", shape[0], 2, shape[1]), seed=0,
                         mean=MEAN, std=STD, image_shape=shape)
    return ClientContext(cid=0, round=1, x=torch.zeros(0, *shape), y=torch.zeros(0, dtype=torch.int64), fed=fed)


def tiny_set() -> SyntheticSet:
    # 8 values: -2.1 and -5 fall below pixel 0, 2.01 above pixel 255; -2 and 2 sit on the ends: 3 clamped.
    images = torch.tensor([[[[-2.1, -2.0], [0.0, 2.01]]], [[[2.0, -5.0], [0.3, -0.7]]]])
    return SyntheticSet(images, torch.tensor([0, 1]))


def test_clamp_fraction_is_the_hand_count_of_values_outside_the_8_bit_range() -> None:
    syn = tiny_set()
    assert syn.clamped_fraction(MEAN, STD) == 3 / 8
    arrays, scalars = synthetic_upload(syn, client(), "uint8")
    assert scalars == {WIRE_CLAMPED: 3 / 8}
    assert arrays[SYN_IMAGES].dtype == torch.uint8
    assert arrays[SYN_IMAGES].flatten().tolist() == [0, 0, 128, 255, 255, 0, 147, 83]
    for wire in ("float16", "float32"):
        assert synthetic_upload(syn, client(), wire)[1] == {WIRE_CLAMPED: 0.0}
    empty, scalars = synthetic_upload(None, client(), "float16")
    assert empty[SYN_IMAGES].shape == (0, 1, 2, 2) and empty[SYN_IMAGES].dtype == torch.float16
    assert empty[SYN_LABELS].dtype == torch.int64 and scalars == {WIRE_CLAMPED: 0.0}


def test_the_round_weights_each_replys_clamp_fraction_by_its_pixel_values() -> None:
    def upload(n_images: int, clamped: float) -> Message:
        return Message(arrays={SYN_IMAGES: torch.zeros(n_images, 1, 2, 2, dtype=torch.uint8)},
                       metrics={WIRE_CLAMPED: clamped})

    # 2 images x 4 values with 3 clamped, 6 x 4 with half of them, 0 images: (3 + 12) / 32.
    assert round_clamped([(4, upload(2, 3 / 8)), (1, upload(6, 0.5)), (2, upload(0, 0.0))]) == 15 / 32
    assert round_clamped([(2, upload(0, 0.0))]) == 0.0 and round_clamped([]) == 0.0


def test_float32_arrives_bit_for_bit_float16_as_the_cast_uint8_as_before() -> None:
    syn = SyntheticSet(torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(1)) * 3, torch.tensor([0, 1, 1]))
    arrays, _ = synthetic_upload(syn, client(), "float32")
    got = decode_images(arrays[SYN_IMAGES], arrays[SYN_LABELS], MEAN, STD)
    assert got is not None and got.images.dtype == torch.float32
    assert torch.equal(got.images.view(torch.int32), syn.images.view(torch.int32))
    assert got.images.data_ptr() != arrays[SYN_IMAGES].data_ptr()  # a copy: training never aliases the pool
    arrays, _ = synthetic_upload(syn, client(), "float16")
    assert arrays[SYN_IMAGES].dtype == torch.float16 and torch.equal(arrays[SYN_IMAGES], syn.images.half())
    got = decode_images(arrays[SYN_IMAGES], arrays[SYN_LABELS], MEAN, STD)
    assert got is not None and torch.equal(got.images, syn.images.half().float())
    arrays, _ = synthetic_upload(syn, client(), "uint8")
    got = decode_images(arrays[SYN_IMAGES], arrays[SYN_LABELS], MEAN, STD)
    assert got is not None
    assert torch.equal(got.images, SyntheticSet.from_uint8(syn.to_uint8(MEAN, STD), MEAN, STD).images)
    assert decode_images(torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.int64), MEAN, STD) is None


def test_artifacts_get_8_bit_pixels_whatever_the_wire() -> None:
    syn = tiny_set()
    u = syn.to_uint8(MEAN, STD).images
    assert torch.equal(as_uint8(syn.images, syn.labels, MEAN, STD), u)
    half = SyntheticSet(syn.images.half().float(), syn.labels).to_uint8(MEAN, STD).images
    assert torch.equal(as_uint8(syn.images.half(), syn.labels, MEAN, STD), half)
    assert as_uint8(u, syn.labels, MEAN, STD) is u
    assert as_uint8(torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.int64), MEAN, STD).dtype == torch.uint8


@pytest.mark.parametrize("wire", ["uint8", "float16", "float32"])
def test_the_reply_schema_takes_only_the_configured_dtype(wire: str) -> None:
    spec = synthetic_reply_spec((1, 2, 2), wire)
    for other in ("uint8", "float16", "float32"):
        arrays, _ = synthetic_upload(tiny_set(), client(), other)
        reason = check_reply(Message(arrays=arrays), spec, 2, 10_000)
        if other == wire:
            assert reason is None
        else:
            assert reason is not None and "has dtype" in reason


@pytest.mark.parametrize("name", ["feddc", "feddm"])
def test_a_train_reply_must_carry_its_clamp_fraction_in_0_1(name: str) -> None:
    from fedskew.engine.round_loop import RoundLoop

    sim = RoundLoop(typed_config(tiny_config(algorithm={"name": name})), Path("/nonexistent"))
    assert sim.algorithm.reply_scalars("train", sim.server) == {"num_samples": (0.0, None), WIRE_CLAMPED: (0.0, 1.0)}
    assert WIRE_CLAMPED not in sim.algorithm.reply_scalars("evaluate", sim.server)


def feddm_config(rounds: int, wire: str) -> dict[str, Any]:
    algo = {"name": "feddm", "condense_iterations": 3, "ipc": 2, "wire_dtype": wire,
            "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}
    return tiny_config(rounds=rounds, checkpoint_every=1, algorithm=algo)


@pytest.mark.parametrize("wire", ["float16", "float32"])
def test_a_float_pool_is_checkpointed_in_its_wire_dtype_and_resumes_exactly(tmp_path: Path, wire: str) -> None:
    full = assert_resumes_exactly(tmp_path, lambda rounds: feddm_config(rounds, wire))
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert all(r[WIRE_CLAMPED] == 0.0 and r["synthetic_images"] > 0 for r in records)
    state = torch.load(full / "checkpoints" / "last.pt", weights_only=True)["server_state"]
    assert state["syn_images"].dtype == getattr(torch, wire)
