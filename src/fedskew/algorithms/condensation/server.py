"""The server's training of the global model on condensed sets, and its parameters.

FedDC (Kim & Choi 2022, Eq. 7) fine-tunes the averaged model on this round's condensed sets; FedDM
(Xiong et al., CVPR 2023) and FedAF (Wang et al., CVPR 2024, Eq. 14) train the global model on the
union of the clients' sets. All three are mini-batch SGD with cross-entropy on a synthetic set
(FedAF adds its LGKM term, :mod:`.knowledge`). Their settings live in the method's nested
``server`` table (``algorithm.server.lr`` ...), so ``lr`` in ``[algorithm]`` always means a client's
learning rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedskew.components.trainer import LocalResult, LossTerm, SGDParams, train_local
from fedskew.condense import SyntheticSet
from fedskew.core.params import minimums
from fedskew.models.layout import use_channels_last


@dataclass
class ServerTraining(SGDParams):
    """``[algorithm.server]``: SGD of the global model on the condensed sets the server holds.

    Each method gives its own defaults (FedDC: Eq. 7 and Sec. V-A; FedDM and FedAF: FedAF Sec. 5.1).
    """

    epochs: int = 10  # and SGD's batch_size, lr, momentum, weight_decay (SGDParams)
    batch_size: int = 256

    at_least = minimums(epochs=0)



def train_global_on_synthetic(
    model: nn.Module,
    syn: SyntheticSet,
    cfg: ServerTraining,
    generator: torch.Generator,
    terms: Sequence[LossTerm] = (),
) -> LocalResult:
    """Mini-batch SGD of the global ``model`` on a synthetic set with cross-entropy (+ ``terms``).

    FedDC Eq. 7 (``l_s = 1/|S| sum_s l_ce``, here in mini-batches), FedDM's server update and
    FedAF Eq. 14's ``L_CE`` are all this; FedAF adds its LGKM term
    (:func:`~fedskew.algorithms.condensation.knowledge.knowledge_matching_term`). A convolutional
    ``model`` is put in channels-last format first (in place): an epoch on a few hundred images in
    one batch runs about twice as fast (benchmarks/kernels.py). The set is moved to the model's device;
    the run's precision applies as in local training.
    """
    device = next(model.parameters()).device
    x, y = syn.images.to(device), syn.labels.to(device)
    return train_local(use_channels_last(model), x, y, cfg.sgd(cfg.epochs), generator, terms)
