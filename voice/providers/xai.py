"""xAI Grok voice: GA event names, but a flat, beta-like session object."""

from __future__ import annotations

from typing import Any

from .base import ProviderConfigError, SessionConfig
from .openai_ga import OpenAIRealtime, parse_ga_event

DEFAULT_URL = "wss://api.x.ai/v1/realtime"
VOICES = ("Ara", "Eve", "Rex", "Sal", "Leo")


class XAIRealtime(OpenAIRealtime):
    name = "xai"

    def __init__(self, api_key: str, model: str, voice: str, url: str | None = None) -> None:
        if not api_key:
            raise ProviderConfigError("no xAI API key: set XAI_API_KEY")
        if voice not in VOICES:
            raise ProviderConfigError(f"unknown xAI voice {voice!r}; choose one of {', '.join(VOICES)}")
        self._key = api_key
        self.model = model
        self.voice = voice
        self._url = url or DEFAULT_URL

    def __repr__(self) -> str:
        return f"XAIRealtime(model={self.model!r}, voice={self.voice!r}, url={self._url!r})"

    def session_update(self, config: SessionConfig) -> dict:
        fmt = {"type": "audio/pcm", "rate": 24_000}
        turn: dict[str, Any] | None = None
        if config.turn_detection is not None:
            turn = {"type": "server_vad", "silence_duration_ms": config.silence_ms}
        session = {
            "instructions": config.instructions,
            "voice": config.voice,
            "turn_detection": turn,
            "audio": {"input": {"format": fmt}, "output": {"format": fmt}},
            "tools": [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in config.tools
            ],
        }
        return {"type": "session.update", "session": session}

    def parse(self, event: dict):
        return parse_ga_event(event)
