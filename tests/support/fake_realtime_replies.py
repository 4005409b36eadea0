"""Scripted replies for :mod:`tests.support.fake_realtime` (GA event streams)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Union

import numpy as np

SAMPLE_RATE = 24_000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000  # PCM16 mono -> 48 bytes per ms


# --------------------------------------------------------------------------- replies
@dataclass
class AudioReply:
    """Assistant audio message: a sine tone (PCM16 24 kHz mono) + transcript."""

    text: str
    audio_ms: int = 600
    tone_hz: float = 440.0
    chunk_ms: int = 100
    delay_ms_per_chunk: float = 0


@dataclass
class ToolCallReply:
    """A function_call output item (``arguments`` is JSON-encoded on the wire)."""

    name: str
    arguments: dict
    call_id: Optional[str] = None


@dataclass
class ErrorReply:
    """Send an ``error`` event instead of creating a response."""

    code: str
    message: str
    type: str = "invalid_request_error"


@dataclass
class DropReply:
    """Start streaming ``then`` and abort the TCP connection after N audio chunks."""

    after_chunks: int
    then: AudioReply


@dataclass
class RawReply:
    """Send ``events`` verbatim (NOT validated, but recorded in ``fake.sent``)."""

    events: list


Reply = Union[AudioReply, ToolCallReply, ErrorReply, DropReply, RawReply]


@dataclass
class ReplyContext:
    """What a callable script sees when a response is requested.

    items:          conversation items so far (deep copies, GA item dicts; for
                    ``response.create`` with ``input`` the resolved input items)
    params:         the ``response`` object of ``response.create`` ({} for VAD)
    session:        current effective session config (dict)
    audio_bytes:    item_id -> bytes of user audio (committed buffer / input_audio)
    response_count: responses created before this one (all connections)
    connection:     1-based connection number
    trigger:        "client" (response.create) or "vad" (automatic)
    """

    items: list
    params: dict
    session: dict
    audio_bytes: dict
    response_count: int
    connection: int
    trigger: str

    @property
    def metadata(self) -> Optional[dict]:
        return self.params.get("metadata")

    @property
    def last_item(self) -> Optional[dict]:
        return self.items[-1] if self.items else None

    @property
    def function_outputs(self) -> list:
        return [i for i in self.items if i.get("type") == "function_call_output"]

    @property
    def user_audio_items(self) -> list:
        """[(item, n_bytes)] for user messages carrying audio."""
        return [(i, self.audio_bytes[i["id"]]) for i in self.items if i.get("id") in self.audio_bytes]


# --------------------------------------------------------------------------- audio helpers
def tone_pcm16(ms: int, hz: float = 440.0, amplitude: float = 0.3) -> bytes:
    """Sine tone, PCM16 little-endian, 24 kHz mono."""
    n = SAMPLE_RATE * ms // 1000
    t = np.arange(n) / SAMPLE_RATE
    return (np.sin(2 * math.pi * hz * t) * amplitude * 32767).astype("<i2").tobytes()


def silence_pcm16(ms: int) -> bytes:
    return b"\x00\x00" * (SAMPLE_RATE * ms // 1000)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _split_text(text: str, n: int) -> list[str]:
    """Split ``text`` into ``n`` pieces (word boundaries) that concatenate to it."""
    words = re.findall(r"\S+\s*|\s+", text)
    if n <= 0:
        return []
    return ["".join(words[i * len(words) // n:(i + 1) * len(words) // n]) for i in range(n)]


# --------------------------------------------------------------------------- input transcription
_SPEAKER_ID = re.compile(r"\buser id (\d+)")


def speaker_named(note: str) -> Optional[int]:
    """The one user id a speaker note names (``... spoken by user id 123 ...``); None if it names
    none or several (e.g. a display name that spoofs a second ``user id``)."""
    ids = set(_SPEAKER_ID.findall(note))
    return int(ids.pop()) if len(ids) == 1 else None


def transcription_event(item_id: str, text: Optional[str], audio_ms: int, model: Any) -> dict:
    """GA ``...input_audio_transcription.completed`` for ``text``, ``.failed`` when text is None.

    Usage follows the billing of the ASR model: ``duration`` for whisper-1, ``tokens`` otherwise
    (audio tokens approximated as one per 100 ms, output tokens as one per word)."""
    base = {"item_id": item_id, "content_index": 0}
    if text is None:
        return {"type": "conversation.item.input_audio_transcription.failed", **base,
                "error": {"type": "transcription_error", "code": "audio_unintelligible",
                          "message": "The audio could not be transcribed.", "param": None}}
    if model == "whisper-1":
        usage: dict = {"type": "duration", "seconds": audio_ms / 1000}
    else:
        audio_tokens, out = max(1, audio_ms // USER_AUDIO_MS_PER_TOKEN), len(text.split())
        usage = {"type": "tokens", "input_tokens": audio_tokens, "output_tokens": out,
                 "total_tokens": audio_tokens + out,
                 "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0}}
    return {"type": "conversation.item.input_audio_transcription.completed", **base, "transcript": text,
            "usage": usage}


# --------------------------------------------------------------------------- response usage
# Estimates in the GA's units: text ~4 characters a token, user audio a token per 100 ms,
# assistant audio a token per 50 ms (what the models' price pages quote, roughly).
USER_AUDIO_MS_PER_TOKEN = 100
ASSISTANT_AUDIO_MS_PER_TOKEN = 50


def text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _item_tokens(item: dict, audio_bytes: dict, output_audio_ms: dict) -> tuple[int, int]:
    """(text, audio) tokens one conversation item adds to a response's context."""
    if item.get("type") == "function_call":
        return text_tokens(f"{item.get('name', '')}{item.get('arguments', '')}"), 0
    if item.get("type") == "function_call_output":
        return text_tokens(str(item.get("output", ""))), 0
    text = sum(text_tokens(p.get("text") or "") for p in item.get("content") or [] if "text" in p)
    if item.get("id") in audio_bytes:
        return text, audio_bytes[item["id"]] // BYTES_PER_MS // USER_AUDIO_MS_PER_TOKEN
    return text, output_audio_ms.get(item.get("id"), 0) // ASSISTANT_AUDIO_MS_PER_TOKEN


