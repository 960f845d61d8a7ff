"""FedGen (Zhu, Hong & Zhou, ICML 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning").

The server learns a lightweight generator G(eps, y) that maps noise and a label to an embedding (the input
of the classifier head) which the ensemble of the clients' heads classifies as y (Eq. 4): it minimises
    sum_k E_{y ~ p(y), eps ~ N(0, I)} [ w_k(y) * CE(head_k(G(eps, y)), y) ] + eta * L_div,
where head_k are the heads of this round's uploaded models, w_k(y) = n_k(y) / sum_j n_j(y) weighs each
head by how much of class y its client holds (the authors' code), p(y) is the label prior pooled from the
label counts clients upload, and L_div is the diversity loss of the authors' code,
exp(-mean_{ij} ||eps_i - eps_j||^2 ||G_i - G_j||_1) (mean-reduced distances). G and p(y) are sent down
with the model from round 2 on (in round 1 there is no trained generator, as in the authors' code), and
each client adds alpha * CE(head(G(eps, y)), y) with y ~ p(y) to its loss (Eq. 5), which teaches its head
the classes it barely holds. Only the head sees the generated embeddings.

Wire cost: down the model, G's weights and p(y); up the model and the client's label counts.

Simplifications against the authors' code (documented choices): G is Linear(noise + one-hot, hidden) -
ReLU - Linear(hidden, embed_dim) without the code's BatchNorm; noise is Gaussian as in the paper (the
code draws uniform noise); the client regulariser weight is a constant alpha (the code decays its
``generative_alpha = 10`` by 0.98 per round and adds a second KL term on generated embeddings of the
batch's labels); the generator's Adam learning rate is constant (the code decays it by 0.98 per round).
"""

from __future__ import annotations

import copy
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.terms import head_term
from fedskew.core.device import randn
from fedskew.core.message import Message, arrays_with_prefix, state_to_arrays
from fedskew.core.params import minimums
from fedskew.core.seeding import seeded_init
from fedskew.models.registry import FedModel
from fedskew.privacy.uploads import Withheld


