"""FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021, "Exploiting Shared Representations for
Personalized Federated Learning"), Alg. 1.

Clients share a representation phi (the model's body) and each keeps a head h_i of its own (the model's
declared head, ``FedModel.head_modules``). A selected client receives phi^t and, with phi fixed, first
updates its head for tau_h = ``head_epochs`` epochs of SGD (Alg. 1 lines 6-8), then, with its new head
fixed, updates the representation for tau = ``local_epochs`` epochs (lines 9-11); it keeps h_i in
``client.state`` and sends only phi_i. The server averages the representations (line 13; fedskew's
sample-weighted mean, ``[algorithm.aggregation]`` applies). The wire is FedPer's: the head never travels
(tested). FedPer trains head and body together; FedRep alternates them, which is its whole difference.

Defaults (sources in docs/algorithms.md, "FedRep"; the paper's text was not available here):
``head_epochs = 10``, the head's epochs in every one of the authors' scripts (lgcollins/FedRep
``scripts/FedRep_*.sh``: ``--local_ep`` minus ``--local_rep_ep``, 11 - 1 or 15 - 5; the README says the
scripts "recover the results from the paper"); ``local_epochs = 1`` is FedAvg's default and the
representation's epochs in ``FedRep_cifar10_2shards.sh`` (the other scripts use 5). The local SGD settings
are FedAvg's (the authors' code: SGD, lr 0.01, momentum 0.5, weight decay 1e-4 on weights, batch 10).

Own model (:meth:`~fedskew.algorithms.fedper.FedPer.personal_state`): the current global representation
with the client's own head (the seeded initial head before it first trains), as the paper evaluates.
"""

from __future__ import annotations

from dataclasses import replace

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedper import FedPer
from fedskew.components.personal import only, trainable, without
from fedskew.components.trainer import train_local
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import WEIGHTS


@register_algorithm("fedrep")
class FedRep(FedPer):
    """Alternating updates: the client's head with the body fixed, then the body with the head fixed."""

    paper = (
        'Collins, Hassani, Mokhtari & Shakkottai, ICML 2021, "Exploiting Shared Representations for '
        'Personalized Federated Learning"'
    )

    own_model = "the global body with the client's head"

    class Params(FedPer.Params):
        # tau_h: epochs of head updates per round, before the body's local_epochs (the authors' scripts,
        # lgcollins/FedRep scripts/FedRep_*.sh: 10 head epochs in all of them).
        head_epochs: int = 10

        at_least = minimums(head_epochs=0)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its personal head, trained without DP-SGD, shapes the shared body's gradients")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        head = self.own_head(client)
        model = client.model({**msg.arrays, **head})
        params = {name for name, _ in model.named_parameters()}
        head_params = params & set(head)
        if p.head_epochs > 0:
            with trainable(model, head_params):  # Alg. 1 lines 6-8: h_i with phi fixed
                train_local(model, client.x, client.y, p.sgd(p.head_epochs), client.generator("head"))
        with trainable(model, params - head_params):  # lines 9-11: phi with the new h_i fixed
            res = train_local(model, client.x, client.y, self.local_config(), client.generator("train"))
        state = state_to_arrays(model.state_dict())
        keys = set(head)
        client.state["head"] = only(state, keys)
        return Message(
            arrays=without(state, keys),
            metrics={"num_samples": float(res.num_samples), "steps": float(res.steps), "train_loss": res.mean_loss},
        )
