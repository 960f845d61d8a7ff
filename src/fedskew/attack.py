"""``fedskew audit --attack dlg|idlg``: what a weight-sharing method's first update gives away, scored on the
audit's measures (:mod:`fedskew.audit`), so that its row sits in one table with the condensed methods'.

What is attacked: client ``client``'s first update of the run, on the round-1 global model (the model the
run's method initialises, seeded as the run seeds it): the gradient of a batch of ``batch_size`` of the
client's images (``target = "gradient"``, FedSGD's upload and DLG's setting), or the model change after
``local_steps`` full-batch SGD steps on that batch at the method's learning rate (``target = "update"``: a
FedAvg client's update, shortened to one batch). ``batches`` batches are drawn (seeded) and attacked one by
one. The model is the run's own; ``activation = "sigmoid"`` swaps its ReLUs for sigmoids (DLG's choice; the
weights stay), a stronger case for the attacker than the model the run trains.

The rows: the update as sent without differential privacy, then one per noise multiplier as the run's
``[privacy]`` table (or ``dp_mode``, ``noise_multipliers``, ``clip``) privatises it
(:class:`fedskew.privacy.inversion.Sharing`). Each row scores the reconstructions as the audit scores
uploads (:func:`fedskew.audit.closeness`: nearest client image, its SSIM and PSNR, against held-out test
images), and records the attack's own figures: PSNR and SSIM against the image attacked, the labels found.
An image grid (the real images, then each row's reconstructions) is saved beside the result.
"""

from __future__ import annotations

import math
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedskew.algorithms.base import make_algorithm
from fedskew.audit import AuditResult, closeness, heldout_closeness, to_pixels
from fedskew.config.schema import RunConfig, typed_config
from fedskew.core.errors import ConfigError
from fedskew.core.params import MAX_STEPS, Options, check, maximums, minimums, option
from fedskew.core.seeding import torch_generator
from fedskew.core.threads import num_threads
from fedskew.engine.federation import Federation, federation_for
from fedskew.privacy.inversion import (
    InversionSettings,
    Method,
    Optimiser,
    Sharing,
    Target,
    invert,
    shared_update,
    with_sigmoids,
)
from fedskew.progress import progress_bar
from fedskew.runs import run_config_path

NAMES = {"dlg": "DLG", "idlg": "iDLG"}
GRID_COLUMNS = 16
"""Attacked images drawn in the grid at most."""


class AttackSettings(Options):
    """The settings of ``fedskew audit --attack`` (each a flag: ``iterations`` is ``--attack-iterations``,
    ``dp_mode`` is ``--dp-mode``)."""

    method: Method = option("dlg", help="dlg or idlg")
    iterations: int = option(300, help="optimiser steps per batch")
    optimizer: Optimiser = option("lbfgs", help="lbfgs or adam")
    lr: float | None = option(None, help="the attack's step size [lbfgs 1, adam 0.1]")
    batch_size: int = option(1, help="images per attacked gradient")
    batches: int = option(1, help="batches attacked, one after another")
    client: int = option(0, help="the attacked client")
    target: Target = option("gradient", help="gradient (of one batch) or update (after local steps)")
    local_steps: int = option(1, help="local SGD steps of an update")
    local_lr: float | None = option(None, help="their learning rate [the method's lr, else 0.01]")
    activation: Literal["run", "sigmoid"] = option("run", help="run (the model as trained) or sigmoid (ReLUs "
                                                               "swapped for sigmoids, as DLG does)")
    dp_mode: Literal["config", "off", "central", "local", "sample"] = option(
        "config", help="the privacy of the DP rows: config (the run's [privacy] table), off, central, local, sample")
    noise_multipliers: list[float] | None = option(None, help="noise multipliers, a row each [the run's]")
    clip: float | None = option(None, help="clipping norm [the run's privacy.clip]")

    at_least = minimums(iterations=1, batch_size=1, batches=1, client=0, local_steps=1)
    at_most = maximums(iterations=MAX_STEPS, batch_size=64, batches=1000, local_steps=1000)
    positive = ("lr", "local_lr", "clip")

    def __post_init__(self) -> None:
        super().__post_init__()
        for z in self.noise_multipliers or []:
            check(z >= 0, "noise_multipliers", z, "numbers >= 0")
        check(self.noise_multipliers is None or len(self.noise_multipliers) > 0, "noise_multipliers",
              self.noise_multipliers, "one number or more")

    def inversion(self) -> InversionSettings:
        return InversionSettings(method=self.method, iterations=self.iterations, optimizer=self.optimizer,
                                 lr=self.lr)


