"""FedDM (Xiong, Wang, Cheng, Yu & Hsieh, CVPR 2023, "FedDM: Iterative Distribution Matching for
Communication-Efficient Federated Learning"), in the form FedAF (Wang et al., CVPR 2024) compares
against. The aggregation-free base it shares with FedAF is in
:mod:`fedskew.algorithms.condensation.base`.

Aggregation-free: no model averaging. Each round the selected clients condense their data by
distribution matching (FedAF Eq. 4) with networks drawn around the received global model, upload
the condensed sets as 8-bit images, and the server trains the global model on the union of the
clients' sets with cross-entropy.

FedDM specifics (SPEC section 4, FedAF Secs. 5.1-5.2 and App. A): the matching network is drawn
uniformly from the L2 ball of radius rho = 5 around the global model, the image gradient is clipped
to norm 2.0, image lr 1.0, SGD momentum 0.9, and the sets start, as FedAF's, from averages of random
real images (FedAF Sec. 5.1 uses one initialisation for both). Each round a client condenses afresh
from a new draw: FedDM's clients build a new synthetic set around every new global model, unlike
FedAF's clients, which keep refining one set across rounds. With few matching steps a set started
from single real images stays close to them (``init = "real"``, FedDM's own paper's start): the
uploads are then nearly the clients' raw images, a new sample every round.
"""

from __future__ import annotations

from typing import Literal

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.condensation.base import AggregationFree
from fedskew.algorithms.condensation.wire import MODEL
from fedskew.condense import SyntheticSet, distribution_matching, perturbed_model_sampler
from fedskew.core.message import Message, arrays_with_prefix
from fedskew.core.params import minimums


@register_algorithm("feddm")
class FedDM(AggregationFree):
    """Distribution matching around the global model (rho-ball sampling), server trains on the union."""

    paper = (
        'Xiong, Wang, Cheng, Yu & Hsieh, CVPR 2023, "FedDM: Iterative Distribution Matching for '
        'Communication-Efficient Federated Learning"'
    )

    class Params(AggregationFree.Params):
        rho: float = 5.0  # radius of FedDM's model-sampling ball (SPEC section 4)
        clip_norm: float = 2.0  # image-gradient clipping norm (SPEC section 4)
        # FedAF Sec. 5.1 (and SPEC: "the same" as FedAF): both start from averages of random real images,
        # a new draw every round here; "real" is FedDM's own paper's start (random real images).
        init: Literal["real", "noise", "mean"] = "mean"

        at_least = minimums(rho=0)
        positive = ("clip_norm",)

    params: Params

    private_condensation = True

    def condense(
        self, msg: Message, client: ClientContext
    ) -> tuple[SyntheticSet, dict[str, torch.Tensor], dict[str, float]]:
        """A fresh set, matched with networks drawn from the rho-ball around the received model (against
        privately released class means under ``privacy.mode = "condensation"``)."""
        p = self.params
        model = client.model(arrays_with_prefix(msg.arrays, MODEL))
        sampler = perturbed_model_sampler(model, client.fed.model.build, p.rho)
        cfg = self.dm_config(p.init, p.clip_norm)
        if self.privacy is not None:
            return self.private_matching(client, sampler, cfg, client.generator("condense")), {}, {}
        syn = distribution_matching(client.x, client.y, sampler, cfg, client.generator("condense"))
        return syn, {}, {}
