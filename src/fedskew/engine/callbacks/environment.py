"""``environment.json``: where the run ran (:func:`~fedskew.engine.environment.record_environment`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedskew.engine.callbacks import RoundCallback
from fedskew.engine.environment import record_environment

if TYPE_CHECKING:
    from fedskew.engine.round_loop import RoundLoop


class Environment(RoundCallback):
    """Records the machine at the start; a resumed run on another machine warns."""

    def start(self, loop: RoundLoop, resume: bool) -> None:
        record_environment(loop.run_dir, loop.device, resume)
