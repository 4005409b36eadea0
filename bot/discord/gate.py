"""The operator gate: who may run tools that change things, in a Discord call.

A mutating tool runs only when the turn behind the call was spoken by exactly one person and that
person's immutable Discord user id is in SWITCHBOARD_OPERATOR_USER_IDS. The speakers come from the
call core's attribution (the audio actually committed for that turn, inherited by follow-ups) —
never from a display name, a transcript, an SSRC alone or a model-supplied argument. An empty
operator set (unset, blank or malformed setting) authorises nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from voice.call.tools import Tool, ToolCall, ToolRefused

log = logging.getLogger(__name__)

NOT_AN_OPERATOR = "only an operator can {action}; ask one of them to say it"
SEVERAL_SPEAKERS = ("several people spoke in that turn, so I can't tell it was an operator alone; an operator "
                    "should ask again on their own")


class OperatorGate:
    """The `ToolAuthorizer` of a Discord call, and the check slash commands use."""

    def __init__(self, operators: Iterable[int]) -> None:
        self.operators = frozenset(int(o) for o in operators)

    def is_operator(self, user_id: int | None) -> bool:
        return user_id is not None and user_id in self.operators

    async def authorize(self, tool: Tool, call: ToolCall) -> None:
        speakers = call.speakers
        if not self.operators:
            raise ToolRefused(f"{NOT_AN_OPERATOR.format(action=_action(tool))}, and none is configured "
                              "(SWITCHBOARD_OPERATOR_USER_IDS)")
        if not speakers:  # the catalogue never asks for unknown origins; refuse anyway
            raise ToolRefused(f"I can't tell who asked for {tool.name}, so it did not run")
        if len(speakers) != 1:
            raise ToolRefused(SEVERAL_SPEAKERS)
        (speaker,) = speakers
        if speaker not in self.operators:
            raise ToolRefused(NOT_AN_OPERATOR.format(action=_action(tool)))


def _action(tool: Tool) -> str:
    return {"delegate_task": "start work", "stop_work": "stop work", "steer_agent": "steer work",
            "resolve_approval": "answer a run's question"}.get(tool.name, f"use {tool.name}")
