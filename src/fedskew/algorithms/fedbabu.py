"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for Federated Image
Classification"), Alg. 1.

During federated training the head (the model's declared head, ``FedModel.head_modules``) stays at its
random initialisation on every client and on the server: clients update only the body (Alg. 1: "Body
Aggregation and Body Update"), and the server averages only bodies. As the initial head is the seeded one
both sides build, it is never sent (the wire is FedPer's) and never changes (tested). Personalisation
happens at evaluation: each client fine-tunes the whole global model, body and head, on its own
training data (Sec. 4.3), and that fine-tuned model is the client's own.

Defaults (sources in docs/algorithms.md, "FedBABU"; the paper's text was not available here):
``finetune_epochs = 5`` (tau_f, the authors' code: ``--ft_ep`` default 5 in jhoon-oh/FedBABU
``utils/options.py`` line 54, and ``personalization_epoch = 5`` in ``analysis.ipynb``, which fine-tunes
body and head); ``finetune_lr = 0.001``, the learning rate of that fine-tuning in ``analysis.ipynb``
(``'lr': 1e-3`` for body and head, while the scripts train with 0.1); the fine-tuning's batch size,
momentum and weight decay are the method's local SGD settings, as in the notebook. ``local_epochs`` and
the SGD settings are FedAvg's (the authors' scripts run tau in {1, 4, 10}).

Own model (:meth:`FedBABU.personal_state`): the global model after ``finetune_epochs`` epochs of SGD on
the client's training data, drawn from the client's ``"finetune"`` stream of the round and thrown away
after the evaluation. ``eval.personalized_epochs`` would fine-tune further on top of it; leave it at 0.
The global accuracy is that of the global model (trained body, initial head), the paper's "FedBABU
without fine-tuning".
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedper import FedPer
from fedskew.components.personal import trainable, without
from fedskew.components.trainer import train_local
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums


@register_algorithm("fedbabu")
class FedBABU(FedPer):
    """Body-only federated training with a frozen random head; fine-tuning of the whole model per client."""

    paper = (
        'Oh, Kim & Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for Federated Image '
        'Classification"'
    )

    own_model = "the global model fine-tuned on the client's data"

    class Params(FedPer.Params):
        # tau_f: epochs of fine-tuning (body and head) that make a client's own model from the global
        # one (authors' code: jhoon-oh/FedBABU utils/options.py line 54, analysis.ipynb line 45).
        finetune_epochs: int = 5
        # The fine-tuning's learning rate (authors' analysis.ipynb line 61: 1e-3 for body and head).
        finetune_lr: float = 0.001

        at_least = minimums(finetune_epochs=0)
        positive = ("finetune_lr",)

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model fine-tuned, body and head, for ``finetune_epochs`` with ``finetune_lr`` on the
        client's training data."""
        model = client.model(msg.arrays)
        p = self.params
        if p.finetune_epochs > 0 and client.num_samples > 0:
            config = replace(p.sgd(p.finetune_epochs), lr=p.finetune_lr)
            train_local(model, client.x, client.y, config, client.generator("finetune"))
        return state_to_arrays(model.state_dict())

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        head = self.initial_head()  # the same fixed head on every client, in every round
        model = client.model({**msg.arrays, **head})
        body = {name for name, _ in model.named_parameters()} - set(head)
        with trainable(model, body):
            res = train_local(model, client.x, client.y, self.local_config(), client.generator("train"),
                              **client.dpsgd())
        return Message(
            arrays=state_to_arrays(without(model.state_dict(), set(head))),
            metrics={"num_samples": float(res.num_samples), "steps": float(res.steps), "train_loss": res.mean_loss},
        )
