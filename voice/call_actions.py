"""What the call core asks its shell to do, and what it may read from the speaker.

Plain values: the core returns lists of these; `voice.engine.CallEngine` carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
    call_id: str
    name: str
    arguments: str
    metadata: dict[str, str]


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


Action = Send | PlayAudio | FinishItem | StopPlayback | RunTool | ShowTranscript | AnnouncementResult | Notice


class PlaybackView(Protocol):
    def played_ms(self, item_id: str) -> int: ...
    def is_playing(self) -> bool: ...