def sharings(settings: AttackSettings, config: RunConfig) -> list[Sharing]:
    """The rows' sharing: without privacy, then one per noise multiplier (the run's ``[privacy]`` table where
    ``settings`` leave it to the config; its ``condensation`` mode privatises no update, so gives no DP row)."""
    lr = settings.local_lr or getattr(config.algorithm.params, "lr", None) or 0.01
    base = Sharing(target=settings.target, local_steps=settings.local_steps, local_lr=float(lr))
    privacy = config.privacy
    mode = settings.dp_mode
    if mode == "config":
        mode = privacy.mode if privacy.mode in ("central", "local", "sample") else "off"
    if mode == "off":
        if settings.noise_multipliers:
            raise ConfigError("--noise-multiplier needs a privacy mode: --dp-mode central, local or sample, or a "
                              "[privacy] table with one in the audited config")
        return [base]
    clip = settings.clip or privacy.clip
    zs = settings.noise_multipliers or [privacy.noise_multiplier]
    return [base, *(Sharing(target=base.target, local_steps=base.local_steps, local_lr=base.local_lr, dp_mode=mode,
                            clip=clip, noise_multiplier=z) for z in zs)]


def attack_run(run_dir: Path, settings: AttackSettings, data_dir: str | None = None,
               progress: bool = True) -> list[AuditResult]:
    """:func:`attack_config` on the run in ``run_dir`` (its ``config.toml``); the grid goes in the run folder."""
    config = typed_config(tomllib.loads(run_config_path(run_dir).read_text()))
    return attack_config(config, settings, run_dir, data_dir, progress)


def _attacked_model(config: RunConfig, fed: Federation, activation: str) -> torch.nn.Module:
    algo = make_algorithm(config.algorithm.name, config.algorithm.params, fed.info)
    if not algo.has_global_model:
        raise ConfigError(f"{config.algorithm.name} shares no model with a server: there is no update to attack")
    model = algo.init_model()
    if activation == "sigmoid" and with_sigmoids(model) == 0:
        raise ConfigError(f"--attack-activation sigmoid: model {config.model.name!r} has no ReLU to swap")
    return model


def _pick(fed: Federation, settings: AttackSettings, seed: int) -> torch.Tensor:
    """The attacked images' indices among the client's, ``batches`` rows of ``batch_size`` (seeded)."""
    if settings.client >= fed.info.num_clients:
        raise ConfigError(f"--attack-client must be below the {fed.info.num_clients} clients, got {settings.client}")
    held = fed.offsets[settings.client + 1] - fed.offsets[settings.client]
    need = settings.batch_size * settings.batches
    if need > held:
        raise ConfigError(f"client {settings.client} holds {held} images, fewer than --attack-batch-size x "
                          f"--attack-batches = {need}")
    order = torch.randperm(held, generator=torch_generator(seed, "attack", "images", settings.client))
    return order[:need].view(settings.batches, settings.batch_size)


def attack_config(config: RunConfig, settings: AttackSettings, out: Path, data_dir: str | None = None,
                  progress: bool = True) -> list[AuditResult]:
    """Attack the first update of ``settings.client`` in the run ``config`` describes (see the module
    docstring): one :class:`~fedskew.audit.AuditResult` per privacy setting, the grid written to
    ``out/attack_<method>.png``. Computes on one thread, as a run's clients do: the same figures on any machine,
    and no threads spinning for a model this small."""
    with num_threads(1):
        return _attack(config, settings, out, data_dir, progress)


def _attack(config: RunConfig, settings: AttackSettings, out: Path, data_dir: str | None,
            progress: bool) -> list[AuditResult]:
    seed = config.run.seed
    fed = federation_for(config, data_dir)
    model = _attacked_model(config, fed, settings.activation)
    picked = _pick(fed, settings, seed)
    x_k, y_k = fed.client_data(settings.client)
    real = to_pixels(x_k, fed)
    rows = sharings(settings, config)
    held = heldout_closeness(fed, real, y_k[picked.flatten()], torch_generator(seed, "attack", "heldout"))
    steps = settings.iterations
    results, pictures = [], []
    desc = f"attack {config.label} ({NAMES[settings.method]})"
    with progress_bar(total=len(rows) * settings.batches * steps, desc=desc, unit="step", enabled=progress) as bar:
        for r, sharing in enumerate(rows):
            start = time.perf_counter()
            found, found_labels, losses, runs = [], [], [], []
            for b, idx in enumerate(picked):
                xb, yb = x_k[idx], y_k[idx]
                noise = torch_generator(seed, "attack", "noise", r, b)
                shared = shared_update(model, xb, F.one_hot(yb, fed.info.num_classes).float(), sharing, noise)
                where = f"{sharing.describe()}, batch {b + 1}/{settings.batches}"

                def on_step(_: int, loss: float, where: str = where) -> None:
                    bar.update(1)
                    bar.set_postfix_str(f"{where}, loss {loss:.3g}")

                inv = invert(model, shared, xb.shape, fed.info.num_classes, sharing, settings.inversion(),
                             torch_generator(seed, "attack", "dummy", b), on_step=on_step)
                bar.update(steps - inv.steps)
                found.append(to_pixels(inv.images, fed))
                found_labels.append(inv.labels)
                losses.append(inv.loss)
                runs.append((inv.steps, inv.evaluations))
            rec = torch.cat(found)
            pictures.append(rec)
            results.append(_row(config, settings, sharing, rec, torch.cat(found_labels), picked, real, y_k, held,
                                losses, runs, time.perf_counter() - start))
    grid = _save_grid(real[picked.flatten()], pictures, rows, settings, out)
    for res in results:
        assert res.attack is not None
        res.attack["grid"] = grid.name
    return results


