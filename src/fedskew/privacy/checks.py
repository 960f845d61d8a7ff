"""The ``[privacy]`` table against the rest of the run's config, checked when the config is (before anything runs):
each refusal is one line saying why and what to use instead."""

from __future__ import annotations

from typing import Any

from fedskew.core.errors import ConfigError
from fedskew.privacy.accounting import Accountant, require_opacus
from fedskew.privacy.mechanisms import adaptive_noise_multiplier
from fedskew.privacy.params import PrivacyParams
from fedskew.privacy.uploads import Upload, Withheld


def clients_per_round_of(params: Any, num_clients: int) -> int:
    """m: the clients a round of a method with ``params`` samples (a method's default above the number of clients
    means all of them)."""
    return max(1, min(int(getattr(params, "clients_per_round", num_clients)), num_clients))


def count_noise(params: PrivacyParams, m: int) -> float:
    """Adaptive clipping's count noise: ``count_noise``, else m / 20 (Andrew et al.'s choice)."""
    return params.count_noise if params.count_noise is not None else m / 20


def update_noise_multiplier(params: PrivacyParams, z: float, m: int) -> float:
    """The noise multiplier of the updates: ``z``, or with adaptive clipping what is left of it beside the count
    query (:func:`~fedskew.privacy.mechanisms.adaptive_noise_multiplier`); a count noise too small is one line."""
    if not params.adaptive_clip:
        return z
    sigma_b = count_noise(params, m)
    if 2 * sigma_b <= z:
        given = "privacy.count_noise" if params.count_noise is not None else f"clients per round / 20 = {m}/20"
        raise ConfigError(
            f"adaptive clipping's count noise {sigma_b:g} ({given}) is too small for privacy.noise_multiplier {z:g}: "
            f"it needs 2 * count_noise > noise_multiplier; set privacy.count_noise > {z / 2:g}"
        )
    return adaptive_noise_multiplier(z, sigma_b)


def spent_at_once(target: float, first: float) -> str:
    """The refusal of a budget the first round would exceed."""
    return (f"privacy.target_epsilon = {target:g} is spent by the first round (epsilon {first:.2f}): raise it, or "
            "privacy.noise_multiplier")


def check_privacy(privacy: PrivacyParams, algorithm: str, upload: Upload | Withheld, params: Any,
                  num_clients: int) -> None:
    """Refuse a ``[privacy]`` mechanism the method ``algorithm`` (its class's ``upload``, its ``params``) cannot
    carry, or cannot carry as configured (what each mechanism needs: docs/privacy.md)."""
    for key in ("private_sample_rate", "knowledge_clip"):  # private condensation's own keys: refused, never ignored
        value = getattr(params, key, None)
        if value is not None and privacy.mode != "condensation":
            raise ConfigError(f'algorithm.{key} = {value:g} applies only with privacy.mode = "condensation", '
                              f'got privacy.mode = "{privacy.mode}"')
    if not privacy.on:
        return
    mode = privacy.mode
    if mode == "condensation":  # checked by algorithms/condensation/private.py (with_private_condensation)
        return
    if isinstance(upload, Withheld) or not isinstance(upload, Upload):
        what = upload.what if isinstance(upload, Withheld) else "what it does not declare (Algorithm.upload)"
        use = upload.use if isinstance(upload, Withheld) else "a method that declares its upload"
        raise ConfigError(f'privacy.mode = "{mode}" needs a method whose clients upload model weights; {algorithm!r} '
                          f"uploads {what}: use {use}")
    if mode == "central" and upload.central:
        raise ConfigError(f'privacy.mode = "central" cannot privatise {algorithm!r}: {upload.central}; use '
                          'privacy.mode = "local", or fedavg')
    if mode == "sample" and upload.dpsgd:
        raise ConfigError(f'privacy.mode = "sample" cannot privatise {algorithm!r}: {upload.dpsgd}; use '
                          'privacy.mode = "central" or "local"')
    aggregation = getattr(params, "aggregation", None)
    if mode == "central" and aggregation is not None:
        # The replies the rule sees are all equal (the noised mean): a robust rule would do nothing, clip_norm would
        # clip the mean again. The outlier bound (max_norm_ratio) has nothing to judge among equal replies.
        plain = type(aggregation)()
        changed = [k for k in ("rule", "trim", "clip_norm") if getattr(aggregation, k) != getattr(plain, k)]
        if changed:
            raise ConfigError(f'privacy.mode = "central" replaces [algorithm.aggregation] (the noised mean of the '
                              f"clipped updates is the aggregate): remove algorithm.aggregation.{changed[0]}")
    if mode == "sample" and privacy.on_target == "calibrate":
        raise ConfigError('privacy.on_target = "calibrate" needs privacy.mode = "central" or "local" (DP-SGD\'s steps '
                          'and sampling rates are known only as the clients train): use on_target = "stop"')
    calibrated = privacy.on_target == "calibrate"
    if privacy.noise_multiplier == 0 and not calibrated:
        raise ConfigError(f'privacy.noise_multiplier must be > 0 for privacy.mode = "{mode}" (0 adds no noise and '
                          "gives no guarantee), got 0")
    if privacy.adaptive_clip and not calibrated:  # a calibrated multiplier is checked once derived
        update_noise_multiplier(privacy, privacy.noise_multiplier, clients_per_round_of(params, num_clients))
    require_opacus()
    if privacy.target_epsilon is not None and not calibrated and mode in ("central", "local"):
        q = clients_per_round_of(params, num_clients) / num_clients if mode == "central" else 1.0
        first = Accountant(privacy.accountant, [(privacy.noise_multiplier, q, 1)]).epsilon(privacy.delta)
        if first > privacy.target_epsilon:
            raise ConfigError(spent_at_once(privacy.target_epsilon, first))
    if mode == "sample":
        from fedskew.privacy.client import sample_dp_class

        sample_dp_class()
