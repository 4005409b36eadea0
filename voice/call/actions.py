"""What the call core asks its shell to do, and the playback facts the shell passes in.

Plain values: the core returns lists of these; `voice.call.engine.CallEngine` carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice.call.attribution import Attribution
from voice.call.turn_record import TurnRecord


@dataclass(frozen=True)
class PlaybackPosition:
    """A snapshot of the speaker, taken by the shell when it calls the core.

    `item_id` is the assistant item whose audio was handed to the output last, and `played_ms` how
    much of it; barge-in truncates there, because that is what the people in the call heard.
    """

    playing: bool = False
    item_id: str | None = None
    played_ms: int = 0


SILENT = PlaybackPosition()


@dataclass(frozen=True)
class Send:
    event: dict


@dataclass(frozen=True)
class PlayAudio:
    item_id: str
    pcm: bytes


@dataclass(frozen=True)
class FinishItem:
    item_id: str


@dataclass(frozen=True)
class StopPlayback:
    pass


@dataclass(frozen=True)
class RunTool:
    """Run a tool; `origin` says which response and turn asked, and who spoke that turn."""

    call_id: str
    name: str
    arguments: str
    origin: Attribution


@dataclass(frozen=True)
class ShowTranscript:
    role: str  # "user" | "assistant"
    text: str


@dataclass(frozen=True)
class AnnouncementResult:
    announcement_id: int
    delivered: bool


@dataclass(frozen=True)
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass(frozen=True)
class RecordTurn:
    """A finished turn's latency record, for the shell to keep and (optionally) write."""

    record: TurnRecord


Action = (Send | PlayAudio | FinishItem | StopPlayback | RunTool | ShowTranscript | AnnouncementResult
          | Notice | RecordTurn)
