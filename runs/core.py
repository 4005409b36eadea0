"""Run state transitions and steering receipts — pure: observations and `now` in, new state out.

Lanes (HTTP, subprocess) turn what they see into `Observation`s; `advance` folds one observation
into a `RunTicket` and says what the shell must do next (`Effect`s). Nothing here reads a clock,
touches the database or talks to a lane, so every rule is a unit test with fixed inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class RunState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


ACTIVE = frozenset({RunState.STARTING, RunState.RUNNING, RunState.WAITING_FOR_APPROVAL})
TERMINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED, RunState.LOST})


class Delivery(StrEnum):
    PENDING = "pending"  # not finished, or finished and not yet claimed by a deliverer
    CLAIMED = "claimed"  # one deliverer is announcing and posting it
    DELIVERED = "delivered"


class InvalidTransition(RuntimeError):
    """A lane reported something impossible for the run's state (a bug in the lane, not the run)."""


VOICE_APPROVAL_CHOICES = ("once", "session", "deny")


@dataclass(frozen=True)
class Approval:
    """A question the running agent is blocked on. `choices` are what the lane offered."""

    request_id: str | None
    choices: tuple[str, ...]
    description: str
    asked_at: float
    deadline: float


@dataclass(frozen=True)
class StopRequest:
    reason: str
    kind: str  # "user" or "timeout"
    at: float
    by: int | None = None


@dataclass(frozen=True)
class RunTicket:
    """One background run as recorded in the store. `id` is the number users say ("run 3");
    `origin` is what started it when that is known (a voice call's id), else None."""

    id: int
    lane: str
    task: str
    state: RunState
    created_at: float
    updated_at: float
    requester_id: int | None = None
    external_id: str | None = None
    owner: str = ""
    idempotency_key: str = ""
    output: str | None = None
    output_cut: bool = False
    error: str | None = None
    progress: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    approval: Approval | None = None
    stop: StopRequest | None = None
    delivery: Delivery = Delivery.PENDING
    announced: bool | None = None
    delivered_at: float | None = None
    origin: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def elapsed(self, now: float) -> float:
        end = self.finished_at if self.finished_at is not None else now
        return max(0.0, end - self.created_at)


# -- observations: what a lane saw ------------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    """The lane took the run and gave it this id (Hermes run id, or the process id)."""

    external_id: str


@dataclass(frozen=True)
class Progress:
    text: str


@dataclass(frozen=True)
class Running:
    """The lane says the run is going and nothing is pending (e.g. a status poll)."""


@dataclass(frozen=True)
class ApprovalRequested:
    request_id: str | None
    choices: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class ApprovalAnswered:
    choice: str


@dataclass(frozen=True)
class Finished:
    """The run ended on its lane. `interrupted`: it was killed/stopped rather than ending by itself."""

    state: RunState
    output: str | None = None
    error: str | None = None
    output_cut: bool = False
    interrupted: bool = False


@dataclass(frozen=True)
class StopRequested:
    reason: str
    kind: str = "user"
    by: int | None = None


Observation = Accepted | Progress | Running | ApprovalRequested | ApprovalAnswered | Finished | StopRequested


# -- effects: what the shell must do ---------------------------------------------------------------

@dataclass(frozen=True)
class AskApproval:
    """Speak the question and arm the timer that denies it at `approval.deadline`."""

    approval: Approval


@dataclass(frozen=True)
class StopOnLane:
    """A stop was requested before the lane accepted the run: stop it now that it has an id."""


@dataclass(frozen=True)
class Settle:
    """The run reached a terminal state: claim it, announce it, post it, mark it delivered."""


Effect = AskApproval | StopOnLane | Settle


@dataclass(frozen=True)
class Step:
    ticket: RunTicket
    effects: tuple[Effect, ...] = ()


