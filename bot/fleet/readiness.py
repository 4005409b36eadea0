"""Whether this process takes calls: a small state that only moves forward, starting → ready → draining.

`/readyz` answers 200 only while it is ready; otherwise 503 with the reason. `switchboard run` makes it
ready once the Discord gateway is connected (every server's GUILD_CREATE is in) and drains it at
SIGTERM or Ctrl-C, before anything is shut down. Steps registered with `on_drain` run right after the
state turns to draining, in order: the fleet's hand-off (a peer taking the shards, issue 26) belongs
there; a step that fails is logged and the shutdown goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum

log = logging.getLogger(__name__)

DrainStep = Callable[[], Awaitable[None]]


class Phase(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class Readiness:
    def __init__(self, starting: str = "starting") -> None:
        self.phase = Phase.STARTING
        self.reason = starting
        self._steps: list[DrainStep] = []

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.READY

    def ready(self) -> None:
        """Takes calls from now on (a process already draining stays draining)."""
        if self.phase is Phase.STARTING:
            self.phase, self.reason = Phase.READY, "ready"

    def on_drain(self, step: DrainStep) -> None:
        self._steps.append(step)

    async def drain(self, reason: str) -> None:
        """Stop taking calls (`reason` is what `/readyz` says), then run the drain steps once."""
        if self.phase is Phase.DRAINING:
            return
        self.phase, self.reason = Phase.DRAINING, reason
        steps, self._steps = self._steps, []
        for step in steps:
            try:
                await step()
            except Exception:
                log.exception("a drain step failed; shutting down anyway")
