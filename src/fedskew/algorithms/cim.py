"""Class-imbalance mitigation (Lee & Seo, "Class Imbalance Mitigation in Federated Learning",
``papers/class-imbalance-mitigation-fl.txt``; formulas restored in ``SPEC.md`` section 3).

Three parts, each switchable for the paper's ablations (Sec. 5.3), around FedAvg:

- ``oversample`` (Algorithm 1): each client duplicates random samples of its non-empty classes up to
  t_k = mu_k exp(-delta r), except single-class clients; the server raises delta by Delta = 0.1 when the
  previous round's oversampled fraction exceeded theta_over = 0.1 (delta_0 = 0.01).
- ``select`` (Algorithm 2): every round all clients report their (oversampled) class counts in a
  ``census`` exchange (int64 per class, counted in the ledger); the server greedily picks up to h = 10
  clients whose pooled histogram approaches uniform (stopping once KL to uniform < theta_KLD = 0.1)
  and sends each selected client its allocation s_k (samples per class, an int64 array beside the
  model). Off: ``clients_per_round`` = 10 clients drawn uniformly, each training on all its data.
- ``dynamic`` (Algorithm 3): client k trains with batch b_k = floor(sum_l s_k^l / beta) and
  lr_k = eta_max * arctan(b_k) (eta_max = 0.1; beta = 3 for case 1, 25 for the others: default 25), or
  the normalised eta_max * (2/pi) * arctan(b_k) with ``lr_rule = "arctan_normalised"``. Off: the
  baselines' fixed batch 64 and lr 0.1 (Sec. 5.1; ``batch_size``, ``lr``).

Aggregation (Eq. 2): weights |D'_k| / sum |D'_k|, D'_k the data client k actually used (its allocation,
duplicates included). Local epochs: 5 (Table 2). Per round the algorithm reports ``selected`` (ids),
``num_selected``, ``kld`` (of the selection), ``delta`` and ``oversampled_fraction``; the engine's
``samples`` is sum |D'_k| (census replies carry no samples), while its ``clients`` list also holds every
census participant.

Choices where the paper is silent: oversampled duplicates are drawn with replacement; the allocated
samples are drawn uniformly without replacement from the oversampled set; a batch of floor(...) = 0
becomes 1; KL uses the natural log; clients of equal total are sorted in a random order drawn each round from the
server's (round, "select") stream (a fixed order would freeze the selection when all clients hold the
same amount); the round index r counts from 1; the oversampled fraction is
computed over the clients that trained this round and drives delta in the next round.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedskew.algorithms.base import ClientContext, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.cim_selection import (
    LrRule,
    allocate_indices,
    dynamic_batch_lr,
    next_delta,
    oversample_indices,
    oversampled_counts,
    oversampled_fraction,
    select_clients,
)
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import Withheld


@register_algorithm("cim")
class CIM(FedAvg):
    """FedAvg with oversampling, balanced client selection and dynamic batch size / learning rate."""

    paper = 'Lee & Seo, "Class Imbalance Mitigation in Federated Learning"'

    class Params(FedAvg.Params):
        local_epochs: int = 5  # Table 2
        batch_size: int = 64  # fixed batch when dynamic is off (baselines, Sec. 5.1)
        lr: float = 0.1  # fixed lr when dynamic is off (baselines, Sec. 5.1)
        oversample: bool = True  # Algorithm 1
        select: bool = True  # Algorithm 2
        dynamic: bool = True  # Algorithm 3
        delta0: float = 0.01  # initial oversampling exponent delta (Sec. 5.1)
        delta_step: float = 0.1  # Delta, increment of delta (Sec. 5.1)
        theta_over: float = 0.1  # oversampled-fraction threshold (Table 2)
        max_clients: int = 10  # h, most clients selected per round (Table 2)
        theta_kld: float = 0.1  # KL-to-uniform stopping threshold (Table 2)
        beta: int = 25  # SGD updates per epoch of Algorithm 3 (Table 2: 3 in case 1, 25 in cases 2-4)
        eta_max: float = 0.1  # maximum learning rate (Table 2)
        lr_rule: LrRule = "arctan"  # "arctan" as printed, or "arctan_normalised" (x 2/pi)

        at_least = minimums(delta0=0, delta_step=0, theta_over=0, theta_kld=0, max_clients=1, beta=1)
        positive = ("eta_max",)

    params: Params
    upload = Withheld("its class counts (the census the server allocates oversampling from)")

    not_sum_only = (
        "reads each client's class counts every round to select clients and to measure oversampling; SecAgg+ reveals "
        "only the sum of the uploads"
    )

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        server.state.update(delta=self.params.delta0, oversampled_fraction=0.0)

    def round(self, server: ServerContext) -> None:
        """Update delta, select (census + Algorithm 2, or uniform), train, aggregate by |D'_k|."""
        p = self.params
        if p.oversample and server.round > 1:
            server.state["delta"] = next_delta(
                server.state["delta"], server.state["oversampled_fraction"], p.delta_step, p.theta_over
            )
        delta = float(server.state["delta"])
        model = state_to_arrays(server.model.state_dict())
        config: dict[str, float | int | str | bool] = {"delta": delta}
        if p.select:
            census = server.exchange(
                "census", [(cid, Message(config=dict(config))) for cid in range(self.fed.num_clients)]
            )
            counts = np.zeros((self.fed.num_clients, self.fed.num_classes), dtype=np.int64)
            for cid, reply in census:
                counts[cid] = reply.arrays["counts"].cpu().numpy()
            sel = select_clients(counts, p.max_clients, p.theta_kld, server.rng("select"))
            msgs = [
                (cid, Message(arrays={**model, "allocation": torch.from_numpy(alloc)}, config=dict(config)))
                for cid, alloc in zip(sel.clients, sel.allocations, strict=True)
            ]
            server.metrics["kld"] = sel.kld if math.isfinite(sel.kld) else None  # inf: nobody to select
        else:
            msgs = [(cid, Message(arrays=model, config=dict(config))) for cid in self.select(server)]
        replies = server.exchange("train", msgs)
        self.aggregate(server, replies)  # FedAvg's, weighted by num_samples = |D'_k| (Eq. 2)
        if p.oversample:
            server.state["oversampled_fraction"] = oversampled_fraction(
                [m.metrics["num_oversampled"] for _, m in replies], [m.metrics["num_original"] for _, m in replies]
            )
            server.metrics.update(delta=delta, oversampled_fraction=server.state["oversampled_fraction"])
        server.metrics.update(clients=[cid for cid, _ in replies], num_selected=len(replies))

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A census reply is one int64 count per class; a train reply is a model (FedAvg)."""
        if task == "census":
            return {"counts": ((self.fed.num_classes,), torch.int64)}
        return super().reply_spec(task, server)

    # ---- client ------------------------------------------------------------------------------
    def _oversampled(self, msg: Message, client: ClientContext) -> np.ndarray:
        """Indices of the client's oversampled training set (all its data when oversampling is off).

        Drawn from the client's (round, "oversample") stream, so the census and the training of one
        round see the same set.
        """
        y = client.y.cpu().numpy()
        if not self.params.oversample:
            return np.arange(len(y), dtype=np.int64)
        delta = float(msg.config["delta"])
        return oversample_indices(y, self.fed.num_classes, delta, client.round, client.rng("oversample"))

    def sample_limit(self, cid: int, shard_size: int, server: ServerContext) -> float:
        """Oversampling fills each held class up to the largest one: at most ``shard_size`` per class."""
        return float(shard_size * (self.fed.num_classes if self.params.oversample else 1))

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task == "census":
            counts = client.class_counts().cpu().numpy()
            if self.params.oversample:
                counts = oversampled_counts(counts, float(msg.config["delta"]), client.round)
            return Message(arrays={"counts": torch.from_numpy(np.asarray(counts, dtype=np.int64))})
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        idx = self._oversampled(msg, client)
        num_oversampled = len(idx)
        if "allocation" in msg.arrays:
            labels = client.y.cpu().numpy()[idx]
            idx = idx[allocate_indices(labels, msg.arrays["allocation"].cpu().numpy(), client.rng("allocate"))]
        if p.dynamic:
            batch, lr = dynamic_batch_lr(len(idx), p.beta, p.eta_max, p.lr_rule)
        else:
            batch, lr = p.batch_size, p.lr
        model = client.model({k: v for k, v in msg.arrays.items() if k != "allocation"})
        chosen = torch.from_numpy(idx).to(client.device)
        res = train_local(
            model, client.x[chosen], client.y[chosen],
            LocalConfig(batch_size=batch, lr=lr, momentum=p.momentum, weight_decay=p.weight_decay,
                        epochs=p.local_epochs),
            client.generator("train"),
        )
        return Message(
            arrays=state_to_arrays(model.state_dict()),
            metrics={
                "num_samples": float(res.num_samples), "num_original": float(client.num_samples),
                "num_oversampled": float(num_oversampled), "batch_size": float(batch), "lr": lr,
                "steps": float(res.steps), "train_loss": res.mean_loss,
            },
        )
