"""The ``[privacy]`` table: which differential-privacy mechanism a run applies, with what noise and clip, and
how its epsilon is accounted (docs/privacy.md, docs/configuration.md)."""

from __future__ import annotations

from typing import Literal

from fedskew.core.params import Options, check, maximums, minimums, option


class PrivacyParams(Options):
    """The ``[privacy]`` table (``mode = "off"``, the default, changes nothing).

    Attributes
    ----------
    mode
        ``off``; ``central``: client-level DP at the server (each client's update clipped to ``clip``, Gaussian
        noise of std ``noise_multiplier * clip`` added to their sum by the server); ``local``: each client
        clips its own update and adds that noise before sending; ``sample``: sample-level DP-SGD on the
        clients (per-sample gradients clipped to ``clip``, noise added to each batch's sum);
        ``condensation``: private condensed uploads (each real example's embedding clipped to ``clip``, noise
        added to the class sums the synthetic images are matched to).
    noise_multiplier
        Noise std divided by the sensitivity (``clip``); ignored when ``on_target = "calibrate"`` derives it.
    clip
        The clipping norm (of an update, a sample's gradient or an example's embedding, by ``mode``).
    adaptive_clip, target_quantile, clip_lr, count_noise
        Adaptive clipping (Andrew et al., NeurIPS 2021; ``central`` only): after each round the clip moves
        geometrically, at rate ``clip_lr``, towards the ``target_quantile`` of the clients' update norms,
        released with N(0, ``count_noise``^2) noise on the count (None: clients per round / 20, the paper's
        choice); the updates' noise multiplier is raised so that the two queries together cost what
        ``noise_multiplier`` alone would.
    delta
        The delta of the (epsilon, delta) guarantee the run reports.
    target_epsilon, on_target
        A budget: ``stop`` ends the run cleanly (resumable, with a higher budget) before the round that would
        exceed it; ``calibrate`` derives the noise multiplier before the run so that the planned rounds
        spend exactly the budget. None: no budget; epsilon is still recorded.
    accountant
        Opacus's ``rdp`` (Rényi DP) or ``prv`` (privacy loss random variables) accountant.
    noise_seed
        ``run``: the noise is drawn from streams seeded by the run's seed and the (round, client) it serves, so a
        private run is reproducible and resumes byte-identically, and whoever knows the seed can regenerate the
        noise (a simulation's guarantee); ``secret``: every release's noise stream is seeded from the operating
        system's randomness (``secrets``) where the noise is added, known to nobody (a deployment's guarantee;
        runs are then not reproducible).
    """

    mode: Literal["off", "central", "local", "sample", "condensation"] = option(
        "off", help="off, central or local (client-level DP), sample (DP-SGD) or condensation (private uploads)")
    noise_multiplier: float = option(1.0, help="noise std / clip")
    clip: float = option(1.0, help="clipping norm (update, sample gradient or embedding)")
    adaptive_clip: bool = option(False, help="adapt the clip to a quantile of update norms (central)")
    target_quantile: float = option(0.5, help="the quantile adaptive clipping aims at")
    clip_lr: float = option(0.2, help="adaptive clipping's geometric rate")
    count_noise: float | None = option(None, help="noise std of adaptive clipping's count (None: clients/20)")
    delta: float = option(1e-5, help="the delta of the reported (epsilon, delta)")
    target_epsilon: float | None = option(None, help="privacy budget (None: none)", resumable=True)
    on_target: Literal["stop", "calibrate"] = option("stop", help="stop at the budget, or calibrate the noise to it")
    accountant: Literal["rdp", "prv"] = option("rdp", help="Opacus accountant")
    noise_seed: Literal["run", "secret"] = option(
        "run", help="seed the noise from the run's seed (reproducible) or from the OS's randomness (secret)")

    at_least = minimums(noise_multiplier=0.0)
    at_most = maximums(clip_lr=10.0)
    positive = ("clip", "clip_lr", "count_noise", "target_epsilon", "delta")
    fractions = ("delta",)
    unit = ("target_quantile",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.adaptive_clip:
            check(self.mode == "central", "adaptive_clip", self.adaptive_clip,
                  'false unless privacy.mode = "central"')
        if self.target_epsilon is not None:
            check(self.on, "target_epsilon", self.target_epsilon, 'unset while privacy.mode = "off" (a budget needs a '
                  "mechanism to spend it)")
        if self.noise_seed == "secret":
            check(self.on, "noise_seed", self.noise_seed, 'unset while privacy.mode = "off" (there is no noise)')
        if self.on_target == "calibrate":
            check(self.target_epsilon is not None, "on_target", self.on_target,
                  '"stop" unless privacy.target_epsilon is set')

    @property
    def on(self) -> bool:
        """Whether the run applies a mechanism."""
        return self.mode != "off"
