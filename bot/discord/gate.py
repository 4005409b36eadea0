"""The operator gate: who may run tools that change things, in a Discord call — and who may hear the
owner's phone calls there.

A mutating tool runs only when the turn behind the call was spoken by exactly one person and that
person's immutable Discord user id is in SWITCHBOARD_OPERATOR_USER_IDS. The speakers come from the
call core's attribution (the audio actually committed for that turn, inherited by follow-ups) —
never from a display name, a transcript, an SSRC alone or a model-supplied argument. An empty
operator set (unset, blank or malformed setting) authorises nobody.

`PhoneDataGate` applies `/transcripts`' rule to a call's phone tools (the archived transcripts, the
facts learned from phone calls, the review and callbacks): the same operator alone, and only in a home
server (SWITCHBOARD_GUILD_IDS; any server when it is unset, never a direct message).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from voice.call.tools import Tool, ToolCall, ToolRefused

log = logging.getLogger(__name__)

NOT_AN_OPERATOR = "only an operator can {action}; ask one of them to say it"
SEVERAL_SPEAKERS = ("several people spoke in that turn, so I can't tell it was an operator alone; an operator "
                    "should ask again on their own")


def in_home_guild(guild_id: int | None, home: frozenset[int] | set[int]) -> bool:
    """A server Switchboard serves: one of `home` (SWITCHBOARD_GUILD_IDS), any server when it is empty;
    never a direct message (None)."""
    return guild_id is not None and (not home or guild_id in home)


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


class PhoneDataGate:
    """The `ToolAuthorizer` the phone tools (`bot.tools.phone`) ask before they read or change the owner's
    phone calls in a Discord call: an operator speaking alone (`OperatorGate`), in a home server."""

    def __init__(self, gate: OperatorGate, home_guilds: frozenset[int] | set[int]) -> None:
        self.gate = gate
        self.home_guilds = frozenset(home_guilds)

    async def authorize(self, tool: Tool, call: ToolCall) -> None:
        if not in_home_guild(call.call.guild_id, self.home_guilds):
            raise ToolRefused("the phone calls are the owner's, and this is not the server they belong to")
        await self.gate.authorize(tool, call)


def _action(tool: Tool) -> str:
    return {"delegate_task": "start work", "stop_work": "stop work", "steer_agent": "steer work",
            "resolve_approval": "answer a run's question", "transcript_search": "read the phone calls",
            "transcript_review_config": "change what runs after phone calls"}.get(tool.name, f"use {tool.name}")
