"""What the runs service says — pure: receipts, announcements, questions and status answers."""

from __future__ import annotations

from typing import Any

from runs.core import VOICE_APPROVAL_CHOICES, RunState, RunTicket, SteerReceipt, SteerState

STATE_WORDS = {
    RunState.STARTING: "starting",
    RunState.RUNNING: "running",
    RunState.WAITING_FOR_APPROVAL: "waiting for an answer to its question",
    RunState.COMPLETED: "finished",
    RunState.FAILED: "failed",
    RunState.CANCELLED: "stopped",
    RunState.LOST: "lost",
}

RECEIPT_WORDS = {
    SteerState.QUEUED: "queued: the lane accepted it; nothing shows yet that the agent has read it",
    SteerState.LANDED: "landed: the lane showed it pending and then consumed by the agent",
    SteerState.UNCONFIRMED: "unconfirmed: the run ended without any proof the agent read it",
    SteerState.SUPERSEDED: "superseded: the run was stopped before the agent read it",
}

CHOICE_WORDS = {"once": "approve once", "session": "approve for this session", "deny": "deny"}


def elapsed_words(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} second{'' if s == 1 else 's'}"
    minutes = s // 60
    if minutes < 60:
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    hours, minutes = divmod(minutes, 60)
    text = f"{hours} hour{'' if hours == 1 else 's'}"
    return text + (f" {minutes} minute{'' if minutes == 1 else 's'}" if minutes else "")


def bounded(text: str | None, limit: int) -> str:
    """At most `limit` characters, cut at a word boundary and marked with an ellipsis."""
    text = " ".join((text or "").split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(",;:") + " …"


def voice_choices(offered: tuple[str, ...]) -> tuple[str, ...]:
    """The answers a voice user may give: once/session/deny as far as the lane offered them; never
    "always". Deny is always possible."""
    if not offered:
        return VOICE_APPROVAL_CHOICES
    allowed = tuple(c for c in VOICE_APPROVAL_CHOICES if c in offered)
    return allowed if "deny" in allowed else (*allowed, "deny")


def announcement(ticket: RunTicket, limit: int) -> str:
    """The unprompted sentence spoken when a run lands."""
    head = f"Run {ticket.id} ({bounded(ticket.task, 60)})"
    if ticket.state is RunState.COMPLETED:
        body = bounded(ticket.output, limit)
        return f"{head} finished: {body}" if body else f"{head} finished with no output."
    if ticket.state is RunState.FAILED:
        return f"{head} failed: {bounded(ticket.error, limit) or 'no reason given'}"
    if ticket.state is RunState.CANCELLED:
        if ticket.stop is None and ticket.error:  # nobody here asked: the lane says who stopped it
            return f"{head}: {bounded(ticket.error, limit)}."
        return f"{head} was stopped."
    if ticket.state is RunState.LOST:
        text = f"{head} was lost: {bounded(ticket.error, limit) or 'its result cannot be known'}"
        return text + (f" Last seen: {bounded(ticket.progress, 120)}." if ticket.progress else "")
    raise ValueError(f"run {ticket.id} has not finished")


def ended_before_stop(ticket: RunTicket) -> str:
    """What a stop that came too late answers: how the run ended, with its result."""
    text = f"run {ticket.id} had already {STATE_WORDS[ticket.state]} before the stop reached it"
    if ticket.state is RunState.COMPLETED and ticket.output:
        return f"{text}: {bounded(ticket.output, 300)}"
    return text + (f": {bounded(ticket.error, 300)}" if ticket.error else "")


def approval_question(ticket: RunTicket, timeout_s: float) -> str:
    approval = ticket.approval
    if approval is None:
        raise ValueError(f"run {ticket.id} has no question")
    options = [CHOICE_WORDS[c] for c in voice_choices(approval.choices)]
    spoken = ", ".join(options[:-1]) + f", or {options[-1]}" if len(options) > 1 else options[0]
    return (f"Run {ticket.id} asks for permission: {bounded(approval.description, 200)}. "
            f"You can {spoken}. No answer within {elapsed_words(timeout_s)} means deny.")


def control_words(can_steer: bool) -> str:
    """How an active run can be controlled, as the tools and their summaries say it."""
    return "steer or stop" if can_steer else "stop only"


def receipt_view(receipt: SteerReceipt) -> dict[str, Any]:
    return {"note": bounded(receipt.note, 120), "state": receipt.state.value,
            "meaning": RECEIPT_WORDS[receipt.state]}


def run_view(ticket: RunTicket, now: float, receipts: list[SteerReceipt] = (), *,
             output_chars: int = 0, can_steer: bool = False) -> dict[str, Any]:
    """A run as a tool answers it: small, speakable, and bounded."""
    view: dict[str, Any] = {
        "run": ticket.id,
        "lane": ticket.lane,
        "state": ticket.state.value,
        "task": bounded(ticket.task, 120),
        "elapsed": elapsed_words(ticket.elapsed(now)),
    }
    if ticket.active:
        view["control"] = control_words(can_steer)
    if ticket.progress and ticket.active:
        view["last_progress"] = ticket.progress
    if ticket.approval is not None:
        view["question"] = ticket.approval.description
        view["answers"] = list(voice_choices(ticket.approval.choices))
    if receipts:
        view["notes"] = [receipt_view(r) for r in receipts]
    if ticket.terminal:
        if ticket.error:
            view["error"] = bounded(ticket.error, 300)
        if output_chars and ticket.output:
            view["output"] = bounded(ticket.output, output_chars)
            if len(" ".join(ticket.output.split())) > output_chars or ticket.output_cut:
                view["output_note"] = f"shortened; `switchboard runs show {ticket.id}` has the rest"
        if ticket.announced is False:
            view["heard"] = "not announced in a call yet"
    return view


def run_sentence(ticket: RunTicket, now: float) -> str:
    words = STATE_WORDS[ticket.state]
    if ticket.active:
        text = f"run {ticket.id} is {words} on {ticket.lane}, {elapsed_words(ticket.elapsed(now))} in"
        if ticket.state is RunState.WAITING_FOR_APPROVAL and ticket.approval is not None:
            return text + f"; it asks: {bounded(ticket.approval.description, 120)}"
        return text + (f"; last: {ticket.progress}" if ticket.progress else "")
    text = f"run {ticket.id} {words} after {elapsed_words(ticket.elapsed(now))}"
    return text + (f": {bounded(ticket.error, 160)}" if ticket.error and ticket.state is not RunState.COMPLETED else "")
