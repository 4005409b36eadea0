"""Hermes api_server wire shapes → observations — pure (capabilities, run status, SSE run events)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runs.core import (
    ApprovalAnswered,
    ApprovalRequested,
    Finished,
    Observation,
    Progress,
    Running,
    RunState,
)

CAPABILITIES_OBJECT = "hermes.api_server.capabilities"
ACTIVE_STATUSES = frozenset({"started", "queued", "running", "waiting_for_approval", "stopping"})
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})
# What the real api_server offers when an approval event names no choices (tools/approval.py's default).
DEFAULT_APPROVAL_CHOICES = ("once", "session", "always", "deny")
# A `run.cancelled` nobody asked for: the gateway cancels every run's task when it shuts down. (When
# Switchboard asked, the ticket's stop request says so instead: `core._finish`.)
HERMES_STOPPED = "Hermes stopped the run (it was shutting down); ask again to start it anew"
HERMES_LOST = ("Hermes restarted and lost this run: it keeps run status in memory only, so what the run "
               "did is gone; ask again to start it anew")


class NotHermes(ValueError):
    """The server answered, but not as a Hermes api_server that can run background work."""


@dataclass(frozen=True)
class HermesFeatures:
    """What this api_server says it can do; every optional verb is gated on its flag."""

    events: bool
    stop: bool
    approval: bool
    steer: bool
    model: str | None = None


def parse_capabilities(body: Any) -> HermesFeatures:
    if not isinstance(body, dict) or body.get("object") != CAPABILITIES_OBJECT:
        raise NotHermes("it did not answer /v1/capabilities as a Hermes api_server")
    features = body.get("features")
    if not isinstance(features, dict):
        raise NotHermes("its capabilities list no features")
    missing = [name for name in ("run_submission", "run_status") if not features.get(name)]
    if missing:
        raise NotHermes(f"it does not offer {' and '.join(missing)} (update Hermes Agent)")
    model = body.get("model")
    return HermesFeatures(
        events=bool(features.get("run_events_sse")),
        stop=bool(features.get("run_stop")),
        approval=bool(features.get("run_approval") or features.get("run_approval_response")),
        steer=bool(features.get("run_steer")),
        model=model if isinstance(model, str) else None,
    )


def decode_event(sse_name: str, data: str) -> tuple[str, dict] | None:
    """One SSE message → (event name, payload); the name is in the JSON (`event`) or the SSE field."""
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("event") if isinstance(payload.get("event"), str) else None
    if name is None and sse_name and sse_name != "message":
        name = sse_name
    return (name, payload) if name else None


def _text(value: Any, limit: int = 200) -> str:
    return " ".join(str(value).split())[:limit] if value is not None else ""


def _approval(payload: dict) -> ApprovalRequested:
    choices = payload.get("choices")
    choices = tuple(str(c).lower() for c in choices) if isinstance(choices, list) else DEFAULT_APPROVAL_CHOICES
    request_id = payload.get("request_id")
    description = (_text(payload.get("description")) or _text(payload.get("command"))
                   or "an action that needs permission")
    return ApprovalRequested(request_id if isinstance(request_id, str) and request_id else None,
                             choices, description)


def event_observations(name: str, payload: dict) -> list[Observation]:
    """What one run event means for the ticket (empty: nothing worth recording)."""
    if name == "tool.started":
        tool, preview = _text(payload.get("tool"), 60) or "a tool", _text(payload.get("preview"), 120)
        return [Progress(f"using {tool}: {preview}" if preview else f"using {tool}")]
    if name == "tool.completed":
        tool = _text(payload.get("tool"), 60) or "a tool"
        return [Progress(f"{tool} failed" if payload.get("error") else f"{tool} finished")]
    if name == "subagent.start":
        goal = _text(payload.get("goal"), 120)
        return [Progress(f"started a helper agent: {goal}" if goal else "started a helper agent")]
    if name == "subagent.complete":
        return [Progress("a helper agent finished")]
    if name == "message.delta":
        return [Progress("writing its answer")]
    if name == "approval.request":
        return [_approval(payload)]
    if name == "approval.responded":
        return [ApprovalAnswered(_text(payload.get("choice"), 20) or "answered")]
    if name == "run.completed":
        return [Finished(RunState.COMPLETED, output=_str_or_empty(payload.get("output")))]
    if name == "run.failed":
        return [Finished(RunState.FAILED, error=_text(payload.get("error"), 500) or "the agent run failed")]
    if name == "run.cancelled":
        return [Finished(RunState.CANCELLED, error=HERMES_STOPPED, interrupted=True)]
    return []


def is_terminal_event(name: str) -> bool:
    return name in ("run.completed", "run.failed", "run.cancelled")


def _str_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else json.dumps(value))


def status_observation(status: Any, asked: ApprovalRequested | None = None) -> Observation | None:
    """GET /v1/runs/{id} → what it proves about the run (None: an unknown or malformed status).

    The real status of a run `waiting_for_approval` carries no approval object: `asked` is the question
    its event stream put (choices and all), else the question is Hermes's default one."""
    if not isinstance(status, dict):
        return None
    value = status.get("status")
    if value == "completed":
        return Finished(RunState.COMPLETED, output=_str_or_empty(status.get("output")))
    if value == "failed":
        return Finished(RunState.FAILED, error=_text(status.get("error"), 500) or "the agent run failed")
    if value == "cancelled":
        return Finished(RunState.CANCELLED, error=HERMES_STOPPED, interrupted=True)
    if value == "interrupted":
        detail = _text(status.get("error"), 300) or "its gateway restarted before it settled"
        return Finished(RunState.LOST, error=f"Hermes reports the run was interrupted: {detail}")
    if value == "waiting_for_approval":
        approval = status.get("approval")
        if isinstance(approval, dict):
            return _approval(approval)
        return asked or ApprovalRequested(None, DEFAULT_APPROVAL_CHOICES,
                                          "an action that needs permission (Hermes's status does not say which)")
    if value in ACTIVE_STATUSES:
        return Running()
    return None


def pending_notes(status: Any) -> str:
    """The steer text the agent has not read yet, as the status reports it ("" when none)."""
    if not isinstance(status, dict):
        return ""
    value = status.get("pending_steer")
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return value if isinstance(value, str) else ""


def is_terminal_status(status: Any) -> bool:
    return isinstance(status, dict) and status.get("status") in TERMINAL_STATUSES


def error_message(body: Any, fallback: str) -> str:
    """The `error.message` of an OpenAI-style error body, bounded; never echoes request headers."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _text(error["message"], 300)
        if isinstance(error, str):
            return _text(error, 300)
    return fallback
