"""FedAF (Wang, Fu, Kanagavelu, Wei, Liu & Goh, CVPR 2024, "An Aggregation-Free Federated Learning
for Tackling Data Heterogeneity").

No model averaging: clients learn condensed data, the server trains the global model on it.

Client k, each round: receives the global model w and the global class-wise mean logits V (Eq. 9;
none in round 1); computes, per class c it holds, the mean logits of its real data v_{k,c} (Eq. 5)
and soft labels r_{k,c} = softmax(v_{k,c} / tau) (Eq. 11); refines its condensed set S_k, kept across
rounds, by ``condense_iterations`` steps that each re-sample w' = gamma w + (1 - gamma) w_random
(Eq. 17) and lower

    L_loc = L_DM(S_k, D_k) + lambda_loc * sum_c SWD(u_{k,c}, v_c)          (Eqs. 4, 10; CDC)

and uploads S_k (8-bit images), V_k and R_k. The server averages them per class (Eqs. 8, 12) and
trains w on the union S of the sets with

    L_glob = L_CE(w, S) + lambda_glob * (KL(R||T) + KL(T||R)) / 2,          (Eqs. 13-16; LGKM)

t_c = softmax(mean_{x in S_c} f_w(x) / tau). ``use_cdc = false`` / ``use_lgkm = false`` drop either
term (the paper's Table 4 ablation).

The CDC term compares a distribution with a single vector: the server sends one mean logit vector
v_c per class (Eq. 9; App. C counts V as C vectors of C floats). We compare the *distribution* of the
client's condensed class-c images in logit space (one point f_w'(x) per image of S_{k,c}) with the
one-point distribution at v_c. Sec. 4 motivates SWD by "the discrepancies between the knowledge
distributions of locally condensed data and the original data owned by other clients", which a
per-image point cloud expresses; comparing only the mean u_{k,c} (Eq. 6) with v_c would make the
sliced Wasserstein distance a randomly projected Euclidean distance. For p = 2 the squared distance
to a point is the squared distance of the means plus the spread of the images' logits, so the term
pulls the class's images toward the global class knowledge. ``swd_local = "mean"`` gives the literal
Eq. 6 reading (u_{k,c} as one point) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.condensation.base import AggregationFree
from fedskew.algorithms.condensation.knowledge import class_mean_logits, knowledge_matching_term
from fedskew.algorithms.condensation.pool import pool_from_state, pool_to_state, update_pool
from fedskew.algorithms.condensation.wire import MODEL, Spec
from fedskew.components.trainer import LossTerm
from fedskew.condense import (
    ExtraLoss,
    SyntheticSet,
    distribution_matching,
    interpolated_model_sampler,
    sliced_wasserstein,
)
from fedskew.core.device import current_compute
from fedskew.core.message import Message, arrays_with_prefix
from fedskew.core.params import check
from fedskew.models.evaluation import chunk_bounds
from fedskew.models.layout import as_model_format, is_channels_last

KNOWLEDGE_LABELS = "knowledge.labels"
"""Reply array: the classes the client holds, int64 (C_k,)."""
KNOWLEDGE_LOGITS = "knowledge.logits"
"""Reply array: V_k, its mean logits per held class (Eq. 5), float32 (C_k, L)."""
KNOWLEDGE_SOFT = "knowledge.soft"
"""Reply array: R_k, softmax(V_k / tau) (Eq. 11), float32 (C_k, L)."""
GLOBAL_LABELS = "global.labels"
"""Download: classes with a global mean logit vector, int64."""
GLOBAL_LOGITS = "global.logits"
"""Download: their rows of V (Eqs. 8-9)."""
KNOWLEDGE_STATE = "knowledge_"
"""Server-state prefix of the pool of the clients' latest V_k and R_k rows."""
CLIENT_IMAGES = "syn_images"
"""Client-state key: S_k's float images, kept across rounds."""
CLIENT_LABELS = "syn_labels"
"""Client-state key: S_k's labels."""
LOGIT_CHUNK = 500
"""Real images per forward pass when a client computes its class logits (Eq. 5); not the engine's
test-set chunk (``models.evaluation.EVAL_CHUNK``): a different chunk would change the logits' last bits."""