def context_tokens(items: list, instructions: str, tools: list, audio_bytes: dict,
                   output_audio_ms: dict) -> tuple[int, int]:
    """(text, audio) input tokens of a response: instructions, tools and the items it sees."""
    text = text_tokens(instructions) + (text_tokens(json.dumps(tools)) if tools else 0)
    audio = 0
    for item in items:
        t, a = _item_tokens(item, audio_bytes, output_audio_ms)
        text, audio = text + t, audio + a
    return text, audio


def response_usage(conn: "StreamTarget", r: "ActiveResponse") -> dict:
    """GA ``response.usage`` for what ``r`` saw (its context) and produced (its output items)."""
    out_text = out_audio = 0
    for item in r.output:
        if item["type"] == "function_call":
            out_text += text_tokens(item["name"] + item["arguments"])
        else:
            out_text += sum(text_tokens(p.get("transcript") or "") for p in item["content"])
            out_audio += conn.output_audio_ms.get(item["id"], 0) // ASSISTANT_AUDIO_MS_PER_TOKEN
    (in_text, in_audio), (cached_text, cached_audio) = r.context, r.cached
    return {"total_tokens": in_text + in_audio + out_text + out_audio, "input_tokens": in_text + in_audio,
            "output_tokens": out_text + out_audio,
            "input_token_details": {"text_tokens": in_text, "audio_tokens": in_audio,
                                    "cached_tokens": cached_text + cached_audio,
                                    "cached_tokens_details": {"text_tokens": cached_text,
                                                              "audio_tokens": cached_audio}},
            "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio}}


# --------------------------------------------------------------------------- streaming
class StreamTarget(Protocol):  # implemented by fake_realtime_conn.Conn
    conv_id: str
    output_audio_ms: dict

    async def send(self, event: dict) -> None: ...
    def new_id(self, prefix: str) -> str: ...
    async def conv_add(self, item: dict) -> None: ...
    async def conv_done(self, item: dict) -> None: ...
    def abort(self) -> None: ...
    def voice(self, params: dict) -> Any: ...


@dataclass
class ActiveResponse:
    id: str
    params: dict
    in_conversation: bool
    output: list = field(default_factory=list)
    cancel_reason: Optional[str] = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    task: Optional[asyncio.Task] = None
    dropped: bool = False
    context: tuple[int, int] = (0, 0)  # (text, audio) input tokens of what it saw
    cached: tuple[int, int] = (0, 0)  # of those, already seen by this connection's previous response

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.cancelled.set()


def response_object(conn: StreamTarget, r: ActiveResponse, status: str) -> dict:
    done = status != "in_progress"
    details = None
    if status == "cancelled":
        details = {"type": "cancelled", "reason": r.cancel_reason}
    return {
        "id": r.id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": [dict(i) for i in r.output] if done else [],
        "conversation_id": conn.conv_id if r.in_conversation else None,
        "output_modalities": ["audio"],
        "max_output_tokens": "inf",
        "audio": {"output": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "voice": conn.voice(r.params)}},
        "usage": response_usage(conn, r) if done else None,
        "metadata": r.params.get("metadata"),
    }


async def _pause(r: ActiveResponse, delay_ms: float) -> None:
    if delay_ms <= 0:
        await asyncio.sleep(0)
        return
    try:
        await asyncio.wait_for(r.cancelled.wait(), delay_ms / 1000)
    except asyncio.TimeoutError:
        pass


