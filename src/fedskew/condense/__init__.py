"""Dataset condensation, independent of federated learning.

Methods: gradient matching (DC, Zhao et al. ICLR 2021; FedDC of Kim & Choi 2022), distribution matching
(DM, Zhao & Bilen WACV 2023; FedDM; FedAF), Kernel Inducing Points (KIP, Nguyen et al. ICLR 2021; HFLDD),
with differentiable Siamese augmentation (DSA) and a differentiable sliced Wasserstein distance (FedAF).

Conventions: images are float32 (N, C, H, W) in the normalised space ``(x / 255 - mean) / std``;
networks expose ``features`` (input to flat embedding) and ``classifier`` (last linear layer);
a model factory is a zero-argument constructor returning a freshly initialised network, which the
methods call inside a forked, seeded global RNG (:func:`fresh_model`); all randomness comes from an
explicit :class:`torch.Generator`, so a seed determines the result.
"""

from fedskew.condense.augment import DSAConfig, DSAParams, apply_dsa, dsa, sample_dsa_params
from fedskew.condense.distribution_matching import DMConfig, ExtraLoss, distribution_matching, dm_loss
from fedskew.condense.gradient_matching import GMConfig, gradient_matching, match_distance
from fedskew.condense.kip import (
    Kernel,
    KIPConfig,
    RandomConvFeatures,
    centered_one_hot,
    kip,
    kip_loss,
    ntk_fc_relu,
    random_feature_kernel,
)
from fedskew.condense.samplers import (
    ModelSampler,
    interpolated_model_sampler,
    perturbed_model_sampler,
    random_model_sampler,
)
from fedskew.condense.swd import ClassSWD, sliced_wasserstein
from fedskew.condense.synthetic import (
    ModelFactory,
    SyntheticSet,
    UInt8Set,
    fresh_model,
    init_synthetic,
    model_features,
)

__all__ = [
    "ClassSWD",
    "DMConfig",
    "DSAConfig",
    "DSAParams",
    "ExtraLoss",
    "GMConfig",
    "KIPConfig",
    "Kernel",
    "ModelFactory",
    "ModelSampler",
    "RandomConvFeatures",
    "SyntheticSet",
    "UInt8Set",
    "apply_dsa",
    "centered_one_hot",
    "distribution_matching",
    "dm_loss",
    "dsa",
    "fresh_model",
    "gradient_matching",
    "init_synthetic",
    "interpolated_model_sampler",
    "kip",
    "kip_loss",
    "match_distance",
    "model_features",
    "ntk_fc_relu",
    "perturbed_model_sampler",
    "random_feature_kernel",
    "random_model_sampler",
    "sample_dsa_params",
    "sliced_wasserstein",
]
