"""Distribution matching with a differentially private real side (``privacy.mode = "condensation"``).

DM (Zhao & Bilen, WACV 2023; :mod:`.distribution_matching`) matches, at every step and for every class c,
the mean embedding of the synthetic images to the mean embedding of real images under a freshly sampled
network. Only that real-side mean touches private data, so it is the only thing privatised, as DP-MERF
(Harder, Adamczewski & Park, AISTATS 2021) privatises the data-dependent term of its mean-embedding loss
and NDPDC (Zheng & Li, "Differentially Private Dataset Condensation", ICLR 2023 submission) adds noise to
DM's real-side embeddings. At every step:

1. each real image of class c is taken with probability ``q_c = min(1, real_batch / n_c)`` (Poisson
   sampling: the subsampling of the sampled Gaussian mechanism, as in DP-SGD), so a class's batch holds
   ``real_batch`` images on average; or with one given rate ``q`` for every class (``sample_rate``), which
   keeps a small class from being taken whole at every step;
2. each taken image's embedding ``h_w'(x)`` under the step's network is clipped to L2 norm ``clip``;
3. the class sum of the clipped embeddings is released with N(0, (noise_multiplier * clip)^2) noise on
   every coordinate, and divided by the expected batch ``q_c n_c`` (``min(real_batch, n_c)``; a public number:
   the client's class counts are treated as public, as DP-SGD treats the dataset size);
4. the synthetic images are moved to lower ``sum_c || noisy mean_c - mean_{s in S_c} h_w'(s) ||^2``.

Adding or removing one real image changes one class's sum, by at most ``clip`` in L2 (the classes are
disjoint), so the vector of all the classes' sums has sensitivity ``clip`` and its release is one Gaussian
mechanism with multiplier ``noise_multiplier`` per step, subsampled at the image's class rate; every step
composes (Opacus's accountant, :class:`fedskew.privacy.accounting.Accountant`). Everything else a step uses
(the network, the DSA draw, the synthetic images) is independent of the private data given the earlier
releases, so the uploaded images are post-processing of the releases (docs/private_condensation.md).

What the guarantee needs, checked here: a network whose embedding of one image does not depend on the rest
of its batch (no BatchNorm normalising with batch statistics, :func:`couples_batch`), and a start that uses
no real image (``init = "noise"``, or a given set that is itself private). Nothing here is handed to a
batched runner: a private matching always runs as written.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedskew.condense.augment import apply_dsa, sample_dsa_params
from fedskew.condense.distribution_matching import (
    DM_UNBATCHED,
    REAL_CHUNK,
    DMConfig,
    ExtraLoss,
    at_least_float32,
    couples_batch,
    dm_start,
    image_step,
    prepared,
    segment_means,
)
from fedskew.condense.samplers import ModelSampler
from fedskew.condense.synthetic import SyntheticSet, model_features
from fedskew.core.device import Precision
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.handoff import say_unbatched
from fedskew.models.layout import as_model_format, is_channels_last
from fedskew.privacy.mechanisms import add_gaussian_noise, clip_rows
from fedskew.progress import progress_bar

COUPLED = (
    'privacy.mode = "condensation" needs a model that embeds each image on its own: this one has BatchNorm '
    "normalising with batch statistics, so one image changes the others' embeddings (use e.g. "
    'model.net_norm = "instancenorm")'
)
"""The refusal of a network that couples its batch."""
REAL_START = (
    'privacy.mode = "condensation" needs init = "noise": a start from real images ("real", "mean") uploads '
    "what no noise covers"
)
"""The refusal of a start drawn from the real images."""


def class_sample_rates(counts: Sequence[int], real_batch: int, rate: float | None = None) -> list[float]:
    """Each class's Poisson sampling rate: ``min(1, real_batch / n_c)``, ``real_batch`` images on average (a
    class of at most ``real_batch`` images is taken whole at every step); or ``rate`` for every class."""
    if any(n < 1 for n in counts):
        raise DataError(f"every class needs a real image, got counts {list(counts)}")
    if rate is not None:
        return [float(rate)] * len(counts)
    return [min(1.0, real_batch / n) for n in counts]


def poisson_rows(idx: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """The entries of ``idx`` each kept independently with probability ``rate`` (drawn on the CPU); all of
    them, with no draw, for ``rate >= 1``."""
    if rate >= 1.0:
        return idx
    keep = torch.rand(idx.numel(), generator=generator, dtype=torch.float64) < rate
    return idx[keep.to(idx.device, non_blocking=True)]


def embed_rows(features: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``features(x)`` without a graph, float32 or float64, in chunks of :data:`REAL_CHUNK` on a CPU (the
    network embeds each image on its own, so the chunks change nothing)."""
    with torch.no_grad():
        if x.device.type != "cpu" or x.shape[0] <= REAL_CHUNK:
            return at_least_float32(features(x))
        return torch.cat([at_least_float32(features(x[i : i + REAL_CHUNK])) for i in range(0, x.shape[0], REAL_CHUNK)])


