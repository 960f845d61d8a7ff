"""``fedskew audit RUN_DIR``: what the synthetic images a method sent reveal about raw client data.

Reads the synthetic sets a run saved (``artifacts/synthetic/round_NNNN.safetensors``: ``images`` uint8,
``labels``, ``clients``), rebuilds the run's federation from its ``config.toml`` (the same seed gives
the same client shards), and measures the figures of :mod:`fedskew.metrics.privacy`. Writes
``audit.json`` in the run folder.
"""

from __future__ import annotations

import json
import tomllib
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
from fedskew.metrics.privacy import auc, nearest_neighbours, ssim
from fedskew.progress import progress_bar
from fedskew.runs import AUDIT_FILE, find_runs, run_config_path, synthetic_dir, synthetic_files


@dataclass
class AuditResult:
    """Figures of one run (distances are RMSE in [0, 1] pixel units)."""

    label: str
    algorithm: str
    synthetic_images: int
    rounds: int
    syn_nn_rmse_median: float
    heldout_nn_rmse_median: float
    nn_ratio: float
    syn_nn_ssim_mean: float
    heldout_nn_ssim_mean: float
    mia_auc: float
    mia_members: int


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


def _pixels(x: torch.Tensor, fed: Federation) -> torch.Tensor:
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


def _measure(config: RunConfig, fed: Federation, g: torch.Generator, images: torch.Tensor, labels: torch.Tensor,
             clients: torch.Tensor, senders: list[int], rounds: int, epochs: int, max_images: int,
             bar: Any) -> AuditResult:
    syn = images.float() / 255.0
    # Nearest real training image of the sending client, for synthetic and held-out images.
    syn_d, syn_s, ho_d, ho_s = [], [], [], []
    bar.set_postfix_str("nearest real images")
    for k in senders:
        sel = clients == k
        x_k, _ = fed.client_data(int(k))
        real = _pixels(x_k, fed)
        d, i = nearest_neighbours(syn[sel], real)
        syn_d.append(d)
        syn_s.append(ssim(syn[sel], real[i]))
        ho_idx = _heldout_like(fed, labels[sel], g)
        if len(ho_idx):
            ho = _pixels(fed.x_test[ho_idx], fed)
            d2, i2 = nearest_neighbours(ho, real)
            ho_d.append(d2)
            ho_s.append(ssim(ho, real[i2]))
        bar.update(1)
    sd, hd = torch.cat(syn_d), torch.cat(ho_d)

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
        syn_nn_ssim_mean=float(torch.cat(syn_s).mean()),
        heldout_nn_ssim_mean=float(torch.cat(ho_s).mean()),
        mia_auc=mia,
        mia_members=len(member_idx),
    )


def audit(
    paths: list[Path], data_dir: str | None = None, max_images: int = 2000, epochs: int = 50, progress: bool = True
) -> list[AuditResult]:
    """Audit every run folder under ``paths`` that holds synthetic images; writes ``audit.json`` in each."""
    results = []
    for run in find_runs(paths):
        if not synthetic_dir(run).exists():
            continue
        res = audit_run(run, data_dir, max_images, epochs, progress)
        (run / AUDIT_FILE).write_text(json.dumps(asdict(res), indent=2) + "\n")
        results.append(res)
    if not results:
        raise FedskewError(f"no run under {', '.join(map(str, paths))} holds synthetic images to audit")
    return results


AUDIT_LEGEND = (
    "NN RMSE: median distance (pixels in [0, 1]) to the nearest real training image of the sending client;\n"
    "ratio < 1: synthetic images sit closer to client images than held-out real images do.\n"
    "MIA AUC: loss-threshold membership inference on a model trained on the synthetic images (0.5 = no leak)."
)

AUDIT_HEADERS = [
    "run", "images", "NN RMSE synthetic", "NN RMSE held-out", "ratio", "SSIM synthetic", "SSIM held-out", "MIA AUC",
]


def audit_cells(r: AuditResult) -> list[str]:
    """One table row of an audit result, in the order of :data:`AUDIT_HEADERS`."""
    return [
        r.label, str(r.synthetic_images), f"{r.syn_nn_rmse_median:.3f}", f"{r.heldout_nn_rmse_median:.3f}",
        f"{r.nn_ratio:.2f}", f"{r.syn_nn_ssim_mean:.3f}", f"{r.heldout_nn_ssim_mean:.3f}", f"{r.mia_auc:.3f}",
    ]


def read_audit(path: Path) -> AuditResult:
    """Read an ``audit.json`` written by :func:`audit`; a damaged file is a one-line error naming it."""
    try:
        return AuditResult(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as e:
        raise FedskewError(f"cannot read {path}: {e}") from None


def format_audit(results: list[AuditResult]) -> str:
    """A Markdown table of audit results."""
    head = "| " + " | ".join(AUDIT_HEADERS) + " |\n" + "|---" * len(AUDIT_HEADERS) + "|"
    return "\n".join([head, *("| " + " | ".join(audit_cells(r)) + " |" for r in results)])
