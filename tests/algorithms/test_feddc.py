"""FedDC / FedDC+ (Kim & Choi 2022): condensed uploads, fine-tuning on this round's sets only, the
ledger of 8-bit and float uploads (``wire_dtype``), the clamp fraction per round, the variable-size
reply check and the image grid."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fedskew.algorithms.feddc as feddc_module
from fedskew.algorithms.feddc import FedDC, FedDCPlus
from fedskew.condense import SyntheticSet, UInt8Set
from fedskew.condense.grids import image_grid, save_image_grid
from fedskew.config import typed_config
from fedskew.core.message import Message
from fedskew.core.params import build_params
from fedskew.engine.replies import check_reply
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.feddc import feddc_config, run_recording
from tests.helpers.spies import record_amps


def model_bytes(sim: RoundLoop) -> int:
    return sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())


# ---- the engine's check of variable-size replies ---------------------------------------------------

SPEC = {
    "w": ((2,), torch.float32),
    "syn.images": ((-1, 1, 2, 2), torch.uint8),
    "syn.labels": ((-1,), torch.int64),
}


def reply(n_images: int, n_labels: int, side: int = 2) -> Message:
    return Message(arrays={
        "w": torch.zeros(2),
        "syn.images": torch.zeros((n_images, 1, side, side), dtype=torch.uint8),
        "syn.labels": torch.zeros(n_labels, dtype=torch.int64),
    })


def test_wildcard_dimension_accepts_any_count_but_ties_arrays_together() -> None:
    assert check_reply(reply(0, 0), SPEC, 4, 10_000) is None
    assert check_reply(reply(7, 7), SPEC, 4, 10_000) is None
    assert "wildcard -1" in str(check_reply(reply(3, 2), SPEC, 4, 10_000))
    assert "has shape" in str(check_reply(reply(3, 3, side=3), SPEC, 4, 10_000))  # fixed dims stay exact
    bad_rank = reply(2, 2)
    bad_rank.arrays["syn.labels"] = torch.zeros((2, 1), dtype=torch.int64)
    assert "has shape" in str(check_reply(bad_rank, SPEC, 4, 10_000))


# ---- parameters ------------------------------------------------------------------------------------


def test_defaults_are_the_papers() -> None:
    p = FedDC.Params()
    assert (p.lr, p.weight_decay, p.batch_size, p.local_epochs) == (0.01, 1e-3, 64, 1)
    assert (p.condense_iterations, p.ipc, p.image_lr, p.clip_norm, p.real_batch) == (500, 1, 3.0, 10.0, 256)
    assert (p.distance, p.init, p.image_momentum, p.image_weight_decay) == ("cosine", "noise", 0.0, 0.0)
    assert (p.server.epochs, p.server.lr) == (10, 0.01)


def test_feddc_plus_differs_only_in_the_condensation_optimiser() -> None:
    base, plus = dataclasses.asdict(FedDC.Params()), dataclasses.asdict(FedDCPlus.Params())
    differ = {k for k in base if base[k] != plus[k]}
    assert differ == {"image_momentum", "image_weight_decay"}
    assert (plus["image_momentum"], plus["image_weight_decay"]) == (0.9, 4e-5)
    fed = RoundLoop(typed_config(feddc_config()), Path("/nonexistent")).fed.info
    gm = dataclasses.asdict(FedDC(build_params(FedDC.Params, {}), fed).gm_config())
    gm_plus = dataclasses.asdict(FedDCPlus(build_params(FedDCPlus.Params, {}), fed).gm_config())
    assert {k for k in gm if gm[k] != gm_plus[k]} == {"momentum", "weight_decay"}
    assert (gm["inner_loop"], gm["outer_loop"], gm["distance"]) == (0, 1, "cosine")


# ---- a run -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["feddc", "feddc_plus"])
def test_finetunes_on_this_rounds_sets_only_and_counts_uint8_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    sim, records, _, uploads, tuned = run_recording(feddc_config(name), tmp_path / "r", monkeypatch)

    c, h, w = sim.fed.info.image_shape
    for rec, replies, syn in zip(records, uploads, tuned, strict=True):
        counts = [int(m.arrays["syn.labels"].shape[0]) for _, m in replies]
        # ipc 1 per class the client holds
        held = [int((sim.fed.client_data(cid)[1].bincount() > 0).sum()) for cid, _ in replies]
        assert counts == held
        assert len(syn) == sum(counts) == rec["synthetic_images"]
        assert all(m.arrays["syn.images"].dtype == torch.uint8 for _, m in replies)
        expected = len(replies) * model_bytes(sim) + sum(counts) * (c * h * w + 8)
        assert rec["bytes_client_to_server"] == expected
        assert rec["bytes_server_to_client"] == len(replies) * model_bytes(sim)
    # Round 2's fine-tuning set is round 2's uploads, not the union with round 1's.
    round2 = uploads[1]
    assert torch.equal(tuned[1].labels, torch.cat([m.arrays["syn.labels"] for _, m in round2]))
    state = sim.server.state
    assert set(state["syn_owner"].tolist()) == {cid for cid, _ in round2}
    assert state["syn_images"].dtype == torch.uint8 and state["syn_images"].shape[0] == len(tuned[1])
    # The uploaded images decode to exactly what the server trained on.
    first = round2[0][1]
    decoded = SyntheticSet.from_uint8(
        UInt8Set(first.arrays["syn.images"], first.arrays["syn.labels"]), sim.fed.info.mean,
        sim.fed.info.std,
    )
    assert torch.equal(tuned[1].images[: len(decoded)], decoded.images)
    metrics = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all("synthetic_images" in r and "server_loss" in r for r in metrics)


def test_no_reply_keeps_the_model(tmp_path: Path) -> None:
    sim = RoundLoop(typed_config(feddc_config()), tmp_path / "r", progress=False)
    before = {k: v.clone() for k, v in sim.server.model.state_dict().items()}
    sim.algorithm.aggregate(sim.server, [])
    assert all(torch.equal(before[k], v) for k, v in sim.server.model.state_dict().items())
    assert sim.server.metrics["synthetic_images"] == 0


# ---- image grid --------------------------------------------------------------------------------------


def test_image_grid_one_row_per_class(tmp_path: Path) -> None:
    images = torch.arange(5 * 3 * 4 * 4, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(5, 3, 4, 4)
    labels = torch.tensor([2, 0, 2, 2, 0])
    grid = image_grid(images, labels, pad=1)
    assert grid.shape == (1 + 2 * 5, 1 + 3 * 5, 3)  # two classes, at most three images each
    assert np.array_equal(grid[1:5, 1:5], images[1].permute(1, 2, 0).numpy())  # class 0 first
    assert np.array_equal(grid[6:10, 11:15], images[3].permute(1, 2, 0).numpy())
    out = save_image_grid(images[:, :1], labels, tmp_path / "sub" / "grid.png", scale=3)
    with Image.open(out) as im:
        assert im.mode == "L" and im.size == (2 + 3 * (12 + 2), 2 + 2 * (12 + 2))


def test_bf16_condenses_in_bf16_and_keeps_uint8_uploads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amps = record_amps(monkeypatch, feddc_module, "gradient_matching")
    sim = RoundLoop(typed_config({**feddc_config(), "amp": "bf16"}), tmp_path / "bf16", progress=False)
    records = sim.run().records
    assert amps and set(amps) == {"bf16"}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records)
    assert sim.server.state["syn_images"].dtype == torch.uint8


def test_feddc_averages_through_the_aggregation_table(tmp_path: Path) -> None:
    """FedDC's model average follows [algorithm.aggregation], as every model-averaging method's does."""
    mean = RoundLoop(typed_config(feddc_config()), tmp_path / "mean", progress=False)
    mean.run()
    median = RoundLoop(typed_config(feddc_config(aggregation={"rule": "median"})), tmp_path / "median", progress=False)
    median.run()
    a, b = mean.server.model.state_dict(), median.server.model.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())


# ---- wire_dtype: what the images travel as ---------------------------------------------------------


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("wire", ["float32", "float16"])
def test_float_wires_carry_the_clients_images_to_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wire: str
) -> None:
    dtype = getattr(torch, wire)
    sim, records, made, uploads, tuned = run_recording(feddc_config(wire_dtype=wire), tmp_path / "r", monkeypatch)
    sent = [m.arrays["syn.images"] for replies in uploads for _, m in replies]
    assert len(sent) == len(made) and all(t.dtype == dtype for t in sent)
    for images, made_here in zip(sent, made, strict=True):  # clients run in order, one process
        assert torch.equal(bits(images), bits(made_here.to(dtype)))  # float32: bit for bit; float16: the cast
    for replies, syn in zip(uploads, tuned, strict=True):  # the server tunes on them, pooled by owner
        by_owner = [m.arrays["syn.images"] for _, m in sorted(replies, key=lambda r: r[0])]
        assert torch.equal(bits(syn.images), bits(torch.cat(by_owner).to(torch.float32)))
    assert sim.server.state["syn_images"].dtype == dtype
    assert all(r["wire_clamped"] == 0.0 for r in records)
    from safetensors.torch import load_file

    art = load_file(str(tmp_path / "r" / "artifacts" / "synthetic" / "round_0002.safetensors"))
    assert art["images"].dtype == torch.uint8  # audit and image grids read pixels
    assert torch.equal(art["images"], SyntheticSet(tuned[1].images, tuned[1].labels).to_uint8(
        sim.fed.info.mean, sim.fed.info.std).images)


def test_the_ledger_counts_1_2_or_4_bytes_per_uploaded_value(tmp_path: Path) -> None:
    records = {}
    for wire in ("uint8", "float16", "float32"):
        sim = RoundLoop(typed_config(feddc_config(wire_dtype=wire)), tmp_path / wire, progress=False)
        records[wire] = sim.run().records
    c, h, w = sim.fed.info.image_shape
    images = [r["synthetic_images"] for r in records["uint8"]]
    assert all(n > 0 for n in images)
    for k, wire in ((1, "uint8"), (2, "float16"), (4, "float32")):
        assert [r["synthetic_images"] for r in records[wire]] == images  # the same sets whatever the wire
        # each client sends its model back (as many bytes as came down) and n images and int64 labels
        assert [r["bytes_client_to_server"] for r in records[wire]] == [
            r["bytes_server_to_client"] + n * (c * h * w * k + 8) for r, n in zip(records[wire], images, strict=True)
        ]


@pytest.mark.slow
def test_clamp_fraction_per_round_and_identical_for_one_and_two_workers(tmp_path: Path) -> None:
    from fedskew.config import dump

    out = []
    for workers in (1, 2):
        path = tmp_path / f"w{workers}"
        path.mkdir()
        cfg = {**feddc_config(), "workers": workers}
        (path / "config.toml").write_text(dump(cfg))
        RoundLoop(typed_config(cfg), path, progress=False).run()
        out.append((path / "metrics.jsonl").read_bytes())
    assert out[0] == out[1]
    records = [json.loads(line) for line in out[0].decode().splitlines()]
    assert all(0.0 < r["wire_clamped"] < 1.0 for r in records)  # images from noise leave the 8-bit range