async def _stream_audio(conn: StreamTarget, r: ActiveResponse, reply: AudioReply, drop_after: Optional[int]) -> None:
    item_id = conn.new_id("item")
    item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "in_progress", "content": []}
    ids = {"response_id": r.id, "item_id": item_id, "output_index": len(r.output)}
    await conn.send({"type": "response.output_item.added", "response_id": r.id,
                     "output_index": ids["output_index"], "item": dict(item)})
    if r.in_conversation:
        await conn.conv_add(item)
    await conn.send({"type": "response.content_part.added", **ids, "content_index": 0,
                     "part": {"type": "audio", "transcript": ""}})
    pcm = tone_pcm16(reply.audio_ms, reply.tone_hz)
    step = max(1, reply.chunk_ms) * BYTES_PER_MS
    chunks = [pcm[i:i + step] for i in range(0, len(pcm), step)]
    pieces = _split_text(reply.text, len(chunks)) if chunks else [reply.text]
    conn.output_audio_ms[item_id] = 0
    transcript = ""
    for i, chunk in enumerate(chunks):
        if r.cancel_reason:
            break
        if drop_after is not None and i >= drop_after:
            r.dropped = True
            conn.abort()
            return
        await conn.send({"type": "response.output_audio.delta", **ids, "content_index": 0, "delta": b64(chunk)})
        conn.output_audio_ms[item_id] += len(chunk) // BYTES_PER_MS
        if pieces[i]:
            transcript += pieces[i]
            await conn.send({"type": "response.output_audio_transcript.delta", **ids, "content_index": 0,
                             "delta": pieces[i]})
        await _pause(r, reply.delay_ms_per_chunk)
    if not chunks and reply.text:
        transcript = reply.text
        await conn.send({"type": "response.output_audio_transcript.delta", **ids, "content_index": 0,
                         "delta": transcript})
    await conn.send({"type": "response.output_audio.done", **ids, "content_index": 0})
    await conn.send({"type": "response.output_audio_transcript.done", **ids, "content_index": 0,
                     "transcript": transcript})
    await conn.send({"type": "response.content_part.done", **ids, "content_index": 0,
                     "part": {"type": "audio", "transcript": transcript}})
    item["status"] = "incomplete" if r.cancel_reason else "completed"
    item["content"] = [{"type": "output_audio", "transcript": transcript}]
    r.output.append(item)
    await conn.send({"type": "response.output_item.done", "response_id": r.id,
                     "output_index": ids["output_index"], "item": dict(item)})
    if r.in_conversation:
        await conn.conv_done(item)


async def _stream_tool_call(conn: StreamTarget, r: ActiveResponse, reply: ToolCallReply) -> None:
    item_id = conn.new_id("item")
    call_id = reply.call_id or conn.new_id("call")
    args = json.dumps(reply.arguments)
    item = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "in_progress",
            "name": reply.name, "call_id": call_id, "arguments": ""}
    ids = {"response_id": r.id, "item_id": item_id, "output_index": len(r.output), "call_id": call_id}
    await conn.send({"type": "response.output_item.added", "response_id": r.id,
                     "output_index": ids["output_index"], "item": dict(item)})
    if r.in_conversation:
        await conn.conv_add(item)
    half = len(args) // 2
    for piece in (args[:half], args[half:]):
        if piece:
            await conn.send({"type": "response.function_call_arguments.delta", **ids, "delta": piece})
            await _pause(r, 0)
    await conn.send({"type": "response.function_call_arguments.done", **ids, "name": reply.name,
                     "arguments": args})
    item.update(status="completed", arguments=args)
    r.output.append(item)
    await conn.send({"type": "response.output_item.done", "response_id": r.id,
                     "output_index": ids["output_index"], "item": dict(item)})
    if r.in_conversation:
        await conn.conv_done(item)


async def run_response(conn: StreamTarget, r: ActiveResponse, reply: Reply, on_finish) -> None:
    """Stream one response.  ``on_finish()`` runs right before ``response.done``."""
    await conn.send({"type": "response.created", "response": response_object(conn, r, "in_progress")})
    if isinstance(reply, AudioReply):
        await _stream_audio(conn, r, reply, None)
    elif isinstance(reply, DropReply):
        await _stream_audio(conn, r, reply.then, reply.after_chunks)
    elif isinstance(reply, ToolCallReply):
        await _stream_tool_call(conn, r, reply)
    else:
        raise TypeError(f"not a streaming reply: {reply!r}")
    if r.dropped:
        return
    on_finish()
    status = "cancelled" if r.cancel_reason else "completed"
    await conn.send({"type": "response.done", "response": response_object(conn, r, status)})
