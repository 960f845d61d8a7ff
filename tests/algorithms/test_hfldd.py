"""HFLDD: clusters on real Fashion-MNIST, headers' class coverage, the ledger, resume, the public set, the
relayed images (their artifact and audit, where KIP starts, how close they stay to real images)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

import fedskew.algorithms.hfldd as hfldd_module
from fedskew.algorithms.hfldd import auto_public_dataset, public_set
from fedskew.audit import audit_run, load_synthetic
from fedskew.condense import KIPConfig, SyntheticSet, UInt8Set, kip
from fedskew.config import dump, typed_config
from fedskew.config.schema import validate
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.seeding import torch_generator
from fedskew.engine.round_loop import RoundLoop
from fedskew.runs import synthetic_files
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly
from tests.helpers.spies import record_amps


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _header_classes(sim: RoundLoop, header: int) -> set[int]:
    own = set(np.flatnonzero(sim.fed.counts[header]).tolist())
    return own | set(sim.client_states[header].get("distilled_labels", torch.zeros(0)).tolist())


def _check_clusters(sim: RoundLoop) -> None:
    state = sim.server.state
    n = sim.fed.info.num_clients
    assert sorted(c for g in state["homogeneous"] for c in g) == list(range(n))
    assert sorted(c for g in state["heterogeneous"] for c in g) == list(range(n))
    which = {c: k for k, g in enumerate(state["homogeneous"]) for c in g}
    for cluster, header in zip(state["heterogeneous"], state["headers"], strict=True):
        assert header in cluster
        assert len({which[c] for c in cluster}) == len(cluster)  # one client per homogeneous cluster


@pytest.mark.slow
def test_one_class_clients_cluster_by_class_on_fashion_mnist(tmp_path: Path, shared_datasets: Path) -> None:
    """40 one-class clients: K-means on the soft-label divergences recovers the classes (ARI >= 0.8).

    Short pre-training (1 epoch at lr 0.05 instead of 5 at 0.01) keeps the test fast; both make the
    one-class models confident enough. One epoch at lr 0.01 does not (ARI about 0.6): the rows of A then
    differ more by how far each model got than by its class.
    """
    assert (shared_datasets / "fashion-mnist").is_dir(), f"{shared_datasets} has no fashion-mnist folder"
    cfg = tiny_config(rounds=1)
    cfg["dataset"] = {"name": "fashion_mnist"}
    cfg["partition"] = {"name": "classes_per_client", "num_clients": 40, "classes": 1}
    cfg["model"] = {"name": "cnn"}
    cfg["algorithm"] = {"name": "hfldd", "pretrain_epochs": 1, "pretrain_lr": 0.05, "kip_iterations": 5, "kip_ipc": 2}
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False, data_dir=str(shared_datasets))
    sim.run()
    true = sim.fed.counts.argmax(axis=1)
    label = {c: k for k, g in enumerate(sim.server.state["homogeneous"]) for c in g}
    ari = adjusted_rand_score(true, [label[c] for c in range(40)])
    assert ari >= 0.8, ari
    _check_clusters(sim)
    for header in sim.server.state["headers"]:
        if len(next(c for c in sim.server.state["heterogeneous"] if header in c)) > 1:
            assert len(_header_classes(sim, header)) > 1
    rec = _records(tmp_path)[0]
    assert rec["accuracy"] is not None and rec["bytes_client_to_client"] > 0


def _tiny_c1(rounds: int, **algo: Any) -> dict[str, Any]:
    cfg = tiny_config(rounds=rounds)
    cfg["partition"] = {"name": "classes_per_client", "num_clients": 8, "classes": 1}
    cfg["algorithm"] = {"name": "hfldd", "num_homogeneous": 4, "kip_iterations": 10, "kip_ipc": 3, **algo}
    return cfg


def test_headers_get_every_class_and_the_ledger_counts_kip_data_client_to_client(tmp_path: Path) -> None:
    sim = RoundLoop(typed_config(_tiny_c1(2)), tmp_path, progress=False)
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    sim.run()
    recs = _records(tmp_path)
    state = sim.server.state
    _check_clusters(sim)
    headers = state["headers"]
    members = 8 - len(headers)
    assert members > 0
    # Every header of a cluster with members now holds more classes than its own single class.
    for cluster, header in zip(state["heterogeneous"], headers, strict=True):
        assert len(_header_classes(sim, header)) == len(cluster)
        assert sim.client_states[header]["distilled_images"].dtype == torch.uint8
    # Round 1: soft labels (8 clients x 1000 public samples x 4 classes, float32) and the headers' models
    # go to the server; KIP data (3 uint8 8x8 images + 3 int64 labels per one-class member) goes
    # client-to-client, once; only the headers' models go down (pre-training needs no download).
    h = len(headers)
    assert recs[0]["bytes_client_to_client"] == members * 3 * (64 + 8)
    assert recs[0]["bytes_client_to_server"] == 8 * 1000 * 4 * 4 + h * model_bytes
    assert recs[0]["bytes_server_to_client"] == h * model_bytes
    assert recs[1]["bytes_client_to_client"] == 0
    assert recs[1]["bytes_client_to_server"] == recs[1]["bytes_server_to_client"] == h * model_bytes
    own = sum(int(sim.fed.counts[c].sum()) for c in headers)
    for rec in recs:  # headers train on own + distilled data
        assert rec["samples"] == own + members * 3
        assert rec["num_headers"] == h and sorted(rec["clients"]) == sorted(headers)
    assert recs[0]["clusters"] == state["heterogeneous"] and "clusters" not in recs[1]


@pytest.mark.parametrize(("classes", "algo", "per_member"), [
    (1, {"kip_images": 6}, 6),  # a one-class member sends kip_images images of its class
    (2, {"kip_images": 6}, 6),  # two classes: 3 each
    (2, {"kip_images": 5}, 4),  # 5 // 2 = 2 each
    (2, {"kip_images": 6, "kip_ipc": 1}, 2),  # kip_ipc, when set, is per class held
])
def test_members_distil_kip_images_split_over_the_classes_they_hold(
    tmp_path: Path, classes: int, algo: dict[str, int], per_member: int
) -> None:
    cfg = _tiny_c1(1, **algo)
    del cfg["algorithm"]["kip_ipc"]
    cfg["algorithm"].update(algo)
    cfg["partition"]["classes"] = classes
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False)
    sim.run()
    members = 8 - len(sim.server.state["headers"])
    assert members > 0
    assert sum(sim.server.state["distilled"]) == members * per_member
    assert _records(tmp_path)[0]["bytes_client_to_client"] == members * per_member * (64 + 8)


def test_hfldd_resumes_exactly(tmp_path: Path) -> None:
    assert_resumes_exactly(tmp_path, _tiny_c1)


def test_public_set_is_converted_to_the_federation_shape() -> None:
    assert auto_public_dataset((3, 32, 32)) == "fashion_mnist" and auto_public_dataset((1, 28, 28)) == "digits"
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.2, 0.2)
    x = public_set("digits", 50, 0, "", (3, 32, 32), mean, std)
    assert x.shape == (50, 3, 32, 32) and x.dtype == torch.float32
    assert torch.allclose(x[:, 0] * 0.2 + 0.5, x[:, 1] * 0.2 + 0.4, atol=1e-6)  # grey copied to every channel
    assert torch.equal(x, public_set("digits", 50, 0, "", (3, 32, 32), mean, std))
    grey = public_set("digits", 50, 0, "", (1, 8, 8), (0.0,), (1.0,))
    assert grey.min() >= 0 and grey.max() <= 1 and grey.shape == (50, 1, 8, 8)


def test_members_distil_in_the_runs_mixed_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amps = record_amps(monkeypatch, hfldd_module, "kip")
    cfg = _tiny_c1(1, kip_kernel="rf_convnet") | {"amp": "bf16"}
    records = RoundLoop(typed_config(cfg), tmp_path / "bf16", progress=False).run().records
    assert amps and set(amps) == {"bf16"}
    assert 0.0 <= records[-1]["accuracy"] <= 1.0


def _relay_run(tmp_path: Path, **algo: Any) -> RoundLoop:
    """A finished one-round run of :func:`_tiny_c1` with its config.toml, as `fedskew run` leaves it."""
    cfg = _tiny_c1(1, **algo)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.toml").write_text(dump(cfg))
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False)
    sim.run()
    return sim


def _rows(images: torch.Tensor) -> list[bytes]:
    return sorted(bytes(row.flatten().tolist()) for row in images)


def test_relayed_images_are_saved_as_they_travelled_and_fedskew_audit_reads_them(tmp_path: Path) -> None:
    sim = _relay_run(tmp_path)
    assert [f.name for f in synthetic_files(tmp_path)] == ["round_0000.safetensors"]  # the setup's relay
    images, labels, clients, rounds = load_synthetic(tmp_path)
    state = sim.server.state
    held = [sim.client_states[h] for h in state["headers"] if "distilled_images" in sim.client_states[h]]
    # Exactly the 8-bit rows the headers received, each row naming the member that sent it, in member order.
    assert images.dtype == torch.uint8 and rounds == 1
    assert _rows(images) == _rows(torch.cat([s["distilled_images"] for s in held]))
    assert sorted(labels.tolist()) == sorted(torch.cat([s["distilled_labels"] for s in held]).tolist())
    members = sorted(c for cluster, h in zip(state["heterogeneous"], state["headers"], strict=True)
                     for c in cluster if c != h)
    assert clients.tolist() == [c for c in members for _ in range(3)]  # kip_ipc 3 of one class each
    for c in members:
        assert set(labels[clients == c].tolist()) == set(np.flatnonzero(sim.fed.counts[c]).tolist())
    res = audit_run(tmp_path, epochs=2)
    assert res.algorithm == "hfldd" and res.synthetic_images == len(members) * 3 and res.rounds == 1
    # Started from real images and moved little: far closer to the members' images than held-out images are.
    assert res.nn_ratio < 0.5 and res.syn_nn_ssim_mean > res.heldout_nn_ssim_mean
    assert 0.0 <= res.mia_auc <= 1.0


def test_default_kip_init_draws_what_kip_draws_by_itself(tmp_path: Path) -> None:
    """kip_init = "real" relays exactly the images of KIP started by itself (the code before kip_init)."""
    sim = _relay_run(tmp_path)
    images, _, clients, _ = load_synthetic(tmp_path)
    fed = sim.fed.info
    for c in sorted(set(clients.tolist())):
        x, y = sim.fed.client_data(c)
        cfg = KIPConfig(iterations=10, ipc=3, lr=0.01, reg=1e-6, target_batch=256, kernel="ntk")
        alone = kip(x, y, fed.num_classes, cfg, torch_generator(fed.seed, "client", c, 0, "kip"))
        assert torch.equal(alone.to_uint8(fed.mean, fed.std).images, images[clients == c])


@pytest.mark.parametrize("init", ["real", "noise", "class_mean"])
def test_kip_init_sets_where_kip_starts_and_kip_init_cosine_says_how_close_it_stays(
    tmp_path: Path, init: str
) -> None:
    """With no KIP step the relayed images are the start, quantised: a real image (cosine 1 to it), noise
    (low cosine to every real image of the class), or the class mean plus noise (images of a class differ)."""
    sim = _relay_run(tmp_path, kip_init=init, kip_iterations=0)
    images, labels, clients, _ = load_synthetic(tmp_path)
    fed = sim.fed.info
    sent = SyntheticSet.from_uint8(UInt8Set(images, labels), fed.mean, fed.std).images
    cosine = _records(tmp_path)[0]["kip_init_cosine"]
    for c in sorted(set(clients.tolist())):
        x, _ = sim.fed.client_data(c)
        own = sent[clients == c]
        nearest = (torch.nn.functional.normalize(own.flatten(1), dim=1)
                   @ torch.nn.functional.normalize(x.flatten(1), dim=1).T).max(dim=1).values
        if init == "real":
            assert (nearest > 0.999).all()  # each is one of the member's images, up to 8-bit rounding
        elif init == "noise":
            assert (nearest < 0.6).all() and own.std() > 0.8  # standard normal pixels, clamped to 8 bits
        else:
            mean = x.mean(dim=0)
            assert ((own - mean).abs().mean(dim=(1, 2, 3)) < 0.2).all()  # the class mean plus noise (std 0.1)
            assert len(set(_rows(images[clients == c]))) == len(own)  # no two images of the class alike
    expected = {"real": (0.999, 1.0), "noise": (0.0, 0.6), "class_mean": (0.6, 0.999)}[init]
    assert expected[0] < cosine <= expected[1]


def test_kip_init_cosine_is_recorded_in_the_relay_round_and_falls_as_kip_moves_the_images(tmp_path: Path) -> None:
    moved = RoundLoop(typed_config(_tiny_c1(2, kip_lr=1.0)), tmp_path / "lr1", progress=False).run().records
    default = _records(_relay_run(tmp_path / "default").run_dir)
    assert "kip_init_cosine" not in moved[1]
    # Ten steps at KIP's lr 0.01 leave the images where they started; at lr 1 they leave it.
    assert moved[0]["kip_init_cosine"] < 0.5 < 0.99 < default[0]["kip_init_cosine"] <= 1.0


def test_bad_kip_init_values_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"^algorithm\.kip_init must be one of 'real', 'noise', 'class_mean', "
                                          r"got 'mean'$"):
        validate(_tiny_c1(1, kip_init="mean"))
    with pytest.raises(ConfigError, match=r"^algorithm\.kip_init_noise must be >= 0, got -1\.0$"):
        validate(_tiny_c1(1, kip_init_noise=-1.0))


def test_kip_refuses_a_start_set_that_does_not_fit_the_data() -> None:
    x, y = torch.randn(6, 1, 4, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    cfg = KIPConfig(iterations=1, ipc=1)
    with pytest.raises(DataError, match=r"^the start set must hold images of shape \(1, 4, 4\) with labels in"):
        kip(x, y, 3, cfg, torch.Generator(), start=SyntheticSet(torch.zeros(2, 1, 5, 5), torch.tensor([0, 1])))
    with pytest.raises(DataError, match=r"labels \[0, 3\]$"):
        kip(x, y, 3, cfg, torch.Generator(), start=SyntheticSet(torch.zeros(2, 1, 4, 4), torch.tensor([0, 3])))
