"""The recent conversation a new session is given: turns as text, each user turn with its speaker.

Pure values. `CallCore` keeps the last turns of a call as `HistoryTurn`s and hands them to every
new session (after a dropped socket, at a rollover, or at the start of a resumed call) as
conversation items: a user turn whose speaker is known is introduced by the same system
speaker-context item the live path places before a committed turn, so the model still knows who
said what; display names stay quoted as untrusted data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from voice.call.attribution import speaker_context_text
from voice.call.providers.base import RealtimeProvider

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class HistoryTurn:
    """One line of the conversation. `speaker_id` is the user turn's one speaker (an immutable id,
    None when unknown, always None for the assistant); `name` their display name: untrusted."""

    role: str  # "user" | "assistant"
    text: str
    speaker_id: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a history turn's role is user or assistant, not {self.role!r}")


def restore_events(provider: RealtimeProvider, turns: Iterable[HistoryTurn]) -> list[dict]:
    """The client events that put `turns` into a fresh session, in order."""
    events: list[dict] = []
    for turn in turns:
        if turn.role == "user" and turn.speaker_id is not None:
            names = {turn.speaker_id: turn.name} if turn.name else {}
            note = speaker_context_text(frozenset({turn.speaker_id}), names, always=True)
            if note is not None:
                events.append(provider.add_text_item("system", note))
        events.append(provider.add_text_item(turn.role, turn.text))
    return events
