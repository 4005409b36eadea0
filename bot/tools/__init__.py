"""The tools a voice call offers its model, in one list: the six run tools over the runs service
(`bot.tools.runs`) and the phone-call tools over the archive (`bot.tools.phone`: search, memory, the
review and callbacks).

`switchboard talk` and a Discord call build their catalogue from `call_tools`; only the authorisers
differ: the catalogue's (the terminal's one person, or the Discord operator gate) and `owner`, who may
read the phone calls (the terminal's one person, or `bot.discord.gate.PhoneDataGate`).
"""

from __future__ import annotations

from collections.abc import Callable

from bot.tools.phone import transcript_tools
from bot.tools.runs import run_tools, speaker_of
from listener.archive import Archive
from runs import RunService
from voice.call.tools import Tool, ToolAuthorizer, ToolCall


def call_tools(runs: RunService, *, owner: ToolAuthorizer,
               requester_of: Callable[[ToolCall], int | None] = speaker_of) -> list[Tool]:
    """`owner` decides who may read or change the phone calls (`bot.tools.phone`); `requester_of` names
    who a run started by voice belongs to (a Discord call: the turn's speaker)."""
    return [*run_tools(runs, requester_of=requester_of), *transcript_tools(Archive(runs.store), owner)]