def noisy_class_means(
    emb: torch.Tensor,
    counts: Sequence[int],
    clip: float,
    noise_multiplier: float,
    denominators: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The released real-side target: ``(sum_{x in B_c} clip(e_x) + N(0, (noise_multiplier * clip)^2 I)) / m_c``.

    Parameters
    ----------
    emb
        (N, D) embeddings of the sampled real images, the classes' rows consecutive (``counts[c]`` rows of
        class c; a class may have none).
    clip
        Each row is scaled to L2 norm at most ``clip`` (:func:`~fedskew.privacy.mechanisms.clip_rows`).
    noise_multiplier
        Noise std / ``clip``; 0 releases the clipped sums as they are.
    denominators
        (C,) what each class's noisy sum is divided by: the expected batch ``m_c`` (public).
    generator
        The noise's stream (drawn on the CPU, :func:`~fedskew.privacy.mechanisms.gaussian_noise_like`).

    Returns
    -------
    torch.Tensor
        (C, D) in ``emb``'s dtype; one row per class.
    """
    sizes = torch.tensor(list(counts))
    if int(sizes.sum()) != emb.shape[0]:
        raise DataError(f"{emb.shape[0]} embeddings for class counts summing to {int(sizes.sum())}")
    segment = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(emb.device, non_blocking=True)
    sums = torch.zeros((len(sizes), emb.shape[1]), dtype=emb.dtype, device=emb.device)
    if emb.shape[0]:  # a step's Poisson batches may all be empty: the release is then noise alone
        sums = sums.index_add(0, segment, clip_rows(emb, clip))
    (noisy,) = add_gaussian_noise([sums], noise_multiplier * clip, generator)
    return noisy / denominators.to(device=emb.device, dtype=emb.dtype)[:, None]


def private_dm_loss(
    features: nn.Module,
    real_by_class: Sequence[torch.Tensor],
    syn_by_class: Sequence[torch.Tensor],
    clip: float,
    noise_multiplier: float,
    denominators: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """``sum_c || noisy mean_c - mean h(syn_c) ||^2``: DM's loss (:func:`~.distribution_matching.dm_loss`,
    ``bn_statistics = "separate"``) with the real class means replaced by :func:`noisy_class_means`.

    ``real_by_class[c]`` may be empty (its class's target is then noise over ``m_c``); ``syn_by_class[c]``
    may not. With ``noise_multiplier = 0``, a clip no embedding reaches and the batch sizes as denominators
    this is ``dm_loss`` exactly.
    """
    if len(real_by_class) != len(syn_by_class) or not real_by_class:
        raise DataError(f"{len(real_by_class)} real vs {len(syn_by_class)} synthetic class batches")
    if any(t.shape[0] == 0 for t in syn_by_class):
        raise DataError("every class needs at least one synthetic image")
    counts = [t.shape[0] for t in real_by_class]
    taken = [t for t in real_by_class if t.shape[0] > 0]
    syn = at_least_float32(features(torch.cat(list(syn_by_class))))
    real = embed_rows(features, torch.cat(taken)) if taken else syn.detach().new_zeros((0, syn.shape[1]))
    target = noisy_class_means(real, counts, clip, noise_multiplier, denominators, generator)
    means = segment_means(syn, [t.shape[0] for t in syn_by_class])
    return ((target.to(means.dtype) - means) ** 2).sum()


def private_distribution_matching(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    model_sampler: ModelSampler,
    cfg: DMConfig,
    generator: torch.Generator,
    clip: float,
    noise_multiplier: float,
    noise_generator: torch.Generator,
    init_set: SyntheticSet | None = None,
    extra_loss: ExtraLoss | None = None,
    progress: bool = False,
    sample_rate: float | None = None,
) -> SyntheticSet:
    """Condense ``(x_real, y_real)`` by distribution matching against privately released class means.

    As :func:`~.distribution_matching.distribution_matching` (same arguments, same start, networks,
    DSA draws, optimiser, ``clip_norm`` and ``extra_loss``), except that each step's real batch of class c
    is a Poisson sample at rate :func:`class_sample_rates` (``sample_rate`` for every class if given; drawn
    from ``generator``), each class's noisy sum divided by its expected batch ``q_c n_c``, and the loss is
    :func:`private_dm_loss` with this ``clip`` and ``noise_multiplier``, its noise drawn from
    ``noise_generator``. ``cfg.bn_statistics`` plays no part (the network must not couple its batch).

    Each of the ``cfg.iterations`` steps is one release of the sampled Gaussian mechanism with multiplier
    ``noise_multiplier`` at rate at most ``max(class_sample_rates(...))``: what the caller's accountant
    records. Refused in one line (:class:`ConfigError`): a start from real images (``init_set`` None and
    ``cfg.init`` not ``"noise"``), and a network that couples its batch.
    """
    if init_set is None and cfg.init != "noise":
        raise ConfigError(REAL_START)
    device = x_real.device
    precision = Precision(device, cfg.amp)
    say_unbatched(DM_UNBATCHED)
    plan = dm_start(x_real, y_real, cfg, generator, init_set)
    sizes = [int(r.numel()) for r in plan.real_indices]
    rates = class_sample_rates(sizes, cfg.real_batch, sample_rate)
    if sample_rate is None:  # q_c n_c exactly, without the rounding of real_batch / n_c * n_c
        denominators = torch.tensor([min(cfg.real_batch, n) for n in sizes], dtype=torch.float64)
    else:
        denominators = torch.tensor([q * n for q, n in zip(rates, sizes, strict=True)], dtype=torch.float64)
    images = plan.start.requires_grad_(True)
    optimizer = torch.optim.SGD([images], lr=cfg.image_lr, momentum=cfg.momentum)
    bar = progress_bar(range(cfg.iterations), desc="private distribution matching", enabled=progress)
    for step in bar:
        model = prepared(model_sampler(step, generator), device)
        if couples_batch(model):
            raise ConfigError(COUPLED)
        cl = is_channels_last(model)
        real, syn = [], []
        for r_idx, s_idx, rate in zip(plan.real_indices, plan.syn_indices, rates, strict=True):
            x_r, x_s = x_real[poisson_rows(r_idx, rate, generator)], images[s_idx]
            if cfg.dsa is not None:
                draw = sample_dsa_params(cfg.dsa, None, generator)
                x_r = apply_dsa(x_r, draw) if x_r.shape[0] else x_r
                x_s = apply_dsa(x_s, draw)
            real.append(as_model_format(x_r, cl))
            syn.append(as_model_format(x_s, cl))
        with precision.autocast():
            loss = private_dm_loss(model_features(model), real, syn, clip, noise_multiplier, denominators,
                                   noise_generator)
            if extra_loss is not None:
                loss = loss + extra_loss(model, SyntheticSet(images, plan.labels, plan.soft_labels))
        image_step(loss, images, optimizer, precision, cfg.clip_norm)
        if progress:
            bar.set_postfix(loss=float(loss.detach()), refresh=False)
    return plan.result(images)
