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

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.condensation.base import AggregationFree
from fedskew.algorithms.condensation.knowledge import class_mean_logits, knowledge_matching_term
from fedskew.algorithms.condensation.pool import pool_from_state, pool_to_state, update_pool
from fedskew.algorithms.condensation.private import (
    EPSILON,
    MODE,
    WITHHELD,
    ClientBudget,
    client_noise,
    private_class_sums,
    uploads,
)
from fedskew.algorithms.condensation.wire import MODEL, Spec
from fedskew.components.trainer import LossTerm
from fedskew.condense import (
    ClassSWD,
    ExtraLoss,
    SyntheticSet,
    distribution_matching,
    dm_loss,
    interpolated_model_sampler,
    model_features,
)
from fedskew.condense.distribution_matching import image_dtype
from fedskew.condense.synthetic import class_indices, sample_indices, start_set
from fedskew.core.device import current_compute
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, arrays_with_prefix
from fedskew.core.params import minimums
from fedskew.models.evaluation import chunk_bounds
from fedskew.models.layout import as_model_format, is_channels_last
from fedskew.privacy.params import PrivacyParams

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


def example_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Each real image's logits under ``model`` (float32): the global model f_w used for inference
    (evaluation-mode normalisation layers, so each image's logits are its own), run in chunks so a large
    client does not need one huge batch, in the run's precision."""
    was_training = model.training
    model.eval()
    cl = is_channels_last(model)
    with torch.no_grad(), current_compute().precision().autocast():
        logits = torch.cat(
            [model(as_model_format(x[s:e], cl)).float() for s, e in chunk_bounds(int(x.shape[0]), LOGIT_CHUNK)]
        )
    model.train(was_training)
    return logits


def real_class_logits(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: the classes present in ``y`` and the mean logits of their real images under ``model``
    (:func:`example_logits`)."""
    logits = example_logits(model, x)
    means, counts = class_mean_logits(logits, y, num_classes)
    classes = torch.nonzero(counts > 0).flatten()
    return classes, means[classes].contiguous()


def no_rows(num_classes: int) -> dict[str, torch.Tensor]:
    """Knowledge reply arrays holding no class: what a private client that releases no V_k sends."""
    return {KNOWLEDGE_LABELS: torch.zeros(0, dtype=torch.int64), KNOWLEDGE_LOGITS: torch.zeros(0, num_classes),
            KNOWLEDGE_SOFT: torch.zeros(0, num_classes)}


@register_algorithm("fedaf")
class FedAF(AggregationFree):
    """Collaborative data condensation on the clients, knowledge-matched training on the server."""

    paper = (
        'Wang, Fu, Kanagavelu, Wei, Liu & Goh, CVPR 2024, "An Aggregation-Free Federated Learning for Tackling '
        'Data Heterogeneity"'
    )

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
        # Readings the paper's text leaves open (docs/algorithms.md, FedAF; issue "Fidelity, second pass"):
        kl_reduction: Literal["batchmean", "mean"] = "batchmean"  # LGKM's C x C KL: rows averaged, or all entries
        cdc_scale: Literal["printed", "normalised"] = "printed"  # lambda_loc as printed, or set per round ...
        cdc_fraction: float = 0.1  # ... so that ||grad CDC|| = cdc_fraction * ||grad L_DM|| at the round's start
        knowledge_round: Literal["last", "this"] = "last"  # V from last round's uploads, or a first exchange now
        init_noise: float = 0.0  # std of per-image noise on classes whose ipc images start identical
        # privacy.mode = "condensation": the clip of each real image's logits for V_k (None: privacy.clip)
        knowledge_clip: float | None = None

        at_least = minimums(lambda_loc=0, lambda_glob=0, swd_projections=1, init_noise=0)
        positive = ("tau", "cdc_fraction", "knowledge_clip")
        unit = ("gamma",)

    params: Params

    private_condensation = True

    @classmethod
    def check_private(cls, params: Params, privacy: PrivacyParams) -> None:
        """Also refused: ``cdc_scale = "normalised"``, whose weight comes from a gradient on raw data."""
        super().check_private(params, privacy)
        if params.cdc_scale == "normalised":
            raise ConfigError(f'{MODE} needs algorithm.cdc_scale = "printed": "normalised" sets the CDC weight '
                              "from a gradient of the raw data's DM loss, which no noise covers")

    @property
    def knowledge_released(self) -> bool:
        """Whether V_k is used, so released: by CDC (sent back as V) or LGKM (as R); a private client with
        neither sends no rows."""
        return self.privacy is None or self.params.use_cdc or self.params.use_lgkm

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

    @property
    def knowledge_first(self) -> bool:
        """Whether V_k and R_k travel in a ``knowledge`` exchange before the training (``knowledge_round =
        "this"`` with CDC on), rather than with the condensed set."""
        return self.params.knowledge_round == "this" and self.params.use_cdc

    def reply_spec(self, task: str, server: ServerContext) -> Spec | None:
        """A synthetic set, and one row of V_k and R_k per held class (any number of classes); a
        ``knowledge`` reply holds only the rows, and a ``train`` reply holds none when they came first."""
        spec = super().reply_spec(task, server) if task != "knowledge" else {}
        if spec is None or (task == "train" and self.knowledge_first):
            return spec
        num = self.fed.num_classes
        return {
            **spec,
            KNOWLEDGE_LABELS: ((-2,), torch.int64),
            KNOWLEDGE_LOGITS: ((-2, num), torch.float32),
            KNOWLEDGE_SOFT: ((-2, num), torch.float32),
        }

    def round(self, server: ServerContext) -> None:
        """One round; with ``knowledge_round = "this"`` (and CDC on) a first ``knowledge`` exchange
        collects this round's V_k and R_k from the selected clients, so the V they match is this
        round's (Eq. 9 read as computed before the condensation) rather than last round's uploads."""
        if not self.knowledge_first:
            super().round(server)
            return
        clients = [cid for cid, _ in self.configure(server)]
        plain = Message(arrays=super().download(server))
        self.store_knowledge(server, server.exchange("knowledge", [(cid, plain) for cid in clients]))
        msg = Message(arrays=self.download(server))
        self.aggregate(server, server.exchange("train", [(cid, msg) for cid in clients]))

    def store_knowledge(self, server: ServerContext, replies: Replies) -> None:
        """Put the replies' V_k and R_k rows into the pool (a client's rows replace its previous ones; a
        private client out of budget keeps its last rows)."""
        replies = uploads(replies)
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

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Store the clients' V_k and R_k (unless they came first), then train on the union of sets (with LGKM)."""
        if not self.knowledge_first:
            self.store_knowledge(server, replies)
        fractions = [m.metrics["cdc_grad_fraction"] for _, m in replies if "cdc_grad_fraction" in m.metrics]
        if fractions:
            server.metrics["cdc_grad_fraction"] = sum(fractions) / len(fractions)
        super().aggregate(server, replies)

    def server_terms(self, server: ServerContext) -> list[LossTerm]:
        """lambda_glob * L_LGKM (Eqs. 13-16) against the averaged soft labels R."""
        p = self.params
        knowledge = self.global_knowledge(server) if p.use_lgkm else None
        if knowledge is None:
            return []
        _, r, known = knowledge
        return [knowledge_matching_term(r, known, p.tau, p.lambda_glob, p.kl_reduction)]

    # ---- client ------------------------------------------------------------------------------
    def cdc_loss(
        self, classes: torch.Tensor, v: torch.Tensor, generator: torch.Generator, weight: float | None = None
    ) -> ExtraLoss:
        """``weight * sum_c SWD(u_{k,c}, v_c)`` (Eq. 10) over the held classes that V covers.

        The logits of S_k come from the step's re-sampled network w' in evaluation mode, the mode in
        which the clients computed V; ``generator`` draws new projections at every step. ``weight``:
        ``lambda_loc`` unless given (see :meth:`cdc_weight`).
        """
        p = self.params
        scale = p.lambda_loc if weight is None else weight
        targets = {int(c): v[i : i + 1] for i, c in enumerate(classes.tolist())}
        return ClassSWD(targets, scale, p.swd_projections, p.swd_local, generator)

    def cdc_gradients(
        self, model: nn.Module, client: ClientContext, start: SyntheticSet, classes: torch.Tensor, v: torch.Tensor
    ) -> tuple[float, float]:
        """``(||grad L_DM||, ||grad sum_c SWD||)`` on the images of ``start``, the set a round starts from.

        Measured once per round, before the steps, at the received global model w (a copy in training
        mode, as the steps run it), with ``real_batch`` real images per class and projections from a
        stream of their own, so the condensation's draws are untouched.
        """
        p = self.params
        net = copy.deepcopy(model).train().requires_grad_(False)
        g = client.generator("cdc_probe")
        images = start.images.detach().to(image_dtype(client.x)).clone().requires_grad_(True)  # as the steps
        labels = start.labels
        cl = is_channels_last(net)
        held = sorted(set(labels.tolist()))
        rows = class_indices(client.y, held)
        real = [as_model_format(client.x[sample_indices(r, p.real_batch, g)], cl) for r in rows]
        syn = [as_model_format(images[labels == c], cl) for c in held]
        (g_dm,) = torch.autograd.grad(dm_loss(model_features(net), real, syn, p.bn_statistics), [images])
        swd = self.cdc_loss(classes, v, g, weight=1.0)(net, SyntheticSet(images, labels))
        g_swd = torch.autograd.grad(swd, [images])[0] if swd.requires_grad else torch.zeros_like(images)
        return float(g_dm.norm()), float(g_swd.norm())

    def cdc_weight(self, dm_norm: float, swd_norm: float) -> float:
        """The CDC term's weight: ``lambda_loc`` as printed, or (``cdc_scale = "normalised"``) the weight
        that makes its gradient ``cdc_fraction`` times L_DM's at the round's start."""
        p = self.params
        if p.cdc_scale == "printed" or swd_norm == 0.0:
            return p.lambda_loc
        return p.cdc_fraction * dm_norm / swd_norm

    def start_set(self, client: ClientContext, generator: torch.Generator) -> SyntheticSet:
        """S_k's first images (:func:`~fedskew.condense.synthetic.start_set`, drawn from ``generator`` as
        the condensation would), with ``init_noise`` added to the classes whose ipc images are all
        alike (a class with few real images under ``init = "mean"``), so they can move apart."""
        p = self.params
        start = start_set(client.x, client.y, p.ipc, p.init, generator)
        if p.init_noise == 0:
            return start
        images = start.images.clone()
        noise = client.generator("init_noise")
        for c in sorted(set(start.labels.tolist())):
            rows = torch.nonzero(start.labels == c).flatten()
            flat = images[rows].flatten(1)
            if rows.numel() > 1 and bool((flat == flat[:1]).all()):
                draw = torch.randn(images[rows].shape, generator=noise, dtype=images.dtype)
                images[rows] = images[rows] + p.init_noise * draw.to(images.device)
        return SyntheticSet(images, start.labels, start.soft_labels)

    def condense(
        self, msg: Message, client: ClientContext
    ) -> tuple[SyntheticSet, dict[str, torch.Tensor], dict[str, float]]:
        """Eqs. 5 and 11 on the real data, then refine the kept S_k (Eqs. 4, 10, 17); the reply's metrics
        hold the CDC gradient fraction (``cdc_grad_fraction``) when the CDC term was on."""
        p = self.params
        model = client.model(arrays_with_prefix(msg.arrays, MODEL))
        knowledge = {} if self.knowledge_first else self.knowledge(model, client)  # else sent already
        generator = client.generator("condense")
        private = self.privacy is not None
        init_set = None
        if CLIENT_IMAGES in client.state:
            init_set = SyntheticSet(client.state[CLIENT_IMAGES], client.state[CLIENT_LABELS])
        extra = None
        metrics: dict[str, float] = {}
        cdc = p.use_cdc and GLOBAL_LABELS in msg.arrays
        if init_set is None and (cdc or p.init_noise > 0):
            init_set = self.start_set(client, generator)  # the draws distribution_matching would make
        weight = p.lambda_loc
        if cdc and not private:  # the probe's gradient norms come from raw data: a private client has none
            assert init_set is not None
            dm_norm, swd_norm = self.cdc_gradients(model, client, init_set, msg.arrays[GLOBAL_LABELS],
                                                   msg.arrays[GLOBAL_LOGITS])
            weight = self.cdc_weight(dm_norm, swd_norm)
            metrics["cdc_grad_fraction"] = weight * swd_norm / dm_norm if dm_norm > 0 else 0.0
        if cdc:
            extra = self.cdc_loss(msg.arrays[GLOBAL_LABELS], msg.arrays[GLOBAL_LOGITS], client.generator("swd"), weight)
        sampler = interpolated_model_sampler(model, client.fed.model.build, p.gamma)
        if private:
            syn = self.private_matching(client, sampler, self.dm_config(p.init, None), generator, init_set, extra)
        else:
            syn = distribution_matching(
                client.x, client.y, sampler, self.dm_config(p.init, None), generator, init_set=init_set,
                extra_loss=extra,
            )
        client.state[CLIENT_IMAGES] = syn.images
        client.state[CLIENT_LABELS] = syn.labels
        return syn, knowledge, metrics

    def knowledge(self, model: nn.Module, client: ClientContext) -> dict[str, torch.Tensor]:
        """The reply arrays V_k (Eq. 5) and R_k = softmax(V_k / tau) (Eq. 11) of the client's real data;
        under ``privacy.mode = "condensation"`` V_k is released privately (:func:`.private.private_class_sums`
        of the images' logits, clipped to ``knowledge_clip``), or not at all when neither CDC nor LGKM uses it."""
        privacy, num = self.privacy, client.fed.num_classes
        if privacy is None:
            classes, v = real_class_logits(model, client.x, client.y, num)
        elif not self.knowledge_released:
            return no_rows(num)
        else:
            clip = self.params.knowledge_clip or privacy.clip
            classes, v = private_class_sums(example_logits(model, client.x), client.y, num, clip,
                                            privacy.noise_multiplier, client_noise(privacy, client, "dp_knowledge"))
        soft = F.softmax(v / self.params.tau, dim=1).contiguous()
        return {KNOWLEDGE_LABELS: classes, KNOWLEDGE_LOGITS: v, KNOWLEDGE_SOFT: soft}

    def releases(self, task: str, client: ClientContext) -> list[tuple[float, int]]:
        """The matching's steps (``train``), after one release of V_k over all the client's images (rate 1)
        in the task that sends it."""
        sends = task == ("knowledge" if self.knowledge_first else "train")
        logits = [(1.0, 1)] if sends and self.knowledge_released else []
        return logits + super().releases(task, client)

    def withheld(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """No rows of V_k and R_k, when they travel with the ``train`` reply."""
        return {} if self.knowledge_first else no_rows(client.fed.num_classes)

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        """``knowledge``: V_k and R_k of the real data only (and a private client's epsilon); ``train``: the
        condensed set as well, and the CDC gradient fraction (``cdc_grad_fraction``) when the CDC term was on."""
        if task != "knowledge":
            return super().client_step(task, msg, client)
        model = client.model(arrays_with_prefix(msg.arrays, MODEL))
        if self.privacy is None:
            return Message(arrays=self.knowledge(model, client))
        budget, releases = ClientBudget(self.privacy, client.state), self.releases(task, client)
        if not budget.affordable(releases):
            return Message(arrays=no_rows(client.fed.num_classes), metrics={WITHHELD: 1.0, EPSILON: budget.epsilon})
        arrays = self.knowledge(model, client)
        budget.spend(releases)
        return Message(arrays=arrays, metrics={EPSILON: budget.epsilon})
