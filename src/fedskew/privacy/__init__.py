"""Differential privacy for what clients share: the ``[privacy]`` table's mechanisms
(:mod:`fedskew.privacy.mechanisms`: clipping, calibrated Gaussian noise, adaptive clipping) and the
accountant that turns them into epsilon (:mod:`fedskew.privacy.accounting`, Opacus's accountants,
not written here), and sample-level DP-SGD on the clients (:mod:`fedskew.privacy.dpsgd`, per-sample gradients by
``torch.func``). docs/privacy.md says what each guarantee covers."""