def _label_accuracy(found: torch.Tensor, truth: torch.Tensor) -> float:
    """The share of the true labels found, batch by batch, as multisets (order within a batch is free)."""
    hits = sum(sum((Counter(f.tolist()) & Counter(t.tolist())).values()) for f, t in zip(found, truth, strict=True))
    return hits / truth.numel()


def _row(config: RunConfig, settings: AttackSettings, sharing: Sharing, rec: torch.Tensor, labels: torch.Tensor,
         picked: torch.Tensor, real: torch.Tensor, y_k: torch.Tensor, held: Any, losses: list[float],
         runs: list[tuple[int, int]], seconds: float) -> AuditResult:
    """One table row: the reconstructions ``rec`` scored against the client's images ``real``."""
    near = closeness(rec, real)
    b = settings.batch_size
    # Against the images attacked: each reconstruction's nearest image within its own batch.
    own = [closeness(rec[i * b:(i + 1) * b], real[idx]) for i, idx in enumerate(picked)]
    hit = torch.cat([idx[c.nearest] for idx, c in zip(picked, own, strict=True)]) == near.nearest
    ho_rmse = float(held.rmse.median()) if held is not None else math.nan
    rmse = float(near.rmse.median())
    model = " (sigmoid model)" if settings.activation == "sigmoid" else ""
    return AuditResult(
        label=config.label,
        algorithm=config.algorithm.name,
        synthetic_images=len(rec),
        rounds=1,
        syn_nn_rmse_median=rmse,
        heldout_nn_rmse_median=ho_rmse,
        nn_ratio=rmse / ho_rmse if ho_rmse > 0 else math.nan,
        syn_nn_ssim_mean=float(near.ssim.mean()),
        heldout_nn_ssim_mean=float(held.ssim.mean()) if held is not None else math.nan,
        mia_auc=None,
        mia_members=0,
        leak=f"{NAMES[settings.method]}{model} on {sharing.describe(b)}",
        syn_nn_psnr_mean=float(near.psnr.mean()),
        heldout_nn_psnr_mean=float(held.psnr.mean()) if held is not None else None,
        attack={
            **{k: getattr(settings, k) for k in ("method", "iterations", "optimizer", "batch_size", "batches",
                                                 "client", "target", "activation")},
            "lr": settings.inversion().step_size,
            "local_steps": sharing.local_steps if sharing.target == "update" else None,
            "local_lr": sharing.local_lr if sharing.target == "update" else None,
            "dp_mode": sharing.dp_mode,
            "noise_multiplier": sharing.noise_multiplier if sharing.dp_mode != "off" else None,
            "clip": sharing.clip if sharing.dp_mode != "off" else None,
            "target_psnr_mean": float(torch.cat([c.psnr for c in own]).mean()),
            "target_ssim_mean": float(torch.cat([c.ssim for c in own]).mean()),
            "nearest_is_attacked": float(hit.float().mean()),
            "label_accuracy": _label_accuracy(labels.view(-1, b), y_k[picked]),
            "loss_median": float(torch.tensor(losses).median()),
            "steps_mean": sum(s for s, _ in runs) / len(runs),
            "evaluations": sum(e for _, e in runs),
            "seconds": round(seconds, 2),
        },
    )


def _save_grid(real: torch.Tensor, pictures: list[torch.Tensor], rows: list[Sharing], settings: AttackSettings,
               out: Path) -> Path:
    """The attacked images (first row) above each row's reconstructions, at most :data:`GRID_COLUMNS` of each."""
    from fedskew.condense.grids import labelled_grid_figure, save_figure

    shown = [real[:GRID_COLUMNS], *(p[:GRID_COLUMNS] for p in pictures)]
    images = (torch.cat(shown) * 255).round().to(torch.uint8)
    labels = torch.cat([torch.full((len(s),), i) for i, s in enumerate(shown)])
    names = ["real", *(NAMES[settings.method] + (", DP " + s.describe().split("DP ", 1)[1] if s.dp_mode != "off"
                                                 else ", no DP") for s in rows)]
    fig = labelled_grid_figure(images, labels, names, title=f"{NAMES[settings.method]} on the client's first "
                                                           f"{settings.target}: real (top) vs reconstructed")
    return save_figure(fig, out / f"attack_{settings.method}.png")
