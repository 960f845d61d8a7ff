"""Differential privacy for what clients share: the ``[privacy]`` table's mechanisms
(:mod:`fedskew.privacy.mechanisms`: clipping, calibrated Gaussian noise, adaptive clipping) and the
accountant that turns them into epsilon (:mod:`fedskew.privacy.accounting`, Opacus's accountants,
not written here). docs/privacy.md says what each guarantee covers."""
