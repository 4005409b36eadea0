"""Fake OpenAI Realtime **GA** server on loopback for tests — and for trying `talk` with no key.

    python -m tests.support.fake_realtime --port 8765     # prints the URL to point talk at

    async with FakeRealtime(script=[ToolCallReply("get_time", {}), AudioReply("It is noon")]) as fake:
        async with websockets.connect(fake.url, additional_headers={"Authorization": "Bearer x"}) as ws:
            ...
        fake.assert_clean()

Every received client event and every sent server event is checked with
:mod:`tests.support.realtime_schema`; violations land in ``fake.violations``
(and an ``error`` event is sent instead of processing / instead of the bad
event).  ``RawReply`` / ``send_to_all(..., raw=True)`` bypass validation.

Input transcription (when the session sets ``audio.input.transcription``): each
committed user item gets ``conversation.item.input_audio_transcription.completed``
(or ``.failed``), ``transcript_delay_ms`` after the commit.  Its speaker is the
user id named (``user id 123``) by the last system message item the client
created since the previous commit; the text comes from ``user_transcripts``
(flat, first), else ``transcripts`` (per speaker), else a placeholder.  See
:meth:`FakeRealtime.next_transcript`; ``fake.transcribed`` records the results.

Every ``response.done`` reports GA ``usage`` estimated from what the response saw and said (text
~4 characters a token, user audio a token per 100 ms, assistant audio one per 50 ms; the context the
connection's previous response saw counts as cached).  :meth:`FakeRealtime.expire_session` ends the
open sessions as the server does at their maximum duration: ``error`` ``session_expired``, then close.

Sessions: ``fake.connections`` counts the sockets opened; ``fake.received_on(n)`` is what connection
``n`` (1-based) received, and ``fake.timeline`` every received event as ``(connection, event)`` in
arrival order, with ``(connection, None)`` where that connection closed — so a test can tell what a
second session had been given before the first one ended.

Simplifications: audio must be ``audio/pcm`` 24 kHz (VAD is RMS-based on 20 ms
frames: speech when ``rms/32768 >= 0.1 * threshold``, i.e. 0.05 for the
default threshold 0.5); responses are audio-only; ``output_audio_buffer.clear``
is accepted and ignored (WebRTC/SIP only); one active response at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import inspect
import itertools
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.support.fake_realtime_conn import Conn
from tests.support.fake_realtime_replies import (
    BYTES_PER_MS,
    SAMPLE_RATE,
    AudioReply,
    DropReply,
    ErrorReply,
    RawReply,
    Reply,
    ReplyContext,
    ToolCallReply,
    b64,
    silence_pcm16,
    tone_pcm16,
)
from tests.support.realtime_schema import prepare as prepare_schema

__all__ = ["FakeRealtime", "AudioReply", "ToolCallReply", "ErrorReply", "DropReply", "RawReply",
           "ReplyContext", "SpeakerTranscripts", "tone_pcm16", "silence_pcm16", "b64", "SAMPLE_RATE",
           "BYTES_PER_MS"]

# {speaker_id: [text or None (= failed), ...]} or (speaker_id, ordinal, audio_ms) -> text or None.
SpeakerTranscripts = Union[Mapping[Optional[int], Sequence[Optional[str]]],
                           Callable[[Optional[int], int, int], Optional[str]]]


class FakeRealtime:
    """Loopback fake of the Realtime GA WebSocket endpoint (see module doc)."""

    def __init__(self, script: Union[None, list, Callable[[ReplyContext], Any]] = None, *,
                 default_reply: Optional[Reply] = None, user_transcripts: Optional[list] = None,
                 transcripts: Optional[SpeakerTranscripts] = None, transcript_delay_ms: int = 0,
                 model: str = "gpt-realtime", require_auth: bool = False,
                 vad_rms_threshold: Optional[float] = None, host: str = "127.0.0.1", port: int = 0):
        self.script = list(script) if isinstance(script, (list, tuple)) else script
        self.default_reply = default_reply or AudioReply("Okay.")
        self.user_transcripts = list(user_transcripts or [])
        self._queues: dict[Optional[int], list[Optional[str]]] = {}
        if isinstance(transcripts, Mapping):
            if any(not (k is None or isinstance(k, int)) for k in transcripts):
                raise TypeError("transcripts: keys are Discord user ids (int) or None")
            self._queues = {k: list(v) for k, v in transcripts.items()}
        elif transcripts is not None and not callable(transcripts):
            raise TypeError("transcripts: a {user_id: [text, ...]} mapping or a callable")
        if transcript_delay_ms < 0:
            raise ValueError("transcript_delay_ms must be >= 0")
        self.transcripts = transcripts
        self.transcript_delay_ms = transcript_delay_ms
        self.transcribed: list[tuple[Optional[int], str, str]] = []  # (speaker, item_id, text; "" = failed)
        self._speaker_turns: dict[Optional[int], int] = {}
        self.model, self.require_auth, self.host, self.port = model, require_auth, host, port
        self.vad_rms_threshold = vad_rms_threshold
        self.received: list[dict] = []
        self.timeline: list[tuple[int, Optional[dict]]] = []  # (connection, event); None: it closed
        self.sent: list[dict] = []
        self.violations: list[str] = []
        self.headers: list = []
        self.paths: list[str] = []
        self.connections = 0
        self.response_count = 0
        self.contexts: list[ReplyContext] = []
        self.url = ""
        self._conns: list[Conn] = []
        self._ids = itertools.count(1)
        self._server = None

    # ---- lifecycle
    async def __aenter__(self) -> "FakeRealtime":
        prepare_schema()  # ready before its URL is handed out: the first event must not wait for the validators
        self._server = await serve(self._handler, self.host, self.port, process_request=self._process_request)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://{self.host}:{port}/v1/realtime"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for c in list(self._conns):
            c.cancel_tasks()
        self._server.close()
        try:
            await asyncio.wait_for(self._server.wait_closed(), 0.5)
        except asyncio.TimeoutError:
            self.drop_all()
            await self._server.wait_closed()

    def _process_request(self, connection: ServerConnection, request: Any) -> Any:
        if urlsplit(request.path).path != "/v1/realtime":
            return connection.respond(404, "Not Found\n")
        if self.require_auth and not (request.headers.get("Authorization") or "").startswith("Bearer "):
            return connection.respond(401, "Missing bearer token\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        self.headers.append(ws.request.headers)
        self.paths.append(ws.request.path)
        if "OpenAI-Beta" in ws.request.headers:
            self.violations.append(f"connection {self.connections}: beta header "
                                   f"OpenAI-Beta: {ws.request.headers['OpenAI-Beta']}")
        model = parse_qs(urlsplit(ws.request.path).query).get("model", [self.model])[0]
        conn = Conn(self, ws, self.connections, model)
        self._conns.append(conn)
        try:
            await conn.send({"type": "session.created", "session": copy.deepcopy(conn.session)})
            async for message in ws:
                await conn.on_message(message)
        except ConnectionClosed:
            pass
        finally:
            self.timeline.append((conn.index, None))
            self._conns.remove(conn)
            conn.cancel_tasks()

    # ---- helpers for tests
    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    async def next_reply(self, ctx: ReplyContext) -> Reply:
        self.contexts.append(ctx)
        reply = None
        if callable(self.script):
            reply = self.script(ctx)
            if inspect.isawaitable(reply):
                reply = await reply
        elif self.script:
            reply = self.script.pop(0)
        return reply or self.default_reply

    def next_transcript(self, speaker: Optional[int], audio_ms: int) -> Optional[str]:
        """What ``speaker`` said in a committed turn of ``audio_ms`` (None: transcription fails).

        ``user_transcripts`` is used first while it lasts; then a callable ``transcripts`` gets
        ``(speaker, ordinal, audio_ms)`` (ordinal: 0-based count of this speaker's earlier turns,
        all connections), a mapping yields the speaker's next text; otherwise a placeholder."""
        ordinal = self._speaker_turns.get(speaker, 0)
        self._speaker_turns[speaker] = ordinal + 1
        if self.user_transcripts:
            return self.user_transcripts.pop(0)
        if callable(self.transcripts):
            return self.transcripts(speaker, ordinal, audio_ms)
        queue = self._queues.get(speaker)
        return queue.pop(0) if queue else f"<{audio_ms} ms of user audio>"

    @property
    def session(self) -> Optional[dict]:
        """Effective session of the most recent open connection."""
        return self._conns[-1].session if self._conns else None

    @property
    def items(self) -> list:
        """Conversation items of the most recent open connection."""
        return self._conns[-1].items if self._conns else []

    def received_on(self, connection: int) -> list[dict]:
        """Every client event connection ``connection`` (1-based, in the order they opened) received."""
        return [e for n, e in self.timeline if n == connection and e is not None]

    def closed(self, connection: int) -> bool:
        return (connection, None) in self.timeline

    def received_types(self) -> list[str]:
        return [e.get("type") for e in self.received if isinstance(e, dict)]

    def sent_types(self) -> list[str]:
        return [e.get("type") for e in self.sent]

    def drop_all(self) -> None:
        """Abort every open TCP connection (no close frame)."""
        for c in list(self._conns):
            c.abort()

    async def send_to_all(self, event: dict, raw: bool = False) -> None:
        """Push a server event (``event_id`` added if missing) to every connection."""
        for c in list(self._conns):
            await c.send(dict(event), raw=raw)

    async def expire_session(self, minutes: int = 60) -> int:
        """End every open session the way the GA server does at its maximum duration (60 minutes for
        GA models): an ``error`` event, code ``session_expired``, then a close frame 1001 carrying the
        same message. Returns how many sessions ended."""
        message = f"Your session hit the maximum duration of {minutes} minutes."
        conns = list(self._conns)
        for c in conns:
            await c.expire(message)
        return len(conns)

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Poll `predicate` until true; the timeout only bounds a failing test (a loaded machine is slow)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not (result := predicate()):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timeout waiting for {predicate}")
            await asyncio.sleep(0.005)
        return result

    async def wait_received(self, event_type: str, count: int = 1, timeout: float = 10.0) -> dict:
        """Wait until ``count`` client events of ``event_type`` arrived; return the last."""
        found = await self.wait_for(
            lambda: (m := [e for e in self.received if isinstance(e, dict) and e.get("type") == event_type])
            and len(m) >= count and m, timeout)
        return found[-1]

    def assert_clean(self) -> None:
        if self.violations:
            raise AssertionError("Realtime GA violations:\n  " + "\n  ".join(self.violations))


