"""FedDC with local drift decoupling and correction (Gao, Fu, Li, Chen, Xu & Xu, CVPR 2022, "FedDC:
Federated Learning with Non-IID Data via Local Drift Decoupling and Correction"); registered as
``feddc_drift``. Not Kim & Choi's dataset-condensation FedDC ("Stable Federated Learning with Dataset
Condensation", 2022), which fedskew calls ``feddc``.

Each client i keeps, in ``client.state``, a local drift h_i and a correction state g_i (both zero at
first, parameter-shaped). Given the global model w and the server's correction state g, it minimises

    L_i(theta) + (alpha/2) ||theta + h_i - w||^2 + <theta, g - g_i>

by plain SGD (K steps of rate eta), then, with Delta_i = theta_i - w,

    h_i <- h_i + Delta_i,        g_i+ = g_i - g - Delta_i / (K eta),

and replies with theta_i and Delta g_i = g_i+ - g_i. The server keeps H, the mean drift over all N
clients, and g (``server.state``, zero at first):

    H <- H + (1/N) sum_{i in S} Delta_i,     g <- g + (1/N) sum_{i in S} Delta g_i,
    w <- (1/|S|) sum_{i in S} theta_i + H.

This is the authors' code (gaoliang13/FedDC, ``utils_methods_FedDC.py`` lines 163-189 and
``utils_general.py`` lines 428 and 467-471) for clients of equal size: the code divides alpha and g by
v_i = n_i / mean n and weights Delta g_i by v_i (lines 26-27, 164-165, 178), and v_i is 1 then; and the
code's K is one for all clients, the steps of a mean-sized shard, with the undecayed lr (line 175), where
the default here uses each client's own K. ``scaling = "shard"`` follows the code on both: the server takes
each n_i from the shard sizes the engine knows (``ServerContext.shard_sizes``: the partition in simulation, the
sizes the nodes announce in a deployment) and sends client i v_i and the mean n; the client trains with
alpha / v_i and g / v_i, takes K = ceil(mean n / B) * E, and sends v_i Delta g_i, so the server's g gains
(1/N) sum_S v_i Delta g_i. ``scaling = "equal"`` (default) is v_i = 1 and each client's own K. Gradient
norms are not clipped unless ``max_grad_norm`` is set (the code clips every method's steps at 10).
``H`` is exactly the code's mean of every client's h_i (absent clients' drifts included), which the
server can follow because h_i changes only by Delta_i = theta_i - w, known from the uploaded theta_i; so
the drift-corrected model theta_i + h_i never travels. That holds while every reply is accepted: a client
whose reply is lost or rejected has already updated its h_i and g_i (as SCAFFOLD's c_i), which H and g then
leave out. The terms act on parameters; buffers (BatchNorm
statistics) take the plain mean of the round's clients. ``correction = False`` drops the <theta, g - g_i>
term and g altogether (an ablation; the drift and its penalty stay).

Which model is evaluated is a reading the paper's text (not available here) leaves to its code, and the
code records both (``utils_methods_FedDC.py``: ``avg_model_sel``, the mean of the round's theta_i, and
``cur_cld_model``, that mean plus H): ``evaluate = "cloud"`` (default) evaluates the model the clients get
next, w = mean theta_i + H; ``evaluate = "mean"`` evaluates the mean of the round's theta_i, the server
keeping it as its model and sending it plus H. Training is the same under both, bit for bit.

Wire: down w and g, up theta_i and Delta g_i: twice FedAvg each way for models without buffers (buffers
travel once); with ``correction = False``, FedAvg's.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import weighted_mean
from fedskew.components.server_opt import param_keys, zeros_like
from fedskew.components.terms import linear_term, proximal_term
from fedskew.components.trainer import GradHook, LossTerm
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message, Scalar, arrays_with_prefix, state_to_arrays
from fedskew.core.params import check, minimums
from fedskew.privacy.uploads import Upload


@register_algorithm("feddc_drift")
class FedDCDrift(FedAvg):
    """Local drift decoupling (h_i) and gradient correction (g_i - g) of Gao et al.; not ``feddc``."""

    paper = (
        'Gao, Fu, Li, Chen, Xu & Xu, CVPR 2022, "FedDC: Federated Learning with Non-IID Data via Local Drift '
        'Decoupling and Correction" (local drift correction; not the dataset-condensation FedDC of Kim & Choi, '
        '`feddc`)'
    )

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # the aggregate adds the mean drift: [algorithm.aggregation] refused
        # alpha_coef of the authors' CIFAR-10 and CIFAR-100 scripts (MNIST: 0.1, synthetic: 0.005)
        alpha: float = 0.01
        correction: bool = True  # the gradient-correction term <theta, g - g_i> (False: drift only)
        # the model evaluated: "cloud" = mean theta_i + H (sent next), "mean" = mean theta_i (the code records both)
        evaluate: Literal["cloud", "mean"] = "cloud"
        # "equal": v_i = 1 and each client's own K; "shard": the code's v_i = n_i / mean n and one K (see above)
        scaling: Literal["equal", "shard"] = "equal"
        # clip each local step's gradient (loss and both terms) to this norm; None: no clipping (the code: 10)
        max_grad_norm: float | None = None

        at_least = minimums(alpha=0)

        def __post_init__(self) -> None:
            super().__post_init__()
            # g_i+ reads -(theta_i - w)/(K eta) as the mean local gradient: plain SGD only (as SCAFFOLD's option II).
            check(self.momentum == 0, "momentum", self.momentum, "0 for feddc_drift (its correction assumes plain SGD)")
            check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm,
                  "a positive number, or unset for no clipping")

    params: Params
    upload = Upload(measured_from=(("theta.", "w."), ("dg.", None)))  # the model from w, and the change of g

    sum_only_uploads = "equal"  # secure aggregation: only the train replies' unweighted mean (and their count) is read

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        params = dict(server.model.named_parameters())
        zero = zeros_like({k: params[k].detach() for k in param_keys(server.model)})
        server.state["H"] = zero
        if self.params.correction:
            server.state["g"] = zeros_like(zero)
        if self.params.scaling == "shard" and len(server.shard_sizes) != self.fed.num_clients:
            raise FedskewError("feddc_drift: scaling = 'shard' needs every client's shard size, which this engine "
                               "does not give; use scaling = 'equal'")

    def shard_configs(self, server: ServerContext) -> list[dict[str, Scalar]]:
        """What each client needs under ``scaling = "shard"``: v_i = n_i / mean n and the mean shard size (whose
        step count is every client's K)."""
        sizes = server.shard_sizes
        mean = sum(sizes) / len(sizes)
        return [{"v": n / mean, "mean_n": mean} for n in sizes]

    def sent_model(self, server: ServerContext) -> dict[str, torch.Tensor]:
        """The model the clients get, w: the server's model, plus H when the server keeps the mean of the
        theta_i as its (evaluated) model (``evaluate = "mean"``)."""
        w = server.model.state_dict()
        if self.params.evaluate == "mean":
            H: dict[str, torch.Tensor] = server.state["H"]
            w = {k: v + H[k] if k in H else v for k, v in w.items()}
        return w

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        arrays = state_to_arrays(self.sent_model(server), "w.")
        if self.params.correction:
            arrays.update(state_to_arrays(server.state["g"], "g."))
        if self.params.scaling == "equal":
            msg = Message(arrays=arrays)
            return [(cid, msg) for cid in self.select(server)]
        configs = self.shard_configs(server)
        return [(cid, Message(arrays=arrays, config=configs[cid])) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply holds theta_i (the model's keys) and, with the correction, Delta g_i (parameters)."""
        if task != "train":
            return None
        spec = {f"theta.{k}": (tuple(v.shape), v.dtype) for k, v in server.model.state_dict().items()}
        if self.params.correction:
            spec.update({f"dg.{k}": (tuple(v.shape), v.dtype) for k, v in server.state["g"].items()})
        return spec

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        n = self.fed.num_clients
        equal = [1.0] * len(replies)
        w = self.sent_model(server)
        mean = weighted_mean([arrays_with_prefix(m.arrays, "theta.") for _, m in replies], equal)
        H: dict[str, torch.Tensor] = server.state["H"]
        share = len(replies) / n  # sum_{i in S} Delta_i / N = (|S|/N) (mean theta - w)
        cloud = self.params.evaluate == "cloud"
        for k in H:
            H[k].add_(mean[k] - w[k], alpha=share)
            if cloud:
                mean[k] = mean[k] + H[k]
        server.model.load_state_dict(mean)
        if self.params.correction:
            dg = weighted_mean([arrays_with_prefix(m.arrays, "dg.") for _, m in replies], equal)
            for k, d in dg.items():
                server.state["g"][k].add_(d, alpha=share)

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        shard = p.scaling == "shard"
        v = float(msg.config["v"]) if shard else 1.0  # v_i = n_i / mean n ("shard"), 1 ("equal")
        w = arrays_with_prefix(msg.arrays, "w.")
        keys = param_keys(client.model())
        h: dict[str, torch.Tensor] = client.state.get("h") or {k: torch.zeros_like(w[k]) for k in keys}
        terms: list[LossTerm] = []
        if p.alpha > 0:  # (alpha_i/2)||theta - (w - h_i)||^2, alpha_i = alpha / v_i (exact for v_i = 1)
            terms.append(proximal_term({k: w[k] - h[k] for k in keys}, p.alpha / v))
        if p.correction:
            g = arrays_with_prefix(msg.arrays, "g.")
            if shard:  # the code's global_update_last = g / v_i
                g = {k: t / v for k, t in g.items()}
            g_i: dict[str, torch.Tensor] = client.state.get("g_i") or zeros_like(g)
            terms.append(linear_term({k: g_i[k] - g[k] for k in keys}))  # -<g_i - g, theta> = <theta, g - g_i>
        hooks = [] if p.max_grad_norm is None else [clip_gradients(p.max_grad_norm)]
        res, reply = self.local_train(Message(arrays=w), client, terms=terms, grad_hooks=hooks)
        theta = reply.arrays
        delta = {k: theta[k] - w[k] for k in keys}
        client.state["h"] = {k: h[k] + delta[k] for k in keys}
        arrays = {f"theta.{k}": t for k, t in theta.items()}
        if p.correction:
            steps = self.mean_shard_steps(float(msg.config["mean_n"])) if shard else res.steps
            scale = 1.0 / (max(steps, 1) * p.lr)  # 1/(K eta)
            g_new = {k: g_i[k] - g[k] - delta[k] * scale for k in keys}
            client.state["g_i"] = g_new
            if shard:  # the code's delta_g_cur = (g_i+ - g_i) * v_i, summed by the server
                arrays.update({f"dg.{k}": (g_new[k] - g_i[k]) * v for k in keys})
            else:
                arrays.update({f"dg.{k}": g_new[k] - g_i[k] for k in keys})
        return Message(arrays=arrays, metrics=reply.metrics)

    def mean_shard_steps(self, mean_n: float) -> int:
        """K under ``scaling = "shard"``: the steps of a mean-sized shard, ceil(mean n / B) per epoch (the
        code's ``n_minibatch``), capped at ``max_steps`` where the local training is."""
        cfg = self.local_config()
        steps = math.ceil(mean_n / cfg.batch_size) * cfg.epochs
        return steps if cfg.max_steps is None else min(steps, cfg.max_steps)


def clip_gradients(max_norm: float) -> GradHook:
    """A gradient hook that scales the step's whole gradient down to norm ``max_norm`` when it is larger (the
    authors' ``torch.nn.utils.clip_grad_norm_`` after every backward pass, ``utils_methods_FedDC.py``)."""

    def hook(model: torch.nn.Module) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    return hook