class FeatureGenerator(nn.Module):
    """G(eps, y): an MLP from noise and a one-hot label to an embedding of the classifier's input width."""

    def __init__(self, noise_dim: int, num_classes: int, hidden: int, embed_dim: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.net = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden), nn.ReLU(), nn.Linear(hidden, embed_dim))

    def forward(self, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Embeddings ``(B, embed_dim)`` for noise ``(B, noise_dim)`` and labels ``(B,)``."""
        return cast(torch.Tensor, self.net(torch.cat([eps, F.one_hot(y, self.num_classes).to(eps.dtype)], dim=1)))


def diversity_loss(eps: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """exp(-mean_ij d2(eps_i, eps_j) * d1(G_i, G_j)), small when different noise gives different outputs.

    The mode-seeking term of the authors' code (``DiversityLoss``): d2 is the mean squared difference of the
    noise vectors, d1 the mean absolute difference of the generated embeddings; it stops G from mapping
    every noise vector of a class to one point.
    """
    noise_dist = (eps[:, None, :] - eps[None, :, :]).pow(2).mean(dim=2)
    feat_dist = (feats[:, None, :] - feats[None, :, :]).abs().mean(dim=2)
    return torch.exp(-(noise_dist * feat_dist).mean())


@register_algorithm("fedgen")
class FedGen(FedAvg):
    """FedAvg plus a server-learned feature generator that regularises the clients' heads."""

    paper = 'Zhu, Hong & Zhou, ICML 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning"'

    class Params(FedAvg.Params):
        alpha: float = 1.0  # weight of the client term (paper Eq. 5 has weight 1; the code starts at 10, decaying)
        noise_dim: int = 32  # the code's GENERATORCONFIGS for MNIST / EMNIST
        gen_hidden: int = 256  # idem
        gen_batch_size: int = 32  # generated samples per step, server and client (the code's gen_batch_size)
        gen_steps: int = 50  # generator steps per round (the code: ensemble_epochs = 50 iterations)
        gen_lr: float = 3e-4  # generator Adam lr (the code's MNIST ensemble_lr)
        gen_weight_decay: float = 0.01  # generator Adam weight decay (the code's weight_decay)
        diversity: float = 1.0  # eta, weight of the diversity loss (the code's ensemble_eta)

        at_least = minimums(

            alpha=0, gen_weight_decay=0, diversity=0, noise_dim=1, gen_hidden=1, gen_batch_size=1, gen_steps=1,

        )
        positive = ("gen_lr",)

    params: Params
    upload = Withheld("its label counts beside its model")

    not_sum_only = (
        "trains its generator on each client's classifier head and label counts, which the server must see one by "
        "one; SecAgg+ reveals only the sum of the uploads"
    )
    _client_gen: FeatureGenerator | None = None

    def new_generator(self, embed_dim: int) -> FeatureGenerator:
        """The generator, seeded identically on every side."""
        p = self.params
        return seeded_init(
            lambda: FeatureGenerator(p.noise_dim, self.fed.num_classes, p.gen_hidden, embed_dim),
            self.fed.seed, "fedgen-generator",
        )

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        gen = self.new_generator(cast(FedModel, server.model).embed_dim)
        server.state["generator"] = state_to_arrays(gen.state_dict())

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        arrays = state_to_arrays(server.model.state_dict())
        if "prior" in server.state:  # a generator trained on last round's heads
            arrays.update(state_to_arrays(server.state["generator"], "gen."))
            arrays["gen_prior"] = server.state["prior"].clone()
        msg = Message(arrays=arrays)
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is FedAvg's plus the client's label counts."""
        spec = super().reply_spec(task, server)
        if spec is not None:
            spec["label_counts"] = ((self.fed.num_classes,), torch.int64)
        return spec

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        models = [{k: v for k, v in m.arrays.items() if k != "label_counts"} for _, m in replies]
        state, kept = self.average(server, replies, models)
        server.model.load_state_dict(state)
        self.train_generator(server, kept)

    def train_generator(self, server: ServerContext, replies: Replies) -> None:
        """``gen_steps`` Adam steps of the teacher + diversity loss against this round's heads."""
        p = self.params
        counts = torch.stack([m.arrays["label_counts"] for _, m in replies]).to(torch.float32)  # (K, C)
        per_class = counts.sum(dim=0)
        prior = per_class / per_class.sum()
        heads_w = torch.stack([m.arrays["classifier.weight"] for _, m in replies])  # (K, C, D)
        heads_b = torch.stack([m.arrays["classifier.bias"] for _, m in replies])  # (K, C)
        gen = self.new_generator(int(heads_w.shape[2])).to(server.device)
        gen.load_state_dict(server.state["generator"])
        opt = torch.optim.Adam(gen.parameters(), lr=p.gen_lr, weight_decay=p.gen_weight_decay)
        if "gen_opt" in server.state:
            opt.load_state_dict(server.state["gen_opt"])
        rng = server.generator("fedgen")
        k = len(replies)
        teacher_sum = 0.0
        for _ in range(p.gen_steps):
            # Draws come from the CPU stream, then move: the same draws on every device.
            y = torch.multinomial(prior.cpu(), p.gen_batch_size, replacement=True, generator=rng).to(server.device)
            eps = randn((p.gen_batch_size, p.noise_dim), rng, server.device)
            feats = gen(eps, y)
            logits = torch.einsum("bd,kcd->kbc", feats, heads_w) + heads_b[:, None, :]
            ce = F.cross_entropy(logits.reshape(k * len(y), -1), y.repeat(k), reduction="none").view(k, -1)
            weight = counts[:, y] / per_class[y]  # w_k(y_b), (K, B)
            teacher = (weight * ce).mean(dim=1).sum()
            loss = teacher + p.diversity * diversity_loss(eps, feats)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            teacher_sum += float(teacher.detach())
        server.state["generator"] = state_to_arrays(gen.state_dict())
        server.state["gen_opt"] = copy.deepcopy(opt.state_dict())
        server.state["prior"] = prior
        server.metrics["generator_loss"] = teacher_sum / p.gen_steps

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        terms = []
        if "gen_prior" in msg.arrays and p.alpha > 0:
            if self._client_gen is None:
                embed_dim = cast(FedModel, client.model()).embed_dim
                self._client_gen = self.new_generator(embed_dim).requires_grad_(False).to(client.device)
            gen = self._client_gen
            gen.load_state_dict(arrays_with_prefix(msg.arrays, "gen."))
            prior = msg.arrays["gen_prior"]
            rng = client.generator("fedgen")

            def sample() -> tuple[torch.Tensor, torch.Tensor]:
                y = torch.multinomial(prior.cpu(), p.gen_batch_size, replacement=True, generator=rng).to(client.device)
                with torch.no_grad():
                    return gen(randn((p.gen_batch_size, p.noise_dim), rng, client.device), y), y

            terms.append(head_term(sample, p.alpha))
        model_keys = client.model().state_dict().keys()
        model_msg = Message(arrays={k: msg.arrays[k] for k in model_keys})
        _, reply = self.local_train(model_msg, client, terms=terms)
        reply.arrays["label_counts"] = client.class_counts()
        return reply
