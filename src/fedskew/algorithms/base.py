"""The algorithm protocol and the registry of federated methods.

A federated method is one class that says only what is new about it. Its server half (``setup``,
``configure``, ``aggregate``, or a whole ``round``) runs where the global model is; its client half
(``client_step``) runs where a client's data is. The two halves talk only through
:class:`~fedskew.core.message.Message` objects handed over by an engine (the in-process simulator or
Flower), which owns the round loop, evaluation, logging, checkpoints and the byte ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch

from fedskew.components.trainer import LocalConfig, train_local
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import Options, minimums
from fedskew.core.registry import Registry
from fedskew.core.seeding import numpy_rng, seeded_init, torch_generator
from fedskew.models import create_model
from fedskew.models.evaluation import evaluate_model
from fedskew.models.heads import attach_head
from fedskew.models.layout import use_channels_last
from fedskew.privacy.client import ClientPrivacy
from fedskew.privacy.uploads import Upload, Withheld

EVALUATE = "evaluate"
"""The engine's own client task: evaluate the global and the client's own model on the client's test split
(:meth:`Algorithm.evaluate_client`); it never changes the client's state and is not on the byte ledger."""


@dataclass(frozen=True)
class ModelSpec:
    """How to build the federation's model; small and picklable, so both sides can build it."""

    name: str
    in_channels: int
    num_classes: int
    image_size: int
    options: tuple[tuple[str, Any], ...] = ()
    head: tuple[tuple[str, Any], ...] = ()
    """A method's own head in place of the model's last linear layer (:mod:`fedskew.models.heads`), as
    ``(("kind", name), (option, value), ...)``; empty: the model's own. The engine's spec has none; a method
    that needs one sets it in the spec of its ``fed`` (FedETF), which every engine builds from."""

    def build(self) -> torch.nn.Module:
        """A freshly initialised model (initialised from the global torch RNG)."""
        model = create_model(
            self.name,
            in_channels=self.in_channels,
            num_classes=self.num_classes,
            image_size=self.image_size,
            **dict(self.options),
        )
        return attach_head(model, self.head, self.num_classes) if self.head else model


@dataclass(frozen=True)
class FederationInfo:
    """What both halves of an algorithm know about the federation (no client data)."""

    num_clients: int
    num_classes: int
    model: ModelSpec
    seed: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_shape: tuple[int, int, int]


Replies = list[tuple[int, Message]]

SumOnly = Literal["num_samples", "equal"] | None
"""What a method's server needs of its clients' ``train`` replies when their mean is all (:attr:`Algorithm.
sum_only_uploads`): the mean weighted by ``num_samples``, the unweighted mean, or None: more than a mean."""


class Exchange(Protocol):
    """Engine call that sends each message to its client and returns the replies in the same order."""

    def __call__(
        self,
        task: str,
        messages: list[tuple[int, Message]],
        down: str | None = "server_to_client",
        up: str | None = "client_to_server",
    ) -> Replies: ...


