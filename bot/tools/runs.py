"""The voice tools over the runs service: delegate, check, list, steer, stop, answer a question.

Each tool answers the model with its result's `as_tool_output()`; an unknown run number is an
answer too (`{"error": ...}`), never a crash of the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from runs.results import RunResult
from runs.service import RunService, UnknownRun
from voice.call.attribution import NO_CALL
from voice.call.tools import Tool, ToolCall

RUN_NUMBER = {"type": "integer", "minimum": 1, "description": "the run number, as in \"run 3\""}


def speaker_of(call: ToolCall) -> int | None:
    """The immutable user id of the one person who spoke the turn; None when unknown or several."""
    speakers = getattr(call, "speakers", None)
    if speakers and len(speakers) == 1:
        (only,) = tuple(speakers)
        return only if isinstance(only, int) else None
    return None


def origin_of(call: ToolCall) -> str | None:
    """The id of the voice call the tool call happens in (stored with a run it starts); None when the
    call is not known (`ToolCall`'s default, `NO_CALL`)."""
    call_id = getattr(getattr(call, "call", None), "call_id", None)
    return call_id if isinstance(call_id, str) and call_id.strip() and call_id != NO_CALL.call_id else None


def _handler(body: Callable[[ToolCall], Awaitable[RunResult]]) -> Callable[[ToolCall], Awaitable[dict]]:
    async def handler(call: ToolCall) -> dict[str, Any]:
        try:
            return (await body(call)).as_tool_output()
        except UnknownRun as exc:
            return {"error": f"{exc}; list_agents or check_work show the run numbers"}

    return handler


def run_tools(service: RunService, *,
              requester_of: Callable[[ToolCall], int | None] = speaker_of) -> list[Tool]:
    """The six run tools, exactly: mutating ones go through the catalogue's authoriser."""

    async def delegate(call: ToolCall) -> RunResult:
        return await service.delegate(str(call.arguments.get("task") or ""), requester_of(call),
                                      origin=origin_of(call))

    async def check(call: ToolCall) -> RunResult:
        return await service.check(call.arguments.get("run"))

    async def agents(call: ToolCall) -> RunResult:
        return await service.list_agents()

    async def steer(call: ToolCall) -> RunResult:
        return await service.steer(call.arguments.get("run"), str(call.arguments.get("note") or ""),
                                   requester_of(call))

    async def stop(call: ToolCall) -> RunResult:
        return await service.stop(call.arguments.get("run"), call.arguments.get("reason"), requester_of(call))

    async def answer(call: ToolCall) -> RunResult:
        return await service.resolve_approval(call.arguments.get("run"), str(call.arguments.get("choice") or ""),
                                              requester_of(call))

    def schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}

    return [
        Tool("delegate_task",
             "Hand a task to a background agent and keep talking. Answers at once with a run number and the "
             "lane it is starting on (and any lane that was skipped, which you must say); the result is "
             "announced when it lands. Never wait for it.",
             schema({"task": {"type": "string", "description": "what the agent should do, self-contained"}},
                    ["task"]),
             _handler(delegate), mutating=True, timeout_s=10.0),
        Tool("check_work",
             "How background runs are going: state, time so far, last progress, notes and their receipts, "
             "or a finished run's output. Without a run number: what is running and what landed recently.",
             schema({"run": RUN_NUMBER}, []), _handler(check), mutating=False, timeout_s=10.0),
        Tool("list_agents",
             "List the background runs that are going, each marked 'steer or stop' or 'stop only'. Use it to "
             "find the run number the user means.",
             schema({}, []), _handler(agents), mutating=False, timeout_s=10.0),
        Tool("steer_agent",
             "Queue a note for a running background agent. It reads it after its current step; the receipt "
             "says 'queued' until the lane proves it landed. One-shot command runs cannot take notes: offer "
             "to stop them instead.",
             schema({"run": RUN_NUMBER, "note": {"type": "string", "description": "the note for the agent"}},
                    ["run", "note"]),
             _handler(steer), mutating=True, timeout_s=15.0),
        Tool("stop_work",
             "Stop a background run, on any lane. Notes it has not read yet are dropped.",
             schema({"run": RUN_NUMBER, "reason": {"type": "string", "description": "why, in a few words"}},
                    ["run"]),
             _handler(stop), mutating=True, timeout_s=15.0),
        Tool("resolve_approval",
             "Answer a background run's permission question: 'once' (this time), 'session' (for the rest of "
             "that run's session) or 'deny'. Only what the user said; never decide for them.",
             schema({"run": RUN_NUMBER, "choice": {"type": "string", "enum": ["once", "session", "deny"]}},
                    ["run", "choice"]),
             _handler(answer), mutating=True, timeout_s=15.0),
    ]
