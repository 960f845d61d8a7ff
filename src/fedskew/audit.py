"""``fedskew audit RUN_DIR``: what the synthetic images a method sent reveal about raw client data.

Reads the synthetic sets a run saved (``artifacts/synthetic/round_NNNN.safetensors``: ``images`` uint8,
``labels``, ``clients``), rebuilds the run's federation from its ``config.toml`` (the same seed gives
the same client shards), and measures the figures of :mod:`fedskew.metrics.privacy`. Writes
``audit.json`` in the run folder. With ``attack`` (``--attack dlg|idlg``), a run that sent no images (a
weight-sharing method) is scored on the same measures through a gradient-inversion attack on its first
update instead (:mod:`fedskew.attack`); its ``audit.json`` holds a list of rows, one per privacy setting.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedskew.components.trainer import LocalConfig, train_local
from fedskew.config.schema import RunConfig, typed_config
from fedskew.core.errors import FedskewError
from fedskew.core.seeding import seeded_init, torch_generator
from fedskew.engine.federation import Federation, federation_for
from fedskew.metrics.privacy import auc, nearest_neighbours, psnr, ssim
from fedskew.progress import progress_bar
from fedskew.runs import AUDIT_FILE, find_runs, run_config_path, synthetic_dir, synthetic_files

UPLOADS = "synthetic images"
"""What an upload audit scores (:attr:`AuditResult.leak`)."""


@dataclass
class AuditResult:
    """Figures of one run, or of one attack on it (distances are RMSE in [0, 1] pixel units).

    ``leak`` says what was scored: ``synthetic images`` (the uploads themselves), or an attack's
    reconstructions (``DLG on gradient``, with the privacy applied); ``synthetic_images`` then counts the
    reconstructions, and ``mia_auc`` is None (no model is trained on them). ``syn_nn_psnr_mean``: the mean
    PSNR of each scored image and its nearest client image (None in audits written before it was measured).
    ``attack``: the attack's settings and its own figures (:func:`fedskew.attack.attack_config`).
    """

    label: str
    algorithm: str
    synthetic_images: int
    rounds: int
    syn_nn_rmse_median: float
    heldout_nn_rmse_median: float
    nn_ratio: float
    syn_nn_ssim_mean: float
    heldout_nn_ssim_mean: float
    mia_auc: float | None
    mia_members: int
    leak: str = UPLOADS
    syn_nn_psnr_mean: float | None = None
    heldout_nn_psnr_mean: float | None = None
    attack: dict[str, Any] | None = None


def load_synthetic(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """All saved synthetic images (uint8), labels and sending clients of a run, and the round count."""
    from safetensors.torch import load_file

    files = synthetic_files(run_dir)
    if not files:
        raise FedskewError(
            f"{run_dir} holds no synthetic images (artifacts/synthetic/): only methods that send condensed "
            "data (feddc, feddc_plus, feddm, fedaf, hfldd) can be audited"
        )
    imgs, labels, clients = [], [], []
    for f in files:
        try:
            t = load_file(str(f))
        except Exception as e:
            raise FedskewError(f"cannot read {f}: {e}") from None
        imgs.append(t["images"])
        labels.append(t["labels"])
        clients.append(t["clients"])
    return torch.cat(imgs), torch.cat(labels), torch.cat(clients), len(files)


def to_pixels(x: torch.Tensor, fed: Federation) -> torch.Tensor:
    """Normalised tensors back to [0, 1] pixels."""
    mean = torch.tensor(fed.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(fed.info.std).view(1, -1, 1, 1)
    return (x * std + mean).clamp(0, 1)


def _heldout_like(fed: Federation, labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Indices of test images with the same label multiset as ``labels`` (as far as the test set allows)."""
    out = []
    for c in labels.unique().tolist():
        pool = (fed.y_test == c).nonzero().flatten()
        need = int((labels == c).sum())
        if len(pool) == 0:
            continue
        out.append(pool[torch.randint(len(pool), (need,), generator=g)])
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def audit_run(run_dir: Path, data_dir: str | None = None, max_images: int = 2000, epochs: int = 50,
              progress: bool = True) -> AuditResult:
    """Measure one run; see the module docstring. ``progress``: a bar on standard error (plain lines when it is
    not a terminal, :func:`fedskew.progress.progress_bar`), one step per sending client, the training of the
    attacked model and the membership inference."""
    cfg_path = run_config_path(run_dir)
    cfg: dict[str, Any] = tomllib.loads(cfg_path.read_text())
    images, labels, clients, rounds = load_synthetic(run_dir)
    config = typed_config(cfg)  # imports the run's plug-ins first: its dataset or model may be a plug-in's
    seed = config.run.seed
    fed = federation_for(config, data_dir)
    g = torch_generator(seed, "audit")
    if len(images) > max_images:
        keep = torch.randperm(len(images), generator=g)[:max_images]
        images, labels, clients = images[keep], labels[keep], clients[keep]
    senders = clients.unique().tolist()
    with progress_bar(total=len(senders) + 2, desc=f"audit {run_dir.name}", unit="step", enabled=progress) as bar:
        return _measure(config, fed, g, images, labels, clients, senders, rounds, epochs, max_images, bar)


