"""xAI Grok voice: GA event names, but a flat, beta-like session object."""

from __future__ import annotations

from typing import Any

from voice.call.providers.base import SessionConfig
from voice.call.providers.openai_ga import OpenAIRealtime

DEFAULT_URL = "wss://api.x.ai/v1/realtime"
VOICES = ("Ara", "Eve", "Rex", "Sal", "Leo")


class XAIRealtime(OpenAIRealtime):
    name = "xai"

    voices = VOICES
    default_url = DEFAULT_URL
    key_hint = "set XAI_API_KEY"

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
