"""Tools every call has."""

from __future__ import annotations

from collections.abc import Callable

from voice.call.tools import Tool, ToolCall


def talk_status_tool(status: Callable[[], dict]) -> Tool:
    """Switchboard's own state: version, provider, model, voice, endpointing, audio, identity sizes."""

    def handler(call: ToolCall) -> dict:
        return status()

    return Tool(
        name="talk_status",
        description=("Report Switchboard's own status: version, voice provider, model, voice, turn "
                     "endpointing, audio state, identity sections and their sizes, recent latency. "
                     "Use it when asked for a status report or whether things are working."),
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler=handler,
        mutating=False,
        timeout_s=5.0,
    )