@dataclass
class ServerContext:
    """The server side as an algorithm sees it.

    Attributes
    ----------
    fed
        Federation facts.
    model
        The global model; the engine evaluates it after every round.
    state
        The algorithm's server state (tensors, numbers, lists); checkpointed by the engine.
    round
        The current round, from 1.
    rounds
        The run's number of rounds, i.e. its last round (``run.rounds``; a resume that extends the run
        raises it); 0 where the engine does not say. Methods that act once after training (CCVR's
        calibration) read it.
    exchange
        Send messages to clients and get their replies (see :class:`Exchange`); ``down`` and ``up``
        name the ledger direction each way (``None``: not on the wire).
    metrics
        Extra figures the algorithm reports for this round (merged into ``metrics.jsonl``). Two keys
        replace the engine's own: ``clients`` (who took part; default: every client that replied to
        any exchange this round) and ``samples`` (default: the sum of the replies' ``num_samples``).
    artifacts
        Engine callback behind :meth:`save_artifact`.
    device
        Where the global model, ``state``'s tensors and the replies' arrays are (the run's ``device``).
    shard_sizes
        Each client's number of training samples, as the engine knows them (the partition in simulation, the
        sizes the nodes announced in a deployment; what :meth:`Algorithm.sample_limit` is given); empty where
        the engine does not say.
    """

    fed: FederationInfo
    model: torch.nn.Module
    exchange: Exchange
    state: dict[str, Any] = field(default_factory=dict)
    round: int = 0
    rounds: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: Callable[[str, dict[str, torch.Tensor]], None] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rejections: Callable[[int, str], None] | None = None
    shard_sizes: tuple[int, ...] = ()

    def reject(self, cid: int, reason: str) -> None:
        """Drop client ``cid``'s reply from this round's aggregate, with a reason the round's metrics keep
        (``rejected``), as the engine's own checks do (an outlying update, a robust rule's cut)."""
        if self.rejections is not None:
            self.rejections(cid, reason)

    def save_artifact(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Keep named tensors of this round in the run folder (``artifacts/<name>/round_NNNN.safetensors``).

        Methods that receive synthetic data save it here (``images`` uint8, ``labels``, ``clients``), so
        ``fedskew audit`` can measure what the server learned about the clients' raw images.
        """
        if self.artifacts is not None:
            self.artifacts(name, tensors)

    def rng(self, purpose: str) -> np.random.Generator:
        """Numpy stream for (server, round, purpose)."""
        return numpy_rng(self.fed.seed, "server", self.round, purpose)

    def generator(self, purpose: str) -> torch.Generator:
        """Torch stream for (server, round, purpose)."""
        return torch_generator(self.fed.seed, "server", self.round, purpose)


@dataclass
class ClientContext:
    """One client as its algorithm half sees it: its data, its persistent state, its random streams.

    ``state`` persists across rounds on the client side (SCAFFOLD's control variate, MOON's previous
    model, FedAF's condensed set); the server never sees it. ``x``, ``y``, the message's arrays and
    the tensors in ``state`` are on ``device`` (the engine moves them there and back); tensors a
    method creates should be too (``device=client.device``; random draws come from the CPU streams
    of :meth:`generator` and are moved, see :mod:`fedskew.core.device`).
    """

    cid: int
    round: int
    x: torch.Tensor
    y: torch.Tensor
    fed: FederationInfo
    state: dict[str, Any] = field(default_factory=dict)
    model_cache: dict[ModelSpec, torch.nn.Module] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    x_test: torch.Tensor | None = None  # the client's own test split: only in the engine's ``evaluate`` task
    y_test: torch.Tensor | None = None
    privacy: ClientPrivacy | None = None  # the mechanism the request asks of this client ([privacy])

    def dpsgd(self) -> dict[str, Any]:
        """Keyword arguments for the ``train_local`` that trains what the client uploads: ``private`` (a
        :class:`~fedskew.privacy.dpsgd.SampleDP`) under ``privacy.mode = "sample"``, else none."""
        return self.privacy.train_options() if self.privacy is not None else {}

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def class_counts(self) -> torch.Tensor:
        """Samples per class (length ``num_classes``)."""
        return torch.bincount(self.y, minlength=self.fed.num_classes)

    def generator(self, purpose: str) -> torch.Generator:
        """Torch stream for (client, round, purpose)."""
        return torch_generator(self.fed.seed, "client", self.cid, self.round, purpose)

    def rng(self, purpose: str) -> np.random.Generator:
        """Numpy stream for (client, round, purpose)."""
        return numpy_rng(self.fed.seed, "client", self.cid, self.round, purpose)

    def model(self, arrays: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        """The process's reusable model instance, loaded with ``arrays`` (a full state dict).

        Building a model every round costs more than loading weights into one kept per process.
        """
        spec = self.fed.model
        m = self.model_cache.get(spec)
        if m is None:
            m = use_channels_last(seeded_init(spec.build, self.fed.seed, "client-model").to(self.device))
            self.model_cache[spec] = m
        if arrays is not None:
            m.load_state_dict(arrays, strict=True)
        m.train()
        return m


class Algorithm:
    """Base class of every federated method.

    Subclasses define ``Params`` (a dataclass of hyper-parameters, defaults from the paper) and
    override the hooks they change. The default round is: ``configure`` chooses clients and builds
    their messages, the engine runs ``client_step("train", ...)`` on each, ``aggregate`` makes the new
    global state.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    """The paper the method follows (authors, venue and year, title), which ``fedskew list`` cites."""
    has_global_model: ClassVar[bool] = True
    unbatched_client_work: ClassVar[str] = ""
    """Set where most of a client's work has no batched form (the condensations by distribution or gradient
    matching), as what that work is: ``clients_in_parallel = "auto"`` then keeps the sequential runner, whose worker
    processes (``workers_per_device``) run clients side by side, instead of one process that would run them one
    after another."""
    own_model: ClassVar[str] = "the global model"
    """What this method evaluates as a client's own model (``personal_accuracy``), in a few words for the report
    and docs/configuration.md; a method that overrides :meth:`personal_state` says what it returns."""
    """False for methods without one (``local``): the engine then evaluates only the clients' own models."""
    sum_only_uploads: ClassVar[SumOnly] = None
    """Set where the server needs nothing of its clients but the mean of their ``train`` replies' arrays, weighted by
    each reply's ``num_samples`` (``"num_samples"``) or unweighted (``"equal"``), and no other exchange reads a
    client's data: secure aggregation (SecAgg+, ``fedskew deploy init --secagg``, docs/deploy.md) can then run the
    method. Each method class states it itself: it is read from the class, never inherited, so a subclass that
    changes what its server reads is refused until it declares it (:meth:`secagg_refusal`)."""
    not_sum_only: ClassVar[str] = (
        "does not declare that its server needs only the mean of the clients' train replies (the class attribute "
        "sum_only_uploads)"
    )
    """Why secure aggregation cannot run this method, as the rest of a sentence that starts with its name (the
    refusal quotes it); inherited, so a family of methods may share one reason."""
    upload: ClassVar[Upload | Withheld] = Withheld("what it does not declare (Algorithm.upload, docs/privacy.md)")
    """What the clients' ``train`` replies carry, for ``[privacy]``: an :class:`~fedskew.privacy.uploads.Upload`
    (model weights or updates, measured from the request) or a :class:`~fedskew.privacy.uploads.Withheld` saying
    what else they upload (condensed images, class counts ...), which private runs refuse."""

    class Params(Options):
        """A method's hyper-parameters: a dataclass (no decorator needed) whose defaults are the paper's
        values, with its bounds declared (:class:`~fedskew.core.params.Options`)."""

        clients_per_round: int = 10
        at_least = minimums(clients_per_round=1)

    def __init__(self, params: Any, fed: FederationInfo) -> None:
        self.params = params
        self.fed = fed

    @classmethod
    def sum_only(cls) -> SumOnly:
        """The class's own :attr:`sum_only_uploads` (None unless this very class declares it)."""
        declared: SumOnly = cls.__dict__.get("sum_only_uploads")
        return declared

    @classmethod
    def secagg_refusal(cls, params: Any) -> str | None:
        """Why secure aggregation cannot run this method with ``params`` (:attr:`not_sum_only`, or what in the
        parameters needs each client's reply), or None where its server needs only the mean SecAgg+ reveals."""
        return None if cls.sum_only() else cls.not_sum_only

    # ---- server side -------------------------------------------------------------------------
    def init_model(self) -> torch.nn.Module:
        """The initial global model (seeded, identical on every engine)."""
        return seeded_init(self.fed.model.build, self.fed.seed, "global-init")

    _init_state: dict[str, torch.Tensor] | None = None

    def initial_state(self) -> dict[str, torch.Tensor]:
        """The initial global model's state dict, built once per process: the model a client starts from
        before it first trains (``local``'s, Ditto's and APFL's own model, MOON's previous model)."""
        if self._init_state is None:
            self._init_state = state_to_arrays(self.init_model().state_dict())
        return self._init_state

    def setup(self, server: ServerContext) -> None:
        """One-time phase before round 1 (clustering, a census ...). Default: nothing."""

    def restore(self, server: ServerContext) -> None:
        """Re-create transient server state (``state`` keys starting with ``_``) after a resume."""

    def round(self, server: ServerContext) -> None:
        """One round: configure, exchange ``train`` messages, aggregate."""
        replies = server.exchange("train", self.configure(server))
        self.aggregate(server, replies)

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        """Choose this round's clients and the message each gets."""
        raise NotImplementedError

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Make the new global state from the replies (possibly none, if every client failed)."""
        raise NotImplementedError

    def reply_scalars(self, task: str, server: ServerContext) -> dict[str, tuple[float, float | None]]:
        """The scalar metrics a valid reply to ``task`` must carry: name -> (lowest, highest or None).

        The engine rejects a reply that lacks one, or whose value is not a finite number in range; it
        also caps ``num_samples`` at :meth:`sample_limit`. Default: a ``train`` reply says how many
        samples it trained on, which is what averaging weights by.
        """
        return {"num_samples": (0.0, None)} if task == "train" else {}

    def sample_limit(self, cid: int, shard_size: int, server: ServerContext) -> float:
        """The most samples client ``cid`` may claim in a reply: its shard (the server knows each
        client's shard size in simulation, and the one the deployment announced). Methods that train
        on more than the shard (oversampling, relayed data) raise it."""
        return float(shard_size)

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """The arrays a valid reply to ``task`` holds (name -> (shape, dtype)), or None for no check.

        The engine rejects replies that do not match (missing, extra, wrong shape or dtype), so a
        method whose replies carry other arrays than its parent's must override this.
        """
        return None

    # ---- client side -------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        """Run ``task`` on a client's data and return the reply."""
        raise ConfigError(f"{self.name}: unknown client task {task!r}")

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's own model, as a full state dict, given the global model in ``msg.arrays``.

        Default: the global model (the method has no model of its own). FedBN puts the client's own
        normalisation layers on it; ``local`` returns the client's model. Must not change ``client.state``.
        """
        return msg.arrays

    def evaluate_client(self, msg: Message, client: ClientContext) -> Message:
        """The engine's ``evaluate`` task: accuracy on the client's own test split (``client.x_test``).

        ``msg.arrays`` is the global model (empty for methods without one); ``msg.config`` holds
        ``personalized_epochs`` and the local SGD settings of the fine-tuning (``lr``, ``batch_size``,
        ``momentum``). The reply's metrics: ``num_test``; ``global_correct`` (the global model), and
        ``personal_correct``, the client's own model (:meth:`personal_state`) after
        ``personalized_epochs`` epochs of local SGD on the client's training data (0: as it is). The
        fine-tuning draws from the client's ``"personalize"`` stream of the round and changes nothing
        the client keeps.
        """
        assert client.x_test is not None and client.y_test is not None
        c = msg.config
        n = int(client.y_test.shape[0])
        metrics: dict[str, float] = {"num_test": float(n)}
        if self.has_global_model:
            model = client.model(msg.arrays)
            metrics["global_correct"] = float(evaluate_model(model, client.x_test, client.y_test, self.fed.num_classes)
                                              .correct.sum())
        own = self.personal_state(msg, client)
        model = client.model(own)  # loads a copy: fine-tuning changes neither ``own`` nor the message
        epochs = int(c.get("personalized_epochs", 0))
        if epochs > 0 and client.num_samples > 0:
            local = LocalConfig(batch_size=int(c.get("batch_size", 64)), lr=float(c.get("lr", 0.01)),
                                momentum=float(c.get("momentum", 0.0)), epochs=epochs)
            train_local(model, client.x, client.y, local, client.generator("personalize"))
        metrics["personal_correct"] = float(
            evaluate_model(model, client.x_test, client.y_test, self.fed.num_classes).correct.sum()
        )
        return Message(metrics=metrics)


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: register an algorithm under ``name`` (also sets ``cls.name``)."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        return ALGORITHMS.register(name)(cls)

    return deco


def make_algorithm(name: str, params: Any, info: FederationInfo) -> Algorithm:
    """The algorithm registered as ``name``, with its typed, checked parameters (a run config's
    ``config.algorithm``: :class:`~fedskew.config.schema.Component`)."""
    return ALGORITHMS.get(name)(params, info)
