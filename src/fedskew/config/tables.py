"""The tables of a run config beside the named ones: simulated faults (``[faults]``), the Ray engine (``[ray]``),
the per-client evaluation (``[eval]``) and the run's extra logs (``[logging]``). Each is an
:class:`~fedskew.core.params.Options` class; :class:`~fedskew.config.schema.RunConfig` holds one of each."""

from __future__ import annotations

import importlib.util
from typing import Literal

from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, check, minimums
from fedskew.core.seeding import numpy_rng


class Faults(Options):
    """Simulated client failures (the ``[faults]`` config table).

    Attributes
    ----------
    dropout
        Probability that a contacted client never replies (it does no work).
    straggler
        Probability that a client's reply arrives after the round's deadline: it did the work, but
        the server has moved on and discards the reply.
    corrupt
        Probability that a client's reply is corrupted on the way (fault injection, to test that the
        server rejects it and carries on).
    attack
        How a corrupted reply is damaged: ``nan``, ``inf``, ``shape``, ``dtype``, ``missing`` (drop an
        array), ``extra`` (add one), ``oversized``, ``labels`` (out-of-range labels) or ``not_message``.
    max_reply_mb
        Replies larger than this are rejected as oversized.
    malicious
        Fraction of the clients (a fixed set drawn from the seed) that attack by model replacement:
        their ``train`` replies carry ``w - malicious_scale * (w_k - w)`` for the global model w and
        their honest model w_k, a boosted update in the opposite direction (Bagdasaryan et al.,
        AISTATS 2020, scale their update so it replaces the average). For robust-aggregation studies.
    malicious_scale
        The boost of a malicious update (about the number of clients per round replaces the model).
    """

    dropout: float = 0.0
    straggler: float = 0.0
    corrupt: float = 0.0
    attack: Literal["nan", "inf", "shape", "dtype", "missing", "extra", "oversized", "labels", "not_message"] = "nan"
    max_reply_mb: float = 512.0
    malicious: float = 0.0
    malicious_scale: float = 10.0

    fractions = ("dropout", "straggler", "corrupt", "malicious")
    positive = ("max_reply_mb", "malicious_scale")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.dropout + self.straggler + self.corrupt < 1, "dropout + straggler + corrupt",
            self.dropout + self.straggler + self.corrupt, "< 1",
        )

    def attackers(self, seed: int, num_clients: int) -> frozenset[int]:
        """The malicious clients of a run: ``round(malicious * num_clients)`` of them, drawn from the seed."""
        k = round(self.malicious * num_clients)
        return frozenset(int(c) for c in numpy_rng(seed, "malicious").permutation(num_clients)[:k])

    def fate(self, seed: int, round: int, cid: int, task: str) -> str | None:
        """``"dropout"``, ``"straggler"``, ``"corrupt"`` or None for this (round, client, task); deterministic."""
        if self.dropout == 0 and self.straggler == 0 and self.corrupt == 0:
            return None
        u = numpy_rng(seed, "fault", round, cid, task).random()
        if u < self.dropout:
            return "dropout"
        if u < self.dropout + self.straggler:
            return "straggler"
        if u < self.dropout + self.straggler + self.corrupt:
            return "corrupt"
        return None



class RayParams(Options):
    """The ``[ray]`` table: where the Ray engine (``engine = "ray"``) runs client jobs.

    Attributes
    ----------
    address
        A running cluster to join (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``); empty: start a
        local Ray instance for this run.
    num_cpus, num_gpus
        Resources each client job asks of Ray (fractions allowed: 0.5 GPU lets two jobs share one).
    scheduling
        ``"spread"`` (default): Ray places a round's jobs across the nodes that have room, round-robin
        (its ``SPREAD`` strategy), so every node trains clients even when one could take them all in
        turn; ``"default"``: Ray's own policy, which fills the driver's node first.
    """

    address: str = ""
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    scheduling: Literal["spread", "default"] = "spread"

    positive = ("num_cpus",)
    at_least = minimums(num_gpus=0)


class EvalParams(Options):
    """The ``[eval]`` table: the per-client evaluation (needs ``partition.client_test_fraction > 0``).

    Every ``eval_every`` rounds each client evaluates the global model and its own model on its own test
    split (``metrics.jsonl``: ``client_accuracy`` and ``personal_accuracy``, per client and as mean, std,
    worst 10% and best).

    Attributes
    ----------
    personalized_epochs
        Epochs of local SGD on the client's training data before its own model is evaluated (0: as
        it is: the global model for methods without a model of their own, FedBN's with the client's
        normalisation layers, ``local``'s own model). The fine-tuned model is thrown away.
    personalized_lr, personalized_batch_size
        That SGD's learning rate and batch size; None: the method's own ``lr`` and ``batch_size`` when
        it has them, else 0.01 and 64.
    """

    personalized_epochs: int = 0
    personalized_lr: float | None = None
    personalized_batch_size: int | None = None

    at_least = minimums(personalized_epochs=0, personalized_batch_size=1)
    positive = ("personalized_lr",)  # None: the method's own


MISSING_TENSORBOARD = (
    "tensorboard = true needs TensorBoard, which is not installed: pip install tensorboard (from a clone: "
    "pip install -e '.[tensorboard]')"
)
"""Why a run with ``logging.tensorboard = true`` is refused where TensorBoard is missing (after ``logging.``)."""


class LoggingParams(Options):
    """The ``[logging]`` table: logs a run writes besides its own files (which never change with it).

    Attributes
    ----------
    tensorboard
        Write TensorBoard event files under ``<run folder>/tensorboard/``: every per-round scalar of
        ``metrics.jsonl``, the per-class accuracies and the images of the run's artifacts (needs the
        ``fedskew[tensorboard]`` extra; refused at once without it).
    wandb, wandb_project
        Report every round to Weights & Biases, in this project (``pip install wandb``; offline with
        ``WANDB_MODE=offline``); see :mod:`fedskew.engine.trackers`.
    mlflow, mlflow_uri
        Report every round to MLflow, at this tracking URI (empty: ``MLFLOW_TRACKING_URI``, else a file store
        ``mlruns/`` beside the run folders; ``pip install mlflow-skinny``).
    """

    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "fedskew"
    mlflow: bool = False
    mlflow_uri: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(MISSING_TENSORBOARD)
        for on, module, package in ((self.wandb, "wandb", "wandb"), (self.mlflow, "mlflow", "mlflow-skinny")):
            if on and importlib.util.find_spec(module) is None:
                raise ConfigError(f"{module} = true needs {package}, which is not installed: pip install {package}")
