"""What every lane offers the runs service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from runs.core import Observation, RunTicket

Emit = Callable[[Observation], Awaitable[None]]


class LaneError(RuntimeError):
    """A lane refused or failed an operation; the message is one sentence a user can act on."""


class SubmitUnknown(LaneError):
    """The submission went out but no answer came back: the lane may have started the run. It is never
    sent again (that could start it twice); the run is recorded as unknown and a person decides."""


class AlreadyEnded(LaneError):
    """A stop reached a run that had already ended; `observation` is how it ended."""

    def __init__(self, observation: Observation) -> None:
        super().__init__("the run had already ended")
        self.observation = observation


@dataclass(frozen=True)
class LaneProbe:
    """Whether a lane can take a run right now.

    `reason`: a few words to say out loud ("hermes-api is not running"); `detail`: the full sentence
    with what to set or start to enable the lane.
    """

    lane: str
    available: bool
    reason: str = ""
    detail: str = ""
    can_steer: bool = False


@dataclass(frozen=True)
class LaneSnapshot:
    """One status report: what it proves about the run, and the notes the agent has not read yet."""

    observation: Observation | None
    pending_notes: str = ""
    terminal: bool = False


class Lane(Protocol):
    name: str

    async def probe(self) -> LaneProbe: ...

    async def start(self, ticket: RunTicket) -> str:
        """Ask the lane to start the recorded run; returns its external id. May be slow."""

    async def follow(self, ticket: RunTicket, emit: Emit) -> None:
        """Report what happens to an accepted run until it finishes (the last emit is `Finished`)."""

    async def snapshot(self, ticket: RunTicket) -> LaneSnapshot | None:
        """Ask the lane for the run's status now; None when the lane has no way to be asked."""

    async def steer(self, ticket: RunTicket, text: str) -> None: ...

    async def answer(self, ticket: RunTicket, request_id: str | None, choice: str) -> None: ...

    async def stop(self, ticket: RunTicket) -> str:
        """Ask the run to stop; returns what the lane said (e.g. "stopping")."""

    async def reconcile(self, ticket: RunTicket) -> list[Observation]:
        """After a restart: what the run is now (a run this lane cannot ask about comes back `lost`)."""

    def can_steer(self) -> bool: ...

    async def aclose(self) -> None: ...
