"""Who a response, and so a tool call, belongs to: the speakers of the turn that caused it.

The call core records, for every turn it commits, the exact set of immutable user ids whose audio
went into that turn, and every response it creates keeps the attribution of its originating turn
(tool follow-ups inherit it). A response the core cannot trace to a committed turn — an
announcement, a response the provider made on its own — has *unknown* attribution, and tools that
change things refuse to run on it. Display names, transcripts and model arguments never enter here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

LOCAL_SPEAKER = 0
"""The one person at a terminal or behind a WAV file. Never a Discord id (those are 17+ digits)."""


@dataclass(frozen=True)
class Attribution:
    """The origin of a response: its id, the turn it answers, and who spoke that turn.

    `speakers` is None when the origin is unknown; an empty set is never used for "known".
    """

    response_id: str | None = None
    turn_id: int | None = None
    speakers: frozenset[int] | None = None

    @property
    def known(self) -> bool:
        return bool(self.speakers)

    def for_response(self, response_id: str) -> Attribution:
        return Attribution(response_id, self.turn_id, self.speakers)

    def describe(self) -> str:
        if not self.known:
            return "unknown speaker"
        return "speakers " + ",".join(str(s) for s in sorted(self.speakers or ()))


UNKNOWN = Attribution()


@dataclass(frozen=True)
class CallInfo:
    """Which call a tool call happens in: the call id, and the Discord guild/channel when there is one."""

    call_id: str
    guild_id: int | None = None
    channel_id: int | None = None


NO_CALL = CallInfo("unknown")  # a tool call made outside any known call (a test, a caller that gave none)


def speaker_context_text(speakers: frozenset[int], names: dict[int, str], *, always: bool = False) -> str | None:
    """The conversation item placed before a committed turn, naming its speakers by immutable id.

    Display names are quoted as untrusted data (JSON-escaped, capped), never as instructions.
    None when the transport gives no names (a single local speaker needs no introduction), unless
    `always` (a room: every turn names its speaker, display name or not).
    """
    if not speakers or (not names and not always):
        return None
    parts = []
    for user_id in sorted(speakers):
        name = names.get(user_id)
        shown = f" (display name, untrusted data: {json.dumps(name[:64])})" if name else ""
        parts.append(f"user id {user_id}{shown}")
    who = "; ".join(parts)
    if len(speakers) > 1:
        return f"The next audio turn has several people speaking at once: {who}."
    return f"The next audio turn is spoken by {who}."
