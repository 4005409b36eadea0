"""The small neutral interface every Realtime provider implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from voice.call.events import ProviderEvent


class ProviderConfigError(ValueError):
    """The provider cannot start with this configuration; the message says what to change."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class SessionConfig:
    """What the engine asks of a session. `turn_detection` None = the engine commits turns."""

    instructions: str
    voice: str
    tools: tuple[ToolSpec, ...] = ()
    turn_detection: str | None = "server_vad"  # server_vad | semantic_vad | None
    silence_ms: int = 500
    transcribe_input: bool = True


@dataclass(frozen=True)
class ResponseRequest:
    """One `response.create`. `tools_off` speaks without tools (announcements)."""

    metadata: dict[str, str] = field(default_factory=dict)
    instructions: str | None = None
    tools_off: bool = False


class RealtimeProvider(Protocol):
    name: str
    model: str
    input_rate: int
    output_rate: int

    def url(self) -> str: ...
    def headers(self) -> dict[str, str]: ...
    def session_update(self, config: SessionConfig) -> dict: ...
    def append_audio(self, pcm: bytes) -> dict: ...
    def commit_audio(self) -> dict: ...
    def clear_audio(self) -> dict: ...
    def create_response(self, request: ResponseRequest) -> dict: ...
    def cancel_response(self, response_id: str | None = None) -> dict: ...
    def truncate(self, item_id: str, audio_end_ms: int) -> dict: ...
    def add_text_item(self, role: str, text: str) -> dict: ...
    def add_function_call(self, call_id: str, name: str, arguments: str) -> dict: ...
    def function_output(self, call_id: str, output: str) -> dict: ...
    def parse(self, event: dict) -> list[ProviderEvent]: ...
