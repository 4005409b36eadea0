"""Provider-neutral events: what any Realtime provider's server events translate into.

The call core only ever sees these, so OpenAI GA, xAI (and later Gemini) differ only in their
translation modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voice.call.usage import CallUsage


@dataclass(frozen=True)
class SessionReady:
    """The provider accepted (or acknowledged) the session configuration."""


@dataclass(frozen=True)
class SpeechStarted:
    """Provider VAD heard the user start speaking (server endpointing)."""

    item_id: str | None = None


@dataclass(frozen=True)
class SpeechStopped:
    item_id: str | None = None


@dataclass(frozen=True)
class InputCommitted:
    item_id: str | None = None


@dataclass(frozen=True)
class UserTranscript:
    item_id: str | None
    text: str


@dataclass(frozen=True)
class UserTranscriptFailed:
    """The provider could not transcribe a committed user item."""

    item_id: str | None


@dataclass(frozen=True)
class ResponseCreated:
    response_id: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AudioDelta:
    response_id: str
    item_id: str
    pcm: bytes  # 24 kHz mono s16le


@dataclass(frozen=True)
class AudioDone:
    response_id: str
    item_id: str


@dataclass(frozen=True)
class AssistantTranscript:
    response_id: str
    item_id: str
    text: str
    final: bool = False


@dataclass(frozen=True)
class FunctionCall:
    response_id: str
    item_id: str
    call_id: str
    name: str
    arguments: str  # JSON text exactly as the model produced it


@dataclass(frozen=True)
class ResponseDone:
    response_id: str
    status: str  # completed | cancelled | failed | incomplete
    metadata: dict[str, str] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True)
class UsageReported:
    """What one response or one input transcription used, as the provider reported it."""

    usage: CallUsage


@dataclass(frozen=True)
class ItemTruncated:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class ProviderError:
    code: str
    message: str
    event_id: str | None = None  # the client event that caused it, when the provider says

    @property
    def harmless(self) -> bool:
        return self.code in HARMLESS_ERRORS


@dataclass(frozen=True)
class Unhandled:
    """An event type we do not act on (logged at debug level, never an error)."""

    type: str


HARMLESS_ERRORS = frozenset({"response_cancel_not_active"})

ProviderEvent = (
    SessionReady | SpeechStarted | SpeechStopped | InputCommitted | UserTranscript | UserTranscriptFailed
    | ResponseCreated
    | AudioDelta | AudioDone | AssistantTranscript | FunctionCall | ResponseDone | UsageReported | ItemTruncated
    | ProviderError | Unhandled
)
