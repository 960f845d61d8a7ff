"""``environment.json``: where the run ran (:func:`~fedskew.engine.environment.record_environment`)."""

from __future__ import annotations

from fedskew.engine.callbacks.base import Loop, RoundCallback
from fedskew.engine.environment import record_environment


class Environment(RoundCallback):
    """Records the machine at the start; a resumed run on another machine warns."""

    def start(self, loop: Loop, resume: bool) -> None:
        record_environment(loop.run_dir, loop.device, resume)
