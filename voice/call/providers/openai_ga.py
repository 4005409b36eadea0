"""OpenAI Realtime, GA interface: session shape, client events, and server-event translation."""

from __future__ import annotations

import base64
import json
from typing import Any

from voice.call import events as ev
from voice.call.providers.base import ProviderConfigError, ResponseRequest, SessionConfig
from voice.call.usage import NO_USAGE

DEFAULT_URL = "wss://api.openai.com/v1/realtime"
VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")
RETIRING_MODELS = {"gpt-realtime": "2027-01-20", "gpt-realtime-mini": "2027-01-20"}
TRANSCRIBE_MODEL = "gpt-transcribe"  # gpt-4o-mini-transcribe shuts down 2027-02-26


class OpenAIRealtime:
    """Translation for OpenAI Realtime GA. Holds the key only to put it on the upgrade request."""

    name = "openai"
    input_rate = 24_000
    output_rate = 24_000

    voices: tuple[str, ...] = VOICES
    default_url = DEFAULT_URL
    key_hint = "set SWITCHBOARD_OPENAI_API_KEY or OPENAI_API_KEY"

    def __init__(self, api_key: str, model: str, voice: str, url: str | None = None) -> None:
        if not api_key:
            raise ProviderConfigError(f"no {self.name} API key: {self.key_hint}")
        if model in RETIRING_MODELS:
            raise ProviderConfigError(
                f"model {model!r} shuts down on {RETIRING_MODELS[model]}; use gpt-realtime-2.1-mini or gpt-realtime-2.1")
        if voice not in self.voices and not (self.name == "openai" and voice.startswith("voice_")):
            raise ProviderConfigError(f"unknown {self.name} voice {voice!r}; choose one of {', '.join(self.voices)}")
        self._key = api_key
        self.model = model
        self.voice = voice
        self._url = url or self.default_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, voice={self.voice!r}, url={self._url!r})"

    def url(self) -> str:
        sep = "&" if "?" in self._url else "?"
        return f"{self._url}{sep}model={self.model}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}  # GA: never an OpenAI-Beta header

    # -- client events ----------------------------------------------------------------------

    def session_update(self, config: SessionConfig) -> dict:
        audio_in: dict[str, Any] = {
            "format": {"type": "audio/pcm", "rate": 24_000},
            "turn_detection": _turn_detection(config),
        }
        if config.transcribe_input:
            audio_in["transcription"] = {"model": TRANSCRIBE_MODEL}
        session: dict[str, Any] = {
            "type": "realtime",
            "instructions": config.instructions,
            "output_modalities": ["audio"],
            "audio": {
                "input": audio_in,
                "output": {"format": {"type": "audio/pcm", "rate": 24_000}, "voice": config.voice},
            },
            "tools": [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in config.tools
            ],
            "tool_choice": "auto",
        }
        return {"type": "session.update", "session": session}

    def append_audio(self, pcm: bytes) -> dict:
        return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode("ascii")}

    def commit_audio(self) -> dict:
        return {"type": "input_audio_buffer.commit"}

    def clear_audio(self) -> dict:
        return {"type": "input_audio_buffer.clear"}

    def create_response(self, request: ResponseRequest) -> dict:
        response: dict[str, Any] = {}
        if request.metadata:
            response["metadata"] = dict(request.metadata)
        if request.instructions:
            response["instructions"] = request.instructions
        if request.tools_off:
            response["tool_choice"] = "none"
        event: dict[str, Any] = {"type": "response.create"}
        if response:
            event["response"] = response
        return event

    def cancel_response(self, response_id: str | None = None) -> dict:
        event: dict[str, Any] = {"type": "response.cancel"}
        if response_id:
            event["response_id"] = response_id
        return event

    def truncate(self, item_id: str, audio_end_ms: int) -> dict:
        return {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                "audio_end_ms": max(0, int(audio_end_ms))}

    def add_text_item(self, role: str, text: str) -> dict:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "conversation.item.create",
                "item": {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}}

    def add_function_call(self, call_id: str, name: str, arguments: str) -> dict:
        return {"type": "conversation.item.create",
                "item": {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}}

    def function_output(self, call_id: str, output: str) -> dict:
        return {"type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": output}}

    # -- server events ----------------------------------------------------------------------

    def parse(self, event: dict) -> list[ev.ProviderEvent]:
        return parse_ga_event(event)


