"""What the call core asks its shell to do, and the playback facts the shell passes in.

Plain values: the core returns lists of these; `voice.call.engine.CallEngine` carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice.call.attribution import Attribution
from voice.call.turn_record import TurnRecord
from voice.call.usage import CallUsage


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
class OpenNextSession:
    """Open the next provider session in the background (a proactive rollover); report back with
    `CallCore.on_next_session_open`, then `on_next_session_ready` once its `SendNext`s are sent."""


@dataclass(frozen=True)
class SendNext:
    """Send on the session being prepared (not the current one): its configuration and the recent turns."""

    event: dict


@dataclass(frozen=True)
class SwapSession:
    """The prepared session becomes the current one, now: later `Send`s go to it; close the old one."""


@dataclass(frozen=True)
class PlayAudio:
    item_id: str
    pcm: bytes


@dataclass(frozen=True)
class FinishItem:
    item_id: str


@dataclass(frozen=True)
class StopPlayback:
    """Barge-in: stop at once and drop everything not yet played."""


@dataclass(frozen=True)
class PausePlayback:
    """Someone started talking over the assistant: hold playback where it is (nothing is dropped)."""


@dataclass(frozen=True)
class ResumePlayback:
    """It was a cough or an "uh-huh" (or not addressed to the assistant): play on from where it paused."""


@dataclass(frozen=True)
class RunTool:
    """Run a tool; `origin` says which response and turn asked, and who spoke that turn."""

    call_id: str
    name: str
    arguments: str
    origin: Attribution


@dataclass(frozen=True)
class ShowTranscript:
    """A line of the conversation: a user turn's transcription (with who spoke it) or the assistant's words."""

    role: str  # "user" | "assistant"
    text: str
    speaker: int | None = None  # the user turn's one speaker (immutable id); None for the assistant
    name: str | None = None  # that speaker's display name: untrusted, for showing only


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


@dataclass(frozen=True)
class RecordUsage:
    """The provider reported a response's or a transcription's usage: `total` is the call's new total,
    for the shell to keep (a Discord call writes it to its row at once)."""

    total: CallUsage


Action = (Send | PlayAudio | FinishItem | StopPlayback | PausePlayback | ResumePlayback | RunTool | ShowTranscript | AnnouncementResult
          | Notice | RecordTurn | RecordUsage | OpenNextSession | SendNext | SwapSession)
