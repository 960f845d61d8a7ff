"""Privacy checks on synthetic (condensed) images a client sent.

Three figures answer "what could the server learn about the raw images?":

- nearest-neighbour distance: for each synthetic image, the RMSE (pixel space, [0, 1]) to the closest
  real training image of the client that sent it, compared with the same distance for held-out real
  images of the same classes. Synthetic images much closer than held-out ones are near-copies.
- SSIM between each image and that nearest neighbour (1 = identical structure), and the PSNR of the pair
  (``-20 log10(RMSE)`` for pixels in [0, 1]; the gradient-inversion literature's measure).
- membership inference: a model trained on the synthetic data is attacked by thresholding its loss;
  the AUC of telling the clients' training images from held-out images (0.5 = no leak).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def nearest_neighbours(
    queries: torch.Tensor, pool: torch.Tensor, chunk: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSE to the nearest pool image, its index) for every query; images in [0, 1], any shape (N, ...)."""
    q = queries.reshape(len(queries), -1).to(torch.float64)
    p = pool.reshape(len(pool), -1).to(torch.float64)
    d = q.shape[1]
    p_sq = (p * p).sum(1)
    dists, idx = [], []
    for s in range(0, len(q), chunk):
        qs = q[s : s + chunk]
        sq = (qs * qs).sum(1, keepdim=True) - 2 * qs @ p.T + p_sq
        m, i = sq.clamp_min(0).min(dim=1)
        dists.append((m / d).sqrt())
        idx.append(i)
    return torch.cat(dists).float(), torch.cat(idx)


MAX_PSNR = 100.0
"""The PSNR of identical images (an RMSE of 1e-5 or less): a finite cap, so that means stay finite."""


def psnr(rmse: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB of image pairs in [0, 1] from their RMSE (e.g. the distances of
    :func:`nearest_neighbours`): ``-20 log10(rmse)``, capped at :data:`MAX_PSNR`."""
    return (-20 * torch.log10(rmse.double().clamp_min(10 ** (-MAX_PSNR / 20)))).float()


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    ax = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(ax**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 7, sigma: float = 1.5) -> torch.Tensor:
    """Per-pair SSIM (Wang et al. 2004) of image batches in [0, 1], shape (N, C, H, W), averaged over channels.

    The Gaussian window shrinks to the image size for small images (8x8 digits).
    """
    if a.shape != b.shape or a.dim() != 4:
        raise ValueError(f"ssim needs two (N, C, H, W) batches of one shape, got {tuple(a.shape)}, {tuple(b.shape)}")
    c, h, w = a.shape[1:]
    size = min(window, h, w)
    k = _gaussian_window(size, sigma).float().expand(c, 1, size, size).contiguous()
    a, b = a.float(), b.float()

    def filt(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, k, groups=c)

    c1, c2 = 0.01**2, 0.03**2
    mu_a, mu_b = filt(a), filt(b)
    var_a = filt(a * a) - mu_a**2
    var_b = filt(b * b) - mu_b**2
    cov = filt(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean(dim=(1, 2, 3))


def auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """Area under the ROC curve of telling members (higher score) from non-members (ties count half)."""
    from sklearn.metrics import roc_auc_score

    m = np.asarray(member_scores, dtype=np.float64)
    n = np.asarray(nonmember_scores, dtype=np.float64)
    if len(m) == 0 or len(n) == 0:
        raise ValueError("auc needs members and non-members")
    is_member = np.concatenate([np.ones(len(m)), np.zeros(len(n))])
    return float(roc_auc_score(is_member, np.concatenate([m, n])))
