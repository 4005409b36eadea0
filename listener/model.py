"""One model for a phone call's transcript, whatever format it arrived in.

Everything here is external, untrusted data: it informs, it never authorises. Which speaker is
"the user" (the person Switchboard works for) is decided by the local direction mapping
(`user_label`), never by anything in the payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)  # slots: a long call holds tens of thousands of these
class Turn:
    """One turn: its 0-based position, the speaker's label (`TO`, `FROM` as written; a JSON speaker
    given as a participant id is that participant's label), its text (lines joined with "\\n",
    stripped), times in seconds when given, and the source's own turn id when it has one."""

    index: int
    speaker: str
    text: str
    start_s: float | None = None
    end_s: float | None = None
    source_turn_id: str | None = None


@dataclass(frozen=True)
class Transcript:
    conversation_id: str
    turns: tuple[Turn, ...]
    source: str = ""
    direction: str | None = None  # "inbound" | "outbound" when known
    from_number: str | None = None
    to_number: str | None = None
    participants: dict[str, str] = field(default_factory=dict)  # id -> label, JSON transcripts only
    # Optional fields the parser could not read and dropped (one line each, where and why); the
    # call itself is kept. Not stored: the archive keeps the raw transcript.
    dropped: tuple[str, ...] = field(default=(), compare=False)

    def user_turns(self, user_label: str) -> tuple[Turn, ...]:
        return tuple(t for t in self.turns if t.speaker == user_label)


def user_label_for(direction: str | None, *, inbound: str = "TO", outbound: str = "FROM") -> str | None:
    """The label of the user's own speaker: on an inbound call the user was called (TO), on an
    outbound call the user called (FROM). None when the direction is unknown: nobody is the user."""
    return {"inbound": inbound, "outbound": outbound}.get((direction or "").lower())


@dataclass(frozen=True)
class Fact:
    """A durable fact the user stated (or confirmed): its text, the verbatim quote, and the turns it came from."""

    text: str
    quote: str
    assertion_turn: int  # 0-based turn index
    speaker: str
    confirmation_turn: int | None = None
