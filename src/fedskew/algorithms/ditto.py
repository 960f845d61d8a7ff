"""Ditto (Li, Hu, Beirami & Smith, ICML 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization"), Alg. 1.

Two models per client. The global model w is FedAvg's: a selected client runs ``local_epochs`` of local
SGD from the received w^t and sends the result (Alg. 1 lines 4-5 and 9; the wire is FedAvg's). Each
selected client also updates its personal model v_k, kept in ``client.state``, for ``personal_epochs``
epochs of SGD on h_k(v) = F_k(v) + (lambda/2)||v - w^t||^2 (Eq. 2; Alg. 1 lines 6-8:
v_k <- v_k - eta(grad F_k(v_k) + lambda(v_k - w^t))), with the same local SGD settings. v_k starts as
the seeded initial model w^0 (Alg. 1's input). lambda interpolates between local training (lambda = 0:
v_k never sees w, tested to equal ``local`` bit for bit) and the global model (lambda -> infinity:
v_k -> w^t, tested).

Defaults (sources in docs/algorithms.md, "Ditto"): ``lam = 1.0``, the fixed lambda the paper uses outside
strong attacks ("a fixed relatively large lambda (lambda=1) for all other attacks"; per-device selection
draws from {0.1, 1, 2} there, from {0.05, 0.1, 0.2} under strong attacks) and the one the authors' scripts
run on clean data (litian96/ditto ``run_fashion_clean_ditto_lam1.sh``, ``run_vehicle_clean_ditto_lam1.sh``);
``personal_epochs`` unset = ``local_epochs``: the authors' solver takes one personal step and one global
step on the same mini-batch in each of its ``local_iters`` iterations (``flearn/trainers_MTL/ditto.py``
lines 88-124), so v_k gets as much local work as w, on the same batches (here both draw from the client's
``"train"`` stream). The local SGD settings are FedAvg's.

Own model (:meth:`Ditto.personal_state`): v_k, from the client's last round (the initial model before it
first trains), the model the paper evaluates ("personalized models"); the global accuracy is w's.
"""

from __future__ import annotations

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.terms import proximal_term
from fedskew.components.trainer import train_local
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums


@register_algorithm("ditto")
class Ditto(FedAvg):
    """FedAvg for the global model, plus a personal model per client pulled towards it."""

    paper = (
        'Li, Hu, Beirami & Smith, ICML 2021, "Ditto: Fair and Robust Federated Learning Through '
        'Personalization"'
    )

    own_model = "the personal model v_k"

    class Params(FedAvg.Params):
        # lambda of Eq. 2; 0 is local training. 1: the paper's fixed lambda outside strong attacks, and the
        # authors' clean-data scripts (litian96/ditto run_*_clean_ditto_lam1.sh).
        lam: float = 1.0
        # Epochs of SGD on v_k per round; None: local_epochs, the same local work as for w (the authors'
        # solver alternates one v step and one w step on each batch, flearn/trainers_MTL/ditto.py 88-124).
        personal_epochs: int | None = None

        # unset: local_epochs
        at_least = minimums(lam=0, personal_epochs=1)

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's personal model v_k (w^0 before it first trains)."""
        return dict(client.state.get("personal") or self.initial_state())

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        # v_k: SGD on F_k(v) + (lambda/2)||v - w^t||^2 from the kept v_k. Its batches come from the same
        # "train" stream as w's (and as ``local``'s), so lambda = 0 is local training exactly.
        model = client.model(self.personal_state(msg, client))
        terms = []
        if p.lam > 0:
            anchor = {name: msg.arrays[name].detach() for name, _ in model.named_parameters()}
            terms.append(proximal_term(anchor, p.lam))
        epochs = p.local_epochs if p.personal_epochs is None else p.personal_epochs
        train_local(model, client.x, client.y, p.sgd(epochs), client.generator("train"), terms)
        client.state["personal"] = state_to_arrays(model.state_dict())
        # w: FedAvg's local update from w^t, sent to the server.
        return self.local_train(msg, client)[1]