def real_class_logits(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: the classes present in ``y`` and the mean logits of their real images under ``model``.

    The model is the global model f_w used for inference (evaluation-mode normalisation layers), run
    in chunks so a large client does not need one huge batch, in the run's precision (the logits are
    float32).
    """
    was_training = model.training
    model.eval()
    cl = is_channels_last(model)
    with torch.no_grad(), current_compute().precision().autocast():
        logits = torch.cat(
            [model(as_model_format(x[s:e], cl)).float() for s, e in chunk_bounds(int(y.shape[0]), LOGIT_CHUNK)]
        )
    model.train(was_training)
    means, counts = class_mean_logits(logits, y, num_classes)
    classes = torch.nonzero(counts > 0).flatten()
    return classes, means[classes].contiguous()


@register_algorithm("fedaf")
class FedAF(AggregationFree):
    """Collaborative data condensation on the clients, knowledge-matched training on the server."""

    @dataclass
    class Params(AggregationFree.Params):
        init: Literal["mean", "real", "noise"] = "mean"  # Sec. 5.1: averages of random real images
        gamma: float = 0.9  # Eq. 17, model re-sampling (Table 5: best of 0.2-1.0)
        # (lambda_loc, lambda_glob), App. A: (1e-4, 0.01) CIFAR-10/100, (1e-3, 2.0) FMNIST, (0.01, 0.1) DomainNet.
        lambda_loc: float = 1e-4  # weight of the CDC term, Eq. 10
        lambda_glob: float = 0.01  # weight of the LGKM term, Eq. 14
        tau: float = 1.0  # softmax temperature of Eqs. 11 and 13 (not given; 1 is plain softmax)
        swd_projections: int = 128  # random directions of the SWD estimate (not given)
        swd_local: Literal["samples", "mean"] = "samples"  # class-c logits of S_k: per image, or Eq. 6's mean
        use_cdc: bool = True  # false: "w/o CDC" (Table 4), no SWD term
        use_lgkm: bool = True  # false: "w/o LGKM" (Table 4), no KL term

        def __post_init__(self) -> None:
            super().__post_init__()
            check(0 <= self.gamma <= 1, "gamma", self.gamma, "in [0, 1]")
            check(self.lambda_loc >= 0, "lambda_loc", self.lambda_loc, ">= 0")
            check(self.lambda_glob >= 0, "lambda_glob", self.lambda_glob, ">= 0")
            check(self.tau > 0, "tau", self.tau, "> 0")
            check(self.swd_projections >= 1, "swd_projections", self.swd_projections, "at least 1")

    params: Params

    # ---- server ------------------------------------------------------------------------------
    def global_knowledge(self, server: ServerContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(V, R, known)`` from the clients' latest uploads, or None before any.

        V (L, L): row c is v_c, the mean of the clients' v_{k,c} (Eq. 8); R (L, L): row c is r_c, the
        mean of their r_{k,c} (Eq. 12); known (L,) bool: classes some client holds. Eqs. 8 and 12
        divide by K, the number of clients; a client without class c has no v_{k,c} (Eq. 5 averages
        over its N_{k,c} = 0 images), so we average over the clients that hold c.
        """
        pool = pool_from_state(server.state, KNOWLEDGE_STATE, ("labels", "logits", "soft"))
        if pool is None:
            return None
        num = self.fed.num_classes
        v, counts = class_mean_logits(pool["logits"], pool["labels"], num)
        r, _ = class_mean_logits(pool["soft"], pool["labels"], num)
        return v, r, counts > 0

    def download(self, server: ServerContext) -> dict[str, torch.Tensor]:
        """The global model, and V (Eq. 9) once clients have sent logits, if the CDC term uses it."""
        arrays = super().download(server)
        knowledge = self.global_knowledge(server) if self.params.use_cdc else None
        if knowledge is not None:
            v, _, known = knowledge
            classes = torch.nonzero(known).flatten()
            arrays[GLOBAL_LABELS] = classes
            arrays[GLOBAL_LOGITS] = v[classes].contiguous()
        return arrays

    def reply_spec(self, task: str, server: ServerContext) -> Spec | None:
        """A synthetic set, and one row of V_k and R_k per held class (any number of classes)."""
        spec = super().reply_spec(task, server)
        if spec is None:
            return None
        num = self.fed.num_classes
        return {
            **spec,
            KNOWLEDGE_LABELS: ((-2,), torch.int64),
            KNOWLEDGE_LOGITS: ((-2, num), torch.float32),
            KNOWLEDGE_SOFT: ((-2, num), torch.float32),
        }

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Store the clients' V_k and R_k, then train on the union of sets (with LGKM)."""
        if replies:
            pool = update_pool(
                pool_from_state(server.state, KNOWLEDGE_STATE, ("labels", "logits", "soft")),
                [
                    (cid, {"labels": m.arrays[KNOWLEDGE_LABELS], "logits": m.arrays[KNOWLEDGE_LOGITS],
                           "soft": m.arrays[KNOWLEDGE_SOFT]})
                    for cid, m in replies
                ],
                keep_others=True,
            )
            pool_to_state(server.state, KNOWLEDGE_STATE, pool)
        super().aggregate(server, replies)

    def server_terms(self, server: ServerContext) -> list[LossTerm]:
        """lambda_glob * L_LGKM (Eqs. 13-16) against the averaged soft labels R."""
        p = self.params
        knowledge = self.global_knowledge(server) if p.use_lgkm else None
        if knowledge is None:
            return []
        _, r, known = knowledge
        return [knowledge_matching_term(r, known, p.tau, p.lambda_glob)]

    # ---- client ------------------------------------------------------------------------------
    def cdc_loss(self, classes: torch.Tensor, v: torch.Tensor, generator: torch.Generator) -> ExtraLoss:
        """``lambda_loc * sum_c SWD(u_{k,c}, v_c)`` (Eq. 10) over the held classes that V covers.

        The logits of S_k come from the step's re-sampled network w' in evaluation mode, the mode in
        which the clients computed V; ``generator`` draws new projections at every step.
        """
        p = self.params
        targets = {int(c): v[i : i + 1] for i, c in enumerate(classes.tolist())}

        def loss(model: nn.Module, syn: SyntheticSet) -> torch.Tensor:
            was_training = model.training
            model.eval()
            logits = model(as_model_format(syn.images, is_channels_last(model)))
            model.train(was_training)
            total = torch.zeros((), device=logits.device)
            for c in sorted(set(syn.labels.tolist()) & targets.keys()):
                u = logits[syn.labels == c]
                if p.swd_local == "mean":
                    u = u.mean(dim=0, keepdim=True)
                total = total + sliced_wasserstein(u, targets[c], p.swd_projections, generator)
            return p.lambda_loc * total

        return loss

    def condense(self, msg: Message, client: ClientContext) -> tuple[SyntheticSet, dict[str, torch.Tensor]]:
        """Eqs. 5 and 11 on the real data, then refine the kept S_k (Eqs. 4, 10, 17)."""
        p = self.params
        model = client.model(arrays_with_prefix(msg.arrays, MODEL))
        classes, v = real_class_logits(model, client.x, client.y, client.fed.num_classes)
        soft = F.softmax(v / p.tau, dim=1)
        init_set = None
        if CLIENT_IMAGES in client.state:
            init_set = SyntheticSet(client.state[CLIENT_IMAGES], client.state[CLIENT_LABELS])
        extra = None
        if p.use_cdc and GLOBAL_LABELS in msg.arrays:
            extra = self.cdc_loss(msg.arrays[GLOBAL_LABELS], msg.arrays[GLOBAL_LOGITS], client.generator("swd"))
        syn = distribution_matching(
            client.x, client.y, interpolated_model_sampler(model, client.fed.model.build, p.gamma),
            self.dm_config(p.init, None), client.generator("condense"), init_set=init_set, extra_loss=extra,
        )
        client.state[CLIENT_IMAGES] = syn.images
        client.state[CLIENT_LABELS] = syn.labels
        return syn, {KNOWLEDGE_LABELS: classes, KNOWLEDGE_LOGITS: v, KNOWLEDGE_SOFT: soft.contiguous()}
