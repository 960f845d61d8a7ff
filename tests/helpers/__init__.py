"""Helpers the test modules share: plain functions and classes, imported as ``from tests.helpers.X import ...``.

Shared fixtures stay in the ``conftest.py`` files (pytest finds them without an import); a test module imports
neither a conftest nor another test module.

- :mod:`~tests.helpers.configs`: the tiny federation's config (``tiny_config``), for any algorithm (``config_for``).
- :mod:`~tests.helpers.runs`: runs in the test's process and their records; a resumed run equals one uninterrupted.
- :mod:`~tests.helpers.cli`: ``fedskew`` as a separate process, run to its end or started and stopped.
- :mod:`~tests.helpers.spies`: fedskew functions replaced for one test by ones that record their calls.
- :mod:`~tests.helpers.plugins`: a user's plug-in file, and forgetting what importing it registered.
- :mod:`~tests.helpers.flower`: the ServerApp and ClientApp against a stand-in SuperLink (needs Flower).
- :mod:`~tests.helpers.flower_federation`, :mod:`~tests.helpers.ray_cluster`: a real Flower federation and a
  real two-node Ray cluster on this machine.
- :mod:`~tests.helpers.pool_faults`: a worker that stops half-way through its reply (run with ``python -m``).
- :mod:`~tests.helpers.batched`: the batched runners' float64 runs and condensation requests.
- :mod:`~tests.helpers.device_draws`, :mod:`~tests.helpers.tiny_net`: what a seed draws on a device; the tiny net.
- :mod:`~tests.helpers.feddc`, :mod:`~tests.helpers.toy_federation`, :mod:`~tests.helpers.datasets`,
  :mod:`~tests.helpers.report_runs`: FedDC's recorded runs, hand-built contexts for algorithm rules, dataset
  files in their release formats, run folders for the report.
"""
