"""Differential privacy for what clients share: the ``[privacy]`` table's mechanisms
(:mod:`fedskew.privacy.mechanisms`: clipping, calibrated Gaussian noise, adaptive clipping) and the
accountant that turns them into epsilon (:mod:`fedskew.privacy.accounting`, Opacus's accountants,
not written here); sample-level DP-SGD on the clients (:mod:`fedskew.privacy.dpsgd`, per-sample gradients by
``torch.func``); client-level DP on a method's declared upload (:mod:`.uploads`): at the server (:mod:`.central`)
or on each client (:mod:`.client`, which also hands DP-SGD its ``SampleDP``); a run's accounting, budget and
records (:mod:`.run`) and the config's checks (:mod:`.checks`). docs/privacy.md says what each guarantee covers."""