@dataclass
class Closeness:
    """How close a set of images sits to a client's real images: per image, the RMSE to the nearest one, the
    SSIM of that pair and its PSNR; ``nearest``: the index of that image among the client's."""

    rmse: torch.Tensor
    ssim: torch.Tensor
    psnr: torch.Tensor
    nearest: torch.Tensor


def closeness(images: torch.Tensor, real: torch.Tensor) -> Closeness:
    """:class:`Closeness` of ``images`` to ``real`` (both pixels in [0, 1], (N, C, H, W)): the measures every
    audit row is made of, for uploads and for an attack's reconstructions alike."""
    d, i = nearest_neighbours(images, real)
    return Closeness(rmse=d, ssim=ssim(images, real[i]), psnr=psnr(d), nearest=i)


def heldout_closeness(fed: Federation, real: torch.Tensor, labels: torch.Tensor,
                      g: torch.Generator) -> Closeness | None:
    """:func:`closeness` of held-out test images (the labels of ``labels``) to a client's ``real`` images: what
    an image that never saw the client scores (None when the test set has none of those classes)."""
    idx = _heldout_like(fed, labels, g)
    return closeness(to_pixels(fed.x_test[idx], fed), real) if len(idx) else None


def _measure(config: RunConfig, fed: Federation, g: torch.Generator, images: torch.Tensor, labels: torch.Tensor,
             clients: torch.Tensor, senders: list[int], rounds: int, epochs: int, max_images: int,
             bar: Any) -> AuditResult:
    syn = images.float() / 255.0
    # Nearest real training image of the sending client, for synthetic and held-out images.
    sent: list[Closeness] = []
    held: list[Closeness] = []
    bar.set_postfix_str("nearest real images")
    for k in senders:
        sel = clients == k
        real = to_pixels(fed.client_data(int(k))[0], fed)
        sent.append(closeness(syn[sel], real))
        ho = heldout_closeness(fed, real, labels[sel], g)
        if ho is not None:
            held.append(ho)
        bar.update(1)
    sd, hd = torch.cat([c.rmse for c in sent]), torch.cat([c.rmse for c in held])

    # Membership inference: loss threshold on a model trained only on the synthetic images.
    mean = torch.tensor(fed.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(fed.info.std).view(1, -1, 1, 1)
    x_syn = (syn - mean) / std
    model = seeded_init(fed.info.model.build, config.run.seed, "audit-model")
    bar.set_postfix_str(f"training the attacked model ({epochs} epochs)")
    train_local(model, x_syn, labels, LocalConfig(epochs=epochs, batch_size=256, lr=0.01, momentum=0.9), g)
    bar.update(1)
    bar.set_postfix_str("membership inference")
    member_idx = torch.cat([torch.arange(fed.offsets[k], fed.offsets[k + 1]) for k in senders])
    if len(member_idx) > max_images:
        member_idx = member_idx[torch.randperm(len(member_idx), generator=g)[:max_images]]
    members_y = fed.y[member_idx]
    non_idx = _heldout_like(fed, members_y, g)
    model.eval()
    with torch.inference_mode():
        m_loss = F.cross_entropy(model(fed.x[member_idx]), members_y, reduction="none")
        n_loss = F.cross_entropy(model(fed.x_test[non_idx]), fed.y_test[non_idx], reduction="none")
    mia = auc(-m_loss.numpy(), -n_loss.numpy())
    bar.update(1)

    ho_med = float(hd.median())
    return AuditResult(
        label=config.label,
        algorithm=config.algorithm.name,
        synthetic_images=len(images),
        rounds=rounds,
        syn_nn_rmse_median=float(sd.median()),
        heldout_nn_rmse_median=ho_med,
        nn_ratio=float(sd.median()) / ho_med if ho_med > 0 else float("nan"),
        syn_nn_ssim_mean=float(torch.cat([c.ssim for c in sent]).mean()),
        heldout_nn_ssim_mean=float(torch.cat([c.ssim for c in held]).mean()),
        mia_auc=mia,
        mia_members=len(member_idx),
        syn_nn_psnr_mean=float(torch.cat([c.psnr for c in sent]).mean()),
        heldout_nn_psnr_mean=float(torch.cat([c.psnr for c in held]).mean()),
    )


Attacker = Callable[[Path], list[AuditResult]]
"""What scores a run that sent no images (:func:`fedskew.attack.attack_run` with its settings bound)."""


def audit(
    paths: list[Path], data_dir: str | None = None, max_images: int = 2000, epochs: int = 50, progress: bool = True,
    attacker: Attacker | None = None,
) -> list[AuditResult]:
    """Audit every run folder under ``paths`` that holds synthetic images; with ``attacker``, attack every other
    run too (a weight-sharing method's: one row per privacy setting). Writes ``audit.json`` in each (the row,
    or the attack's list of rows)."""
    results: list[AuditResult] = []
    for run in find_runs(paths):
        payload: Any
        if synthetic_dir(run).exists():
            rows = [audit_run(run, data_dir, max_images, epochs, progress)]
            payload = asdict(rows[0])
        elif attacker is not None:
            rows = attacker(run)
            payload = [asdict(r) for r in rows]
        else:
            continue
        (run / AUDIT_FILE).write_text(json.dumps(payload, indent=2) + "\n")
        results.extend(rows)
    if not results:
        raise FedskewError(f"no run under {', '.join(map(str, paths))} holds synthetic images to audit"
                           + ("" if attacker is not None else " (--attack dlg or idlg scores weight-sharing runs)"))
    return results


AUDIT_LEGEND = (
    "scored: the synthetic images a client sent, or an attack's reconstructions of its images from its first\n"
    "update (DLG / iDLG on a gradient or update, with the privacy named).\n"
    "NN RMSE: median distance (pixels in [0, 1]) from each scored image to the nearest real training image of the\n"
    "client; SSIM, PSNR (dB): means over those nearest pairs. held-out: the same for real test images of the same\n"
    "classes; ratio < 1: the scored images sit closer to client images than held-out real images do.\n"
    "MIA AUC: loss-threshold membership inference on a model trained on the synthetic images (0.5 = no leak)."
)

AUDIT_HEADERS = [
    "run", "scored", "images", "NN RMSE", "NN RMSE held-out", "ratio", "SSIM", "SSIM held-out", "PSNR",
    "PSNR held-out", "MIA AUC",
]


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def audit_cells(r: AuditResult) -> list[str]:
    """One table row of an audit result, in the order of :data:`AUDIT_HEADERS`."""
    return [
        r.label, r.leak, str(r.synthetic_images), f"{r.syn_nn_rmse_median:.3f}", f"{r.heldout_nn_rmse_median:.3f}",
        f"{r.nn_ratio:.2f}", f"{r.syn_nn_ssim_mean:.3f}", f"{r.heldout_nn_ssim_mean:.3f}",
        _cell(r.syn_nn_psnr_mean, ".1f"), _cell(r.heldout_nn_psnr_mean, ".1f"), _cell(r.mia_auc, ".3f"),
    ]


def read_audit(path: Path) -> list[AuditResult]:
    """Read an ``audit.json`` written by :func:`audit` (one row, or an attack's list of rows); a damaged file
    is a one-line error naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [AuditResult(**row) for row in (data if isinstance(data, list) else [data])]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None


def format_audit(results: list[AuditResult]) -> str:
    """A Markdown table of audit results."""
    head = "| " + " | ".join(AUDIT_HEADERS) + " |\n" + "|---" * len(AUDIT_HEADERS) + "|"
    return "\n".join([head, *("| " + " | ".join(audit_cells(r)) + " |" for r in results)])
