"""FedETF (Li, Shang, He, Lin & Wu, ICCV 2023, "No Fear of Classifier Biases: Neural Collapse Inspired Federated
Learning with Synthetic and Fixed Classifier").

The model's last linear layer is replaced by FedETF's head (:class:`~fedskew.models.heads.ETFClassifier`): a
learnable projection ``h = P z + b`` of the extractor's features to ``d`` dimensions, normalised to unit length,
and a fixed simplex ETF ``V`` (K unit vectors in R^d, pairwise inner products ``-1/(K-1)``) as the classifier,
with a learnable temperature ``beta``: ``logit_c = beta * v_c^T h / ||h||``. The frame is drawn from the run's
seed only, so the server and every client build the same one; it is a buffer, which no optimiser moves.

Training (every round): FedAvg, whose clients minimise the balanced loss on the calibrated logits
``logit_c + log n_c`` (``n_c`` the client's samples of class c; a class it lacks leaves the softmax) over the
extractor, the projection and the temperature. The ETF is neither sent nor returned: the server averages
everything else and keeps its frame, so it stays as built, bit for bit (tested).

Personalisation (the paper's local adaptation; own model, :meth:`FedETF.personal_state`): from the global
model the client runs the round's local training once more (``local_epochs``, balanced loss), then
``finetune_rounds`` alternations of ``finetune_epochs`` epochs of cross-entropy SGD on the ETF alone
(``finetune_etf_lr``, no momentum or weight decay) and ``finetune_epochs`` on the projection alone
(``finetune_projection_lr``, the method's momentum and weight decay); the temperature and the extractor stay.
The fine-tuned model (with its moved frame) is the client's own model, evaluated as ``personal_accuracy`` and
thrown away after. Defaults and their sources: docs/algorithms.md, "FedETF".
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import torch

from fedskew.algorithms.base import ClientContext, FederationInfo, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.algorithms.fedlc import with_absent
from fedskew.algorithms.fedrod import BalancedParams
from fedskew.components.personal import trainable, without
from fedskew.components.trainer import LogitAdjust, train_local
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.models.heads import ETFClassifier
from fedskew.privacy.uploads import WEIGHTS

ETF_KEY = "classifier.etf"
"""The state-dict key of the fixed frame (never on the wire, never averaged)."""
PROJECTION = frozenset({"classifier.projection.weight", "classifier.projection.bias"})


def balanced_logits(logits: torch.Tensor, counts: torch.Tensor, absent_count: float = 0.0) -> torch.Tensor:
    """The balanced loss's logits ``z_c + log n_c`` for a client with class ``counts``; ``-inf`` where ``n_c = 0``,
    or, with ``absent_count > 0``, ``z_c + log absent_count`` there."""
    n = with_absent(counts, absent_count, logits.dtype) if absent_count > 0 else counts.to(logits.dtype)
    return logits + n.log()


@register_algorithm("fedetf")
class FedETF(FedAvg):
    """FedAvg with a fixed simplex-ETF classifier, a normalised projection, a learnable temperature and the
    balanced loss; the clients' own models are fine-tuned ETF and projection."""

    paper = (
        'Li, Shang, He, Lin & Wu, ICCV 2023, "No Fear of Classifier Biases: Neural Collapse Inspired Federated '
        'Learning with Synthetic and Fixed Classifier"'
    )

    own_model = "the global model trained locally, then its ETF and projection fine-tuned in turn on the client's data"

    class Params(BalancedParams):
        # d, the ETF's dimension (>= K-1); 0: the number of classes K, as the authors' ResNets
        # (models_dict/resnet.py line 124: Proto_Classifier(num_classes, num_classes)).
        etf_dim: int = 0
        # beta's initial value (authors' models_dict/resnet.py lines 126 and 174: 1.0; it is learnt).
        temperature_init: float = 1.0
        # Alternations of the local adaptation (authors' client_funct.py line 176: 20).
        finetune_rounds: int = 20
        # Epochs of each phase of an alternation (client_funct.py lines 183 and 195: 3).
        finetune_epochs: int = 3
        # Learning rate of the ETF phase (client_funct.py line 182: plain SGD, lr 0.1).
        finetune_etf_lr: float = 0.1
        # Learning rate of the projection phase (client_funct.py line 194: 0.05, with the local momentum and decay).
        finetune_projection_lr: float = 0.05
        # A class the client lacks counts as one sample in the balanced loss (log 1 = 0: it stays in the softmax):
        # the authors' nodes.py line 157, torch.where(sample_per_class > 0, sample_per_class, 1). FedRoD's 0 (the
        # formula's limit) was FedETF's default before 2026-11-28.
        absent_count: float = 1.0

        at_least = minimums(etf_dim=0, finetune_rounds=0, finetune_epochs=1, absent_count=0)
        positive = ("temperature_init", "finetune_etf_lr", "finetune_projection_lr")

    params: Params
    upload = replace(WEIGHTS, dpsgd="its loss uses the client's class counts, which DP-SGD does not privatise")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def __init__(self, params: Params, fed: FederationInfo) -> None:
        k = fed.num_classes
        dim = params.etf_dim or k
        if k < 2 or dim < k - 1:
            raise ConfigError(f"algorithm.etf_dim must be 0 (the number of classes) or at least num_classes - 1 = "
                              f"{k - 1}, got {params.etf_dim}")
        head = (("kind", "etf"), ("dim", dim), ("temperature", params.temperature_init), ("seed", fed.seed))
        # Every engine builds the run's model from this spec: server, workers, Flower nodes, global evaluation.
        super().__init__(params, replace(fed, model=replace(fed.model, head=head)))

    def etf(self) -> torch.Tensor:
        """The fixed frame, as the seeded spec builds it (once per process)."""
        return self.initial_state()[ETF_KEY]

    # ---- server ------------------------------------------------------------------------------
    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        msg = Message(arrays=without(state_to_arrays(server.model.state_dict()), {ETF_KEY}))
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is the model without the ETF."""
        spec = super().reply_spec(task, server)
        return None if spec is None else without(spec, {ETF_KEY})

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        state, _ = self.average(server, replies, [m.arrays for _, m in replies])
        server.model.load_state_dict({**state, ETF_KEY: server.model.state_dict()[ETF_KEY]})

    # ---- client ------------------------------------------------------------------------------
    def logit_adjust(self, client: ClientContext) -> LogitAdjust | None:
        counts = client.class_counts()  # the client's own; never sent
        absent = self.params.absent_count

        def adjust(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return balanced_logits(logits, counts, absent)

        return adjust

    def with_etf(self, arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``arrays`` completed with the fixed frame (a ``train`` message does not carry it)."""
        return arrays if ETF_KEY in arrays else {**arrays, ETF_KEY: self.etf()}

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        _, reply = self.local_train(dataclasses.replace(msg, arrays=self.with_etf(msg.arrays)), client)
        reply.arrays = without(reply.arrays, {ETF_KEY})
        return reply

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model after the round's local training and ``finetune_rounds`` alternations of ETF and
        projection fine-tuning on the client's training data (drawn from its ``"finetune"`` stream)."""
        p = self.params
        model = client.model(self.with_etf(msg.arrays))
        if client.num_samples == 0:
            return state_to_arrays(model.state_dict())
        stream = client.generator("finetune")
        train_local(model, client.x, client.y, self.local_config(), stream, logit_adjust=self.logit_adjust(client))
        head = model.classifier
        assert isinstance(head, ETFClassifier)
        etf_sgd = replace(p.sgd(p.finetune_epochs), lr=p.finetune_etf_lr, momentum=0.0, weight_decay=0.0)
        projection_sgd = replace(p.sgd(p.finetune_epochs), lr=p.finetune_projection_lr)
        with head.etf_trainable():
            for _ in range(p.finetune_rounds):
                with trainable(model, {ETF_KEY}):
                    train_local(model, client.x, client.y, etf_sgd, stream)
                with trainable(model, set(PROJECTION)):
                    train_local(model, client.x, client.y, projection_sgd, stream)
        return state_to_arrays(model.state_dict())