def _turn_detection(config: SessionConfig) -> dict | None:
    if config.turn_detection is None:
        return None
    if config.turn_detection == "semantic_vad":
        return {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
    return {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
            "silence_duration_ms": config.silence_ms, "create_response": True, "interrupt_response": True}


def parse_ga_event(event: dict) -> list[ev.ProviderEvent]:
    """Translate one GA server event (also used by GA-compatible providers)."""
    kind = event.get("type")
    if not isinstance(kind, str):
        return [ev.Unhandled(str(kind))]
    if kind == "response.output_audio.delta":
        return [ev.AudioDelta(event.get("response_id", ""), event.get("item_id", ""),
                              base64.b64decode(event.get("delta", "")))]
    if kind == "response.output_audio_transcript.delta":
        return [ev.AssistantTranscript(event.get("response_id", ""), event.get("item_id", ""),
                                       event.get("delta", ""), final=False)]
    if kind == "response.output_audio_transcript.done":
        return [ev.AssistantTranscript(event.get("response_id", ""), event.get("item_id", ""),
                                       event.get("transcript", ""), final=True)]
    if kind == "response.output_audio.done":
        return [ev.AudioDone(event.get("response_id", ""), event.get("item_id", ""))]
    if kind == "response.created":
        response = event.get("response") or {}
        return [ev.ResponseCreated(response.get("id", ""), _metadata(response))]
    if kind == "response.done":
        response = event.get("response") or {}
        details = response.get("status_details") or {}
        detail = ""
        if isinstance(details, dict):
            error = details.get("error") or {}
            detail = details.get("reason") or (error.get("message") if isinstance(error, dict) else "") or ""
        done = ev.ResponseDone(response.get("id", ""), response.get("status", "completed"),
                               _metadata(response), str(detail))
        usage = response.get("usage")
        return [ev.UsageReported(NO_USAGE.add_response(usage)), done] if isinstance(usage, dict) else [done]
    if kind == "response.function_call_arguments.done":
        return [ev.FunctionCall(event.get("response_id", ""), event.get("item_id", ""),
                                event.get("call_id", ""), event.get("name", ""), event.get("arguments", "{}"))]
    if kind == "input_audio_buffer.speech_started":
        return [ev.SpeechStarted(event.get("item_id"))]
    if kind == "input_audio_buffer.speech_stopped":
        return [ev.SpeechStopped(event.get("item_id"))]
    if kind == "input_audio_buffer.committed":
        return [ev.InputCommitted(event.get("item_id"))]
    if kind == "conversation.item.input_audio_transcription.completed":
        heard = ev.UserTranscript(event.get("item_id"), event.get("transcript", ""))
        usage = event.get("usage")
        return [ev.UsageReported(NO_USAGE.add_transcription(usage)), heard] if isinstance(usage, dict) else [heard]
    if kind == "conversation.item.input_audio_transcription.failed":
        return [ev.UserTranscriptFailed(event.get("item_id"))]
    if kind == "conversation.item.truncated":
        return [ev.ItemTruncated(event.get("item_id", ""), int(event.get("audio_end_ms", 0)))]
    if kind == "session.updated":
        return [ev.SessionReady()]
    if kind == "error":
        error = event.get("error") or {}
        return [ev.ProviderError(str(error.get("code") or error.get("type") or "error"),
                                 str(error.get("message") or json.dumps(error)[:200]),
                                 error.get("event_id") if isinstance(error.get("event_id"), str) else None)]
    return [ev.Unhandled(kind)]


def _metadata(response: dict) -> dict[str, str]:
    metadata = response.get("metadata")
    if not isinstance(metadata, dict):
        return {}
    return {str(k): str(v) for k, v in metadata.items()}
