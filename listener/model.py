"""One model for a call's transcript, whatever format it arrived in: a phone call's, or a Discord
voice call's turns brought into it by the app (`bot.discord.debrief`).

Everything here is external, untrusted data: it informs, it never authorises. Which speaker is
"the user" (the person Switchboard works for) is decided by the local direction mapping
(`user_label`), never by anything in the payload; in a Discord call, the operators are decided by
their immutable ids (the speaker labels), never by a display name.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)  # slots: a long call holds tens of thousands of these
class Turn:
    """One turn: its 0-based position, the speaker's label (`TO`, `FROM` as written; a JSON speaker
    given as a participant id is that participant's label; in a Discord call, the speaker's immutable
    id), its text (lines joined with "\\n", stripped), times in seconds when given, the source's own
    turn id when it has one, and the display name the speaker was shown with when the source has one
    (a Discord call's: untrusted data, it never decides who spoke)."""

    index: int
    speaker: str
    text: str
    start_s: float | None = None
    end_s: float | None = None
    source_turn_id: str | None = None
    name: str | None = None


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
    """A durable fact a trusted speaker stated (or confirmed): its text, the verbatim quote, the turns it
    came from and who spoke them (speaker labels), and the confirming turn's verbatim quote."""

    text: str
    quote: str
    assertion_turn: int  # 0-based turn index
    speaker: str
    confirmation_turn: int | None = None
    confirmed_by: str | None = None  # the confirming turn's speaker label
    confirmation_quote: str | None = None
