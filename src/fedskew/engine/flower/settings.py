"""The run settings of a deployment (the app's ``[tool.flwr.app.config]``), and what secure aggregation refuses.

Neither needs Flower: ``fedskew deploy init`` checks the settings, and whether the experiment can run under secure
aggregation, on any machine before it writes the app; the ServerApp checks them again before it contacts a node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, check, maximums, minimums, option

if TYPE_CHECKING:
    from fedskew.config.schema import RunConfig

SECAGG_MODULUS = 2**32
"""SecAgg+'s modulus (Flower's ``modulus_range``): masks and masked sums are taken modulo it, so the quantised sum of
a round's uploads must stay below it."""


class DeploySettings(Options, frozen=True):
    """The run settings of a deployment (the app's ``[tool.flwr.app.config]``; see docs/deploy.md)."""

    experiment: str = option("experiment.toml", help="the fedskew config, inside the app folder")
    overrides: str = option("", help='dotted overrides as on the command line: "rounds=5 partition.alpha=0.5"')
    label: str = option("", help="the variant to run when the config has several")
    out: str = option("runs/deploy", help="parent of the run folder, on the SuperLink's machine")
    data_dir: str = option("", help="the server's dataset folder (test set); default $FEDSKEW_DATA")
    resume: bool = option(False, help="continue out/<label>-seed<k> from its last checkpoint")
    reply_timeout: float = option(0.0, help="seconds an exchange waits for replies (0: until Flower reports the "
                                            "node lost)")
    min_reply_fraction: float = option(0.5, help="stop the run when fewer of an exchange's clients answer")
    node_wait: float = option(300.0, help="seconds to wait at the start for SuperNodes serving every partition")
    secagg: bool = option(False, help="aggregate the clients' train uploads with Flower's SecAgg+ protocol: the "
                                      "server learns only their weighted sum (docs/deploy.md)")
    secagg_num_shares: int = option(0, help="SecAgg+: shares each client's secrets are split into, one per "
                                            "neighbour, itself included (odd, >= 3); 0: every client of the round")
    secagg_reconstruction_threshold: float = option(
        0.6, help="SecAgg+: fraction of a client's shares that rebuild its secrets (in (0.5, 1]); higher: more "
                  "colluding clients needed to unmask one, fewer dropouts tolerated")
    secagg_clipping_range: float = option(8.0, help="SecAgg+: each value a client uploads (its weighted update) is "
                                                    "clipped to [-range, range] before quantisation")
    secagg_quantization_range: int = option(
        2**22, help="SecAgg+: the clipping range is quantised to this many integer steps (2 * range / steps each)")

    at_least = minimums(reply_timeout=0, secagg_quantization_range=2)  # reply_timeout 0: no timeout
    at_most = maximums(min_reply_fraction=1, secagg_quantization_range=2**31 - 1)  # Flower quantises to int32
    positive = ("min_reply_fraction", "node_wait", "secagg_clipping_range")

    def __post_init__(self) -> None:
        super().__post_init__()
        n, t = self.secagg_num_shares, self.secagg_reconstruction_threshold
        check(n == 0 or (n >= 3 and n % 2 == 1), "secagg_num_shares", n,
              "an odd integer >= 3, or 0 for every client of the round")
        check(0.5 < t <= 1, "secagg_reconstruction_threshold", t, "in (0.5, 1]")


def check_secure_aggregation(config: RunConfig, settings: DeploySettings) -> None:
    """Refuse, in one line naming what and why, a run that secure aggregation cannot carry (none when it is off):
    a method whose server needs more than the mean of the uploads (its :meth:`~fedskew.algorithms.base.Algorithm.
    secagg_refusal`), simulated faults that act on a reply after it joined the sum, differential privacy that clips
    on the server, a round of one client, more shares than clients, a quantisation whose sum would wrap around
    SecAgg+'s modulus."""
    if not settings.secagg:
        return
    from fedskew.algorithms.base import ALGORITHMS

    method = config.algorithm
    why = ALGORITHMS.get(method.name).secagg_refusal(method.params)
    if why:
        raise ConfigError(f"secure aggregation: algorithm {method.name!r} {why}")
    for key in ("straggler", "corrupt", "malicious"):
        value = getattr(config.faults, key)
        if value:
            raise ConfigError(
                f"secure aggregation: faults.{key} = {value:g} acts on a client's reply after SecAgg+ has added its "
                f"upload to the sum, which cannot be taken out: set faults.{key}=0"
            )
    if config.privacy.mode == "central":
        raise ConfigError(
            "secure aggregation: privacy.mode = 'central' clips each client's update on the server, which needs every "
            "update on its own; SecAgg+ reveals only their sum: use privacy.mode=local (each client clips and adds "
            "its noise before its upload is masked)"
        )
    num_clients = int(config.partition.params.num_clients)
    clients = min(int(getattr(method.params, "clients_per_round", num_clients)), num_clients)
    if clients < 2:
        raise ConfigError(f"secure aggregation: algorithm.clients_per_round = {clients}, but the sum of one client's "
                          "upload is the upload itself: SecAgg+ needs at least 2 clients a round")
    if settings.secagg_num_shares > clients:
        raise ConfigError(f"secure aggregation: secagg_num_shares = {settings.secagg_num_shares} exceeds the "
                          f"{clients} clients of a round: at most {clients}, or 0 for every client of the round")
    steps = settings.secagg_quantization_range
    if clients * steps >= SECAGG_MODULUS:
        raise ConfigError(
            f"secure aggregation: secagg_quantization_range = {steps} for {clients} clients a round lets the "
            f"quantised sum reach 2**32, SecAgg+'s modulus, where it wraps: at most {(SECAGG_MODULUS - 1) // clients}"
        )