def advance(ticket: RunTicket, obs: Observation, now: float, *, approval_timeout_s: float) -> Step:
    """Fold one observation into the ticket. Terminal tickets never change (late events are dropped)."""
    if ticket.terminal:
        return Step(ticket)
    state = ticket.state

    if isinstance(obs, Accepted):
        if state is RunState.STARTING:
            started = replace(ticket, state=RunState.RUNNING, external_id=obs.external_id,
                              started_at=now, updated_at=now)
            return Step(started, (StopOnLane(),) if ticket.stop is not None else ())
        if obs.external_id == ticket.external_id:
            return Step(ticket)
        raise InvalidTransition(f"run {ticket.id} was accepted twice ({ticket.external_id} then "
                                f"{obs.external_id})")

    if isinstance(obs, StopRequested):
        if ticket.stop is not None and not (obs.kind == "timeout" and ticket.stop.kind != "timeout"):
            return Step(ticket)
        stop = StopRequest(obs.reason, obs.kind, now, obs.by)
        return Step(replace(ticket, stop=stop, updated_at=now))

    if isinstance(obs, Finished):
        return Step(_finish(ticket, obs, now), (Settle(),))

    if isinstance(obs, Progress):  # also before the lane accepted it ("queued at Hermes")
        text = obs.text[:300]
        return Step(ticket if text == ticket.progress else replace(ticket, progress=text, updated_at=now))

    if state is RunState.STARTING:
        raise InvalidTransition(f"run {ticket.id} reported {type(obs).__name__} before the lane accepted it")

    if isinstance(obs, Running):
        if state is RunState.WAITING_FOR_APPROVAL:
            return Step(replace(ticket, state=RunState.RUNNING, approval=None, updated_at=now))
        return Step(ticket)

    if isinstance(obs, ApprovalRequested):
        current = ticket.approval
        if current is not None and current.request_id == obs.request_id:
            return Step(ticket)
        approval = Approval(obs.request_id, obs.choices, obs.description[:300], now, now + approval_timeout_s)
        waiting = replace(ticket, state=RunState.WAITING_FOR_APPROVAL, approval=approval, updated_at=now)
        return Step(waiting, (AskApproval(approval),))

    if isinstance(obs, ApprovalAnswered):
        if state is RunState.WAITING_FOR_APPROVAL:
            return Step(replace(ticket, state=RunState.RUNNING, approval=None,
                                progress=f"approval answered: {obs.choice}", updated_at=now))
        return Step(ticket)

    raise TypeError(f"not an observation: {obs!r}")


def _finish(ticket: RunTicket, obs: Finished, now: float) -> RunTicket:
    if obs.state not in TERMINAL:
        raise InvalidTransition(f"run {ticket.id} cannot finish as {obs.state}")
    state, error = obs.state, obs.error
    stop = ticket.stop
    if stop is not None and stop.kind == "timeout" and state in (RunState.CANCELLED, RunState.FAILED):
        state, error = RunState.FAILED, stop.reason
    elif stop is not None and obs.interrupted and state is RunState.FAILED:
        state, error = RunState.CANCELLED, None  # killed because someone asked, not because it broke
    if state is RunState.CANCELLED and stop is not None and stop.reason:
        error = f"stopped: {stop.reason}"  # asked for: whatever the lane guessed about why it ended
    return replace(ticket, state=state, output=obs.output, output_cut=obs.output_cut, error=error,
                   approval=None, finished_at=now, updated_at=now)


# -- steering receipts -----------------------------------------------------------------------------

class SteerState(StrEnum):
    QUEUED = "queued"            # the lane accepted the note: the only claim made at call time
    LANDED = "landed"            # the lane showed the note pending, then showed it consumed
    UNCONFIRMED = "unconfirmed"  # the run ended and no consumption was ever observed
    SUPERSEDED = "superseded"    # the run was stopped while the note was still queued


@dataclass(frozen=True)
class SteerReceipt:
    id: int
    run_id: int
    token: str
    note: str
    state: SteerState
    created_at: float
    updated_at: float
    seen_pending: bool = False

    @property
    def wire_text(self) -> str:
        """What the agent receives: the correlation token lets its pending list be matched exactly."""
        return f"[{self.token}] {self.note}"


def receipt_on_pending(receipt: SteerReceipt, pending: str | None, now: float) -> SteerReceipt:
    """Fold the lane's list of unread notes (None/"" = none reported) into a queued receipt.

    Landing needs two sightings: the note listed as pending, then a later report without it.
    A report that never listed it proves nothing (the lane may not report pending notes at all).
    """
    if receipt.state is not SteerState.QUEUED:
        return receipt
    if pending and receipt.token in pending:
        return receipt if receipt.seen_pending else replace(receipt, seen_pending=True, updated_at=now)
    if receipt.seen_pending:
        return replace(receipt, state=SteerState.LANDED, updated_at=now)
    return receipt


def receipt_on_stop(receipt: SteerReceipt, now: float) -> SteerReceipt:
    if receipt.state is SteerState.QUEUED:
        return replace(receipt, state=SteerState.SUPERSEDED, updated_at=now)
    return receipt


def receipt_on_finish(receipt: SteerReceipt, final: RunState, pending: str | None,
                      now: float) -> SteerReceipt:
    """Settle a receipt when its run ends.

    Only a completed run's final report can prove a landing (it lists the notes left unread); a
    stopped, failed or lost run drops its notes, so a note missing from that report proves nothing.
    """
    if final is RunState.COMPLETED:
        receipt = receipt_on_pending(receipt, pending, now)
    if receipt.state is not SteerState.QUEUED:
        return receipt
    end = SteerState.SUPERSEDED if final is RunState.CANCELLED else SteerState.UNCONFIRMED
    return replace(receipt, state=end, updated_at=now)
