"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, MLSys 2020, "Federated Optimization in
Heterogeneous Networks"): FedAvg whose clients minimise h_k(w) = F_k(w) + (mu/2)||w - w^t||^2 (Eq. 2),
so that local models stay near the global model w^t on skewed data."""

from __future__ import annotations

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.terms import parameter_copy, proximal_term
from fedskew.core.message import Message
from fedskew.core.params import minimums


@register_algorithm("fedprox")
class FedProx(FedAvg):
    """FedAvg plus the proximal term; ``mu = 0`` is FedAvg exactly."""

    paper = (
        'Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, MLSys 2020, "Federated Optimization in Heterogeneous '
        'Networks"'
    )

    class Params(FedAvg.Params):
        # Li et al. tune mu in {0.001, 0.01, 0.1, 0.5, 1} (Sec. 5.2); 0.01 is the value most of their
        # heterogeneous settings use and the common default of later benchmarks.
        mu: float = 0.01

        at_least = minimums(mu=0)

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train" or self.params.mu == 0:
            # Without the term the objective is FedAvg's; adding a zero term would only cost time.
            return super().client_step(task, msg, client)
        anchor = parameter_copy(client.model(msg.arrays))
        return self.local_train(msg, client, terms=[proximal_term(anchor, self.params.mu)])[1]
