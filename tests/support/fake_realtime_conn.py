"""Per-connection state machine of :class:`tests.support.fake_realtime.FakeRealtime`."""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
import time
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from tests.support.fake_realtime_replies import (
    BYTES_PER_MS,
    SAMPLE_RATE,
    ActiveResponse,
    ErrorReply,
    RawReply,
    ReplyContext,
    context_tokens,
    run_response,
    speaker_named,
    transcription_event,
)
from tests.support.realtime_schema import SchemaViolation, validate_client_event, validate_server_event

if TYPE_CHECKING:
    from tests.support.fake_realtime import FakeRealtime

FRAME_MS = 20
_VAD_DEFAULTS = {"server_vad": {"threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
                                "idle_timeout_ms": None, "create_response": True, "interrupt_response": True},
                 "semantic_vad": {"eagerness": "auto", "create_response": True, "interrupt_response": True}}
_EAGERNESS_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 300}


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict) and k != "turn_detection":
            _merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


class Conn:
    """State of one WebSocket connection (session + conversation)."""

    def __init__(self, fake: "FakeRealtime", ws: ServerConnection, index: int, model: str):
        self.fake, self.ws, self.index = fake, ws, index
        self.conv_id = fake.new_id("conv")
        self.session = default_session(fake.new_id("sess"), model)
        self.items: list[dict] = []
        self.audio_bytes: dict[str, int] = {}
        self.output_audio_ms: dict[str, int] = {}
        self.buffer = bytearray()
        self.vad_rem = bytearray()
        self.vad_ms = 0
        self.speaking = False
        self.silence_ms = 0
        self.speech_item: Optional[str] = None
        self.active: Optional[ActiveResponse] = None
        self.audio_out = False
        self.turn_speaker: Optional[int] = None  # named by the last system item since the last commit
        self.transcriptions: set[asyncio.Task] = set()  # delayed transcription events
        self.seen: tuple[int, int] = (0, 0)  # (text, audio) context tokens of the last in-conversation response

    # ---- plumbing used by the reply streamers
    def new_id(self, prefix: str) -> str:
        return self.fake.new_id(prefix)

    def abort(self) -> None:
        self.ws.transport.abort()

    def cancel_tasks(self) -> None:
        """Stop the active response and pending transcriptions (connection or server closing)."""
        me = asyncio.current_task()
        for task in [self.active.task if self.active else None, *self.transcriptions]:
            if task is not None and task is not me:
                task.cancel()

    async def expire(self, message: str) -> None:
        """The session hit its maximum duration: nothing more is produced, the error is sent, the socket
        closes (1001 going away, the message as the reason)."""
        self.cancel_tasks()
        await self.error("session_expired", message)
        await self.ws.close(1001, message)

    def voice(self, params: dict) -> Any:
        out = (params.get("audio") or {}).get("output") or {}
        return out.get("voice") or self.session["audio"]["output"]["voice"]

    async def send(self, event: dict, raw: bool = False) -> None:
        if not raw:
            event = {"event_id": self.new_id("event"), **event}
            try:
                validate_server_event(event)
            except SchemaViolation as exc:
                self.fake.violations.append(f"server->client: {exc}")
                event = self._error_event("fake_server_violation", str(exc), "server_error")
        if event.get("type") == "response.output_audio.delta":
            self.audio_out = True
        self.fake.sent.append(event)
        try:
            await self.ws.send(json.dumps(event))
        except ConnectionClosed:
            pass

    def _error_event(self, code: str, message: str, etype: str = "invalid_request_error",
                     param: Optional[str] = None, client_event_id: Optional[str] = None) -> dict:
        return {"type": "error", "event_id": self.new_id("event"),
                "error": {"type": etype, "code": code, "message": message, "param": param,
                          "event_id": client_event_id}}

    async def error(self, code: str, message: str, param: Optional[str] = None, ev: Optional[dict] = None,
                    etype: str = "invalid_request_error") -> None:
        await self.send(self._error_event(code, message, etype, param, (ev or {}).get("event_id")))

    async def conv_add(self, item: dict, previous_item_id: Any = ..., index: Optional[int] = None) -> None:
        if previous_item_id is ...:
            previous_item_id = self.items[-1]["id"] if self.items else None
        self.items.insert(len(self.items) if index is None else index, item)
        await self.send({"type": "conversation.item.added", "previous_item_id": previous_item_id,
                         "item": copy.deepcopy(item)})

    async def conv_done(self, item: dict) -> None:
        idx = next((i for i, it in enumerate(self.items) if it is item), None)
        prev = self.items[idx - 1]["id"] if idx else None
        await self.send({"type": "conversation.item.done", "previous_item_id": prev,
                         "item": copy.deepcopy(item)})

    def find(self, item_id: str) -> Optional[dict]:
        return next((it for it in self.items if it.get("id") == item_id), None)

    # ---- inbound
    async def on_message(self, raw: Union[str, bytes]) -> None:
        try:
            ev = json.loads(raw)
        except (ValueError, TypeError):
            self.fake.violations.append(f"client->server: not JSON text: {raw[:80]!r}")
            await self.error("invalid_json", "message is not a JSON object")
            return
        self.fake.received.append(ev)
        self.fake.timeline.append((self.index, ev))
        try:
            validate_client_event(ev)
        except SchemaViolation as exc:
            self.fake.violations.append(f"client->server: {exc}")
            await self.error(exc.kind, str(exc), exc.path or None, ev if isinstance(ev, dict) else None)
            return
        try:
            await getattr(self, "on_" + ev["type"].replace(".", "_"))(ev)
        except ConnectionClosed:
            raise
        except Exception as exc:  # a bug in the fake: surface it via assert_clean()
            self.fake.violations.append(f"fake server bug handling {ev['type']}: {exc!r}")
            await self.error("server_error", f"fake server bug: {exc!r}", None, ev, "server_error")

    async def on_session_update(self, ev: dict) -> None:
        upd = ev["session"]
        if upd["type"] != "realtime":
            await self.error("invalid_value", "fake supports session.type 'realtime' only", "session.type", ev)
            return
        out = (upd.get("audio") or {}).get("output") or {}
        if "voice" in out and out["voice"] != self.session["audio"]["output"]["voice"] and self.audio_out:
            await self.error("cannot_update_voice",
                             "Cannot update a conversation's voice if assistant audio is present.",
                             "session.audio.output.voice", ev)
            return
        for d in ("input", "output"):
            fmt = ((upd.get("audio") or {}).get(d) or {}).get("format")
            if fmt is not None and fmt.get("type") != "audio/pcm":
                await self.error("invalid_value", "fake supports audio/pcm only", f"session.audio.{d}.format", ev)
                return
        _merge(self.session, upd)
        td = self.session["audio"]["input"].get("turn_detection")
        if td is not None:
            self.session["audio"]["input"]["turn_detection"] = {**_VAD_DEFAULTS[td["type"]], **td}
        await self.send({"type": "session.updated", "session": copy.deepcopy(self.session)})

    def _turn_detection(self) -> Optional[dict]:
        return self.session["audio"]["input"].get("turn_detection")

    async def on_input_audio_buffer_append(self, ev: dict) -> None:
        try:
            data = base64.b64decode(ev["audio"], validate=True)
        except (binascii.Error, ValueError):
            await self.error("invalid_value", "audio is not valid base64", "audio", ev)
            return
        self.buffer += data
        if self._turn_detection() is not None:
            self.vad_rem += data
            await self._run_vad()

    async def _run_vad(self) -> None:
        td = self._turn_detection()
        frame_bytes = FRAME_MS * BYTES_PER_MS
        thr = self.fake.vad_rms_threshold or 0.1 * td.get("threshold", 0.5)
        silence_needed = td.get("silence_duration_ms") or _EAGERNESS_SILENCE_MS.get(td.get("eagerness"), 500)
        while len(self.vad_rem) >= frame_bytes and self._turn_detection() is td:
            frame = np.frombuffer(bytes(self.vad_rem[:frame_bytes]), dtype="<i2").astype(np.float64)
            del self.vad_rem[:frame_bytes]
            start, self.vad_ms = self.vad_ms, self.vad_ms + FRAME_MS
            speech = float(np.sqrt(np.mean(frame ** 2))) / 32768 >= thr
            if not self.speaking and speech:
                self.speaking, self.silence_ms = True, 0
                self.speech_item = self.new_id("item")
                await self.send({"type": "input_audio_buffer.speech_started", "item_id": self.speech_item,
                                 "audio_start_ms": max(0, start - td.get("prefix_padding_ms", 300))})
                if self.active and td.get("interrupt_response", True):
                    self.active.cancel("turn_detected")
            elif self.speaking:
                self.silence_ms = 0 if speech else self.silence_ms + FRAME_MS
                if self.silence_ms >= silence_needed:
                    self.speaking = False
                    await self.send({"type": "input_audio_buffer.speech_stopped", "item_id": self.speech_item,
                                     "audio_end_ms": self.vad_ms})
                    await self._commit(self.speech_item)
                    if self.active is not None and self.active.cancel_reason and self.active.task:
                        await asyncio.wait([self.active.task])  # let the interrupted response finish
                    if td.get("create_response", True) and self.active is None:
                        await self.start_response({}, "vad")

    async def _commit(self, item_id: Optional[str], ev: Optional[dict] = None) -> None:
        if len(self.buffer) < 100 * BYTES_PER_MS:
            await self.error("input_audio_buffer_commit_empty",
                             f"Error committing input audio buffer: buffer too small. Expected at least 100ms "
                             f"of audio, but buffer only has {len(self.buffer) / BYTES_PER_MS:.2f}ms of audio.",
                             None, ev)
            return
        item_id = item_id or self.new_id("item")
        prev = self.items[-1]["id"] if self.items else None
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": prev})
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}
        nbytes, self.buffer = len(self.buffer), bytearray()
        speaker, self.turn_speaker = self.turn_speaker, None
        self.audio_bytes[item_id] = nbytes
        await self.conv_add(item)
        await self.conv_done(item)
        transcription = self.session["audio"]["input"].get("transcription")
        if transcription:
            text = self.fake.next_transcript(speaker, nbytes // BYTES_PER_MS)
            event = transcription_event(item_id, text, nbytes // BYTES_PER_MS, transcription.get("model"))
            delay_ms = self.fake.transcript_delay_ms
            if delay_ms <= 0:  # inline: before anything else this connection sends (as before delays existed)
                await self._deliver_transcription(item, speaker, event, 0)
            else:
                task = asyncio.create_task(self._deliver_transcription(item, speaker, event, delay_ms))
                self.transcriptions.add(task)
                task.add_done_callback(self.transcriptions.discard)
                task.add_done_callback(self._task_done)

    async def _deliver_transcription(self, item: dict, speaker: Optional[int], event: dict, delay_ms: int) -> None:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        text = event.get("transcript")
        if text is not None:
            item["content"][0]["transcript"] = text
        self.fake.transcribed.append((speaker, item["id"], text or ""))
        await self.send(event)

    async def on_input_audio_buffer_commit(self, ev: dict) -> None:
        item_id = self.speech_item if self.speaking else None
        self.speaking, self.silence_ms, self.vad_rem = False, 0, bytearray()
        await self._commit(item_id, ev)

    async def on_input_audio_buffer_clear(self, ev: dict) -> None:
        self.buffer, self.vad_rem, self.speaking, self.silence_ms = bytearray(), bytearray(), False, 0
        await self.send({"type": "input_audio_buffer.cleared"})

    async def on_output_audio_buffer_clear(self, ev: dict) -> None:
        pass  # WebRTC/SIP only; nothing buffered server-side over WebSocket

    async def on_conversation_item_create(self, ev: dict) -> None:
        item = copy.deepcopy(ev["item"])
        if item.get("id") and self.find(item["id"]):
            await self.error("item_already_exists", f"Item with id '{item['id']}' already exists", "item.id", ev)
            return
        prev = ev.get("previous_item_id")
        if prev is None:
            index = len(self.items)
        elif prev == "root":
            index = 0
        elif self.find(prev) is not None:
            index = self.items.index(self.find(prev)) + 1
        else:
            await self.error("invalid_value", f"previous_item_id '{prev}' not found", "previous_item_id", ev)
            return
        item.setdefault("id", self.new_id("item"))
        item.update(object="realtime.item", status="completed")
        nbytes = 0
        for part in item.get("content") or []:
            if part.get("type") == "input_audio" and part.get("audio"):
                nbytes += len(base64.b64decode(part.pop("audio")))
        if nbytes:
            self.audio_bytes[item["id"]] = nbytes
        await self.conv_add(item, self.items[index - 1]["id"] if index else None, index)
        await self.conv_done(item)
        if item.get("type") == "message" and item.get("role") == "system":
            self.turn_speaker = speaker_named("\n".join(
                p.get("text") or "" for p in item.get("content") or [] if p.get("type") == "input_text"))

    async def on_conversation_item_delete(self, ev: dict) -> None:
        item = self.find(ev["item_id"])
        if item is None:
            await self.error("invalid_value", f"Item with id '{ev['item_id']}' not found", "item_id", ev)
            return
        self.items.remove(item)
        await self.send({"type": "conversation.item.deleted", "item_id": ev["item_id"]})

    async def on_conversation_item_retrieve(self, ev: dict) -> None:
        item = self.find(ev["item_id"])
        if item is None:
            await self.error("invalid_value", f"Item with id '{ev['item_id']}' not found", "item_id", ev)
            return
        await self.send({"type": "conversation.item.retrieved", "item": copy.deepcopy(item)})

    async def on_conversation_item_truncate(self, ev: dict) -> None:
        item, end = self.find(ev["item_id"]), ev["audio_end_ms"]
        if item is None or item.get("role") != "assistant" or ev["item_id"] not in self.output_audio_ms:
            await self.error("invalid_value", "Only assistant audio message items can be truncated", "item_id", ev)
        elif ev["content_index"] != 0:
            await self.error("invalid_value", "content_index out of range", "content_index", ev)
        elif end < 0 or end > self.output_audio_ms[ev["item_id"]]:
            await self.error("invalid_value", f"audio_end_ms {end} exceeds the audio duration "
                             f"({self.output_audio_ms[ev['item_id']]} ms)", "audio_end_ms", ev)
        else:
            self.output_audio_ms[ev["item_id"]] = end
            for part in item.get("content") or []:
                part["transcript"] = ""
            await self.send({"type": "conversation.item.truncated", "item_id": ev["item_id"],
                             "content_index": 0, "audio_end_ms": end})

    async def on_response_cancel(self, ev: dict) -> None:
        if self.active is None or ev.get("response_id") not in (None, self.active.id):
            await self.error("response_cancel_not_active", "Cancellation failed: no active response found",
                             None, ev)
        else:
            self.active.cancel("client_cancelled")

    async def on_response_create(self, ev: dict) -> None:
        params = copy.deepcopy(ev.get("response") or {})
        if self.active is not None:
            await self.error("conversation_already_has_active_response",
                             f"Conversation already has an active response in progress: {self.active.id}. "
                             "Wait until the response is finished before creating a new one.", None, ev)
            return
        await self.start_response(params, "client", ev)

    async def start_response(self, params: dict, trigger: str, ev: Optional[dict] = None) -> None:
        items = self.items
        if "input" in params:
            items = []
            for it in params["input"]:
                if it.get("type") == "item_reference":
                    if self.find(it["id"]) is None:
                        await self.error("invalid_value", f"item_reference '{it['id']}' not found",
                                         "response.input", ev)
                        return
                    it = self.find(it["id"])
                items.append(it)
        ctx = ReplyContext(items=copy.deepcopy(items), params=params, session=copy.deepcopy(self.session),
                           audio_bytes=dict(self.audio_bytes), response_count=self.fake.response_count,
                           connection=self.index, trigger=trigger)
        reply = await self.fake.next_reply(ctx)
        if isinstance(reply, ErrorReply):
            await self.error(reply.code, reply.message, None, ev, reply.type)
            return
        if isinstance(reply, RawReply):
            for raw in reply.events:
                await self.send(raw, raw=True)
            return
        self.fake.response_count += 1
        r = ActiveResponse(id=self.new_id("resp"), params=params,
                           in_conversation=params.get("conversation", "auto") != "none")
        r.context = context_tokens(items, params.get("instructions") or self.session["instructions"] or "",
                                   params.get("tools", self.session["tools"]), self.audio_bytes, self.output_audio_ms)
        if r.in_conversation:  # the conversation's prefix is cached from this connection's previous response
            r.cached = (min(self.seen[0], r.context[0]), min(self.seen[1], r.context[1]))
            self.seen = r.context
        self.active = r

        def finish() -> None:
            if self.active is r:
                self.active = None

        r.task = asyncio.create_task(run_response(self, r, reply, finish))
        r.task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fake.violations.append(f"fake server bug in a background task: {task.exception()!r}")


def default_session(session_id: str, model: str) -> dict:
    """A realistic GA ``session.created`` session object."""
    fmt = {"type": "audio/pcm", "rate": SAMPLE_RATE}
    return {
        "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
        "expires_at": int(time.time()) + 3600, "output_modalities": ["audio"],
        "instructions": "Your knowledge cutoff is 2023-10. You are a helpful, witty, and friendly AI.",
        "tools": [], "tool_choice": "auto", "max_output_tokens": "inf", "tracing": None,
        "truncation": "auto", "prompt": None, "include": None,
        "audio": {"input": {"format": dict(fmt), "transcription": None, "noise_reduction": None,
                            "turn_detection": {"type": "server_vad", **_VAD_DEFAULTS["server_vad"]}},
                  "output": {"format": dict(fmt), "voice": "marin", "speed": 1.0}},
    }
