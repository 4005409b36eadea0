"""What the runs service answers: one typed result per action, and the JSON each one becomes.

A refusal is `Refused` (nothing was done; its reason says what to do instead), returned beside the
action's own result (`Delegated | Refused`); an unknown run number is the `UnknownRun` exception.
`as_tool_output()` is the object a voice tool hands the model: its shape is stable, the model's tool
descriptions and the tool tests rely on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runs import wording
from runs.core import RunState, RunTicket, SteerReceipt


@dataclass(frozen=True)
class Refused:
    """Nothing was done. `reason` is one speakable sentence saying why and what to do instead;
    `can_stop`: the run cannot take what was asked, but it can be stopped."""

    reason: str
    can_stop: bool = False

    def as_tool_output(self) -> dict[str, Any]:
        return {"error": self.reason, "can_stop": True} if self.can_stop else {"error": self.reason}


@dataclass(frozen=True)
class Delegated:
    """A run is recorded on `lane` and starts in the background. `skipped` says, per lane tried
    first, why it was unavailable and how to enable it. `already`: the idempotency key named a run
    recorded earlier, which is this answer's run; nothing new was started."""

    run: int
    lane: str
    state: RunState
    summary: str
    skipped: tuple[str, ...] = ()
    already: bool = False

    def as_tool_output(self) -> dict[str, Any]:
        output: dict[str, Any] = {"run": self.run, "lane": self.lane, "state": self.state.value,
                                  "summary": self.summary}
        if self.skipped:
            output["skipped"] = list(self.skipped)
        return output


@dataclass(frozen=True)
class Answered:
    """A run's permission question was answered with `choice` (once, session or deny)."""

    run: int
    choice: str
    summary: str

    def as_tool_output(self) -> dict[str, Any]:
        return {"run": self.run, "choice": self.choice, "summary": self.summary}


@dataclass(frozen=True)
class NoteQueued:
    """The lane accepted a note for a run; `receipt` (queued) records it until it is shown read."""

    receipt: SteerReceipt
    summary: str

    @property
    def run(self) -> int:
        return self.receipt.run_id

    def as_tool_output(self) -> dict[str, Any]:
        return {"run": self.run, "note": wording.receipt_view(self.receipt)["note"],
                "state": self.receipt.state.value, "summary": self.summary}


class StopOutcome(StrEnum):
    ALREADY_ENDED = "already_ended"  # the run had finished: nothing to stop
    ON_ACCEPT = "on_accept"  # the stop is recorded and carried out when the lane accepts the run
    STOPPING = "stopping"  # the lane was told to stop it


@dataclass(frozen=True)
class Stopped:
    """What a stop did (`outcome`). `state` is the run's recorded state when it was asked;
    `superseded` counts the queued notes the run will now never read."""

    run: int
    outcome: StopOutcome
    state: RunState
    summary: str
    superseded: int = 0

    def as_tool_output(self) -> dict[str, Any]:
        state = "stopping" if self.outcome is StopOutcome.STOPPING else self.state.value
        output: dict[str, Any] = {"run": self.run, "state": state, "summary": self.summary}
        if self.superseded:
            output["notes"] = f"{self.superseded} queued note(s) superseded: the run was stopped before reading them"
        return output


@dataclass(frozen=True)
class RunStatus:
    """One run as read at `at` (wall time; elapsed times count to there). `receipts` are its notes;
    `output_chars` bounds how much finished output its answer carries (0: none)."""

    ticket: RunTicket
    at: float
    can_steer: bool = False
    receipts: tuple[SteerReceipt, ...] = ()
    output_chars: int = 0

    @property
    def summary(self) -> str:
        return wording.run_sentence(self.ticket, self.at)

    def view(self) -> dict[str, Any]:
        """The run as a tool answers it, without the summary sentence."""
        return wording.run_view(self.ticket, self.at, list(self.receipts), output_chars=self.output_chars,
                                can_steer=self.can_steer)

    def as_tool_output(self) -> dict[str, Any]:
        return {**self.view(), "summary": self.summary}


@dataclass(frozen=True)
class RunsOverview:
    """What is going and what finished most recently, newest first."""

    active: tuple[RunStatus, ...]
    finished: tuple[RunStatus, ...]

    @property
    def summary(self) -> str:
        if not self.active and not self.finished:
            return "no background runs yet"
        parts = [r.summary for r in self.active] or ["nothing is running"]
        if self.finished:
            parts.append("recently: " + "; ".join(r.summary for r in self.finished))
        return "; ".join(parts)

    def as_tool_output(self) -> dict[str, Any]:
        return {"runs": [r.view() for r in (*self.active, *self.finished)], "summary": self.summary}


@dataclass(frozen=True)
class RunningAgents:
    """The runs that are going, each steerable or stop only (`RunStatus.can_steer`)."""

    runs: tuple[RunStatus, ...]

    @property
    def summary(self) -> str:
        if not self.runs:
            return "no background agents are running"
        return "; ".join(f"run {r.ticket.id} on {r.ticket.lane} ({wording.control_words(r.can_steer)})"
                         for r in self.runs)

    def as_tool_output(self) -> dict[str, Any]:
        agents = [{"run": r.ticket.id, "lane": r.ticket.lane, "state": r.ticket.state.value,
                   "task": wording.bounded(r.ticket.task, 100), "elapsed": wording.elapsed_words(r.ticket.elapsed(r.at)),
                   "control": wording.control_words(r.can_steer)} for r in self.runs]
        return {"agents": agents, "summary": self.summary}


RunResult = Refused | Delegated | Answered | NoteQueued | Stopped | RunStatus | RunsOverview | RunningAgents