# ---- `python -m tests.support.fake_realtime`: a server anyone can point `switchboard talk` at


async def _serve_until_stopped(port: int, reply: str, audio_ms: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeRealtime(default_reply=AudioReply(reply, audio_ms=audio_ms), port=port) as fake:
        print(f"fake Realtime GA server on {fake.url} (loopback only; Ctrl-C to stop)", flush=True)
        print(f"try: SWITCHBOARD_REALTIME_URL={fake.url} OPENAI_API_KEY=fake-key "
              f"{sys.executable} -m bot talk --input-wav IN.wav --output-wav OUT.wav", flush=True)
        await stop.wait()
        print(f"{fake.connections} connection(s), {fake.response_count} response(s), "
              f"{len(fake.violations)} GA violation(s)", flush=True)
        for violation in fake.violations:
            print(f"  {violation}", flush=True)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_realtime",
        description="A strict fake OpenAI Realtime GA server on 127.0.0.1: it answers every turn with "
                    "a tone and a transcript, and checks every event against the GA models.")
    parser.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--reply", default="This is the fake Realtime server. Your audio arrived.",
                        help="the transcript of every answer")
    parser.add_argument("--audio-ms", type=int, default=1200, help="length of every answer's tone")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve_until_stopped(args.port, args.reply, args.audio_ms))
    except OSError as exc:
        print(f"fake_realtime: cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); "
              "try another --port", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
