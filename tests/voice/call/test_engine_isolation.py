"""One engine per call: nothing shared between engines, nothing stale across a reconnect."""

from __future__ import annotations

import asyncio
import json
import logging

import websockets

from tests.support.virtual_transport import VirtualTransport
from voice.call.engine import CallEngine
from voice.call.identity import Identity
from voice.call.providers import OpenAIRealtime
from voice.call.tools import ToolCall, ToolCatalogue
from voice.call.transports.base import FRAME_BYTES


class ScriptedSocket:
    """An in-memory provider socket: `send` can be held shut; iteration ends when the test says."""

    def __init__(self, *, open_gate: bool = True) -> None:
        self.sent: list[dict] = []
        self.gate = asyncio.Event()
        if open_gate:
            self.gate.set()
        self.incoming: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = False
        self.first_send = asyncio.Event()

    async def send(self, data: str) -> None:
        self.first_send.set()
        await self.gate.wait()
        if self.closed:
            raise websockets.exceptions.ConnectionClosed(None, None)
        self.sent.append(json.loads(data))

    def drop(self) -> None:
        """The connection ends; a send already in progress stays stuck until `release()`."""
        self.closed = True
        self.incoming.put_nowait(None)

    def release(self) -> None:
        self.gate.set()

    async def close(self) -> None:
        self.closed = True
        self.gate.set()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        message = await self.incoming.get()
        if message is None:
            raise StopAsyncIteration
        return message


async def no_wait(_: float) -> None:
    await asyncio.sleep(0)


def engine_for(catalogue: ToolCatalogue, voice: str, sockets: list[ScriptedSocket], **kw) -> CallEngine:
    provider = OpenAIRealtime("k", "gpt-realtime-2.1-mini", voice, url="ws://127.0.0.1:1/v1/realtime")

    async def connect(url, headers):
        return sockets.pop(0)

    return CallEngine(provider, VirtualTransport(), catalogue, Identity("test"), connector=connect,
                      sleep=no_wait, backoff=(0.0,), **kw)


async def test_two_engines_on_one_catalogue_each_report_their_own_call():
    shared = ToolCatalogue()
    one = engine_for(shared, "marin", [])
    two = engine_for(shared, "cedar", [])
    assert shared.get("talk_status") is None  # the caller's catalogue is not changed
    call = ToolCall("c", "talk_status", {}, "{}")
    assert one.catalogue.get("talk_status").handler(call)["voice"] == "marin"
    assert two.catalogue.get("talk_status").handler(call)["voice"] == "cedar"
    assert one.call.call_id != two.call.call_id


async def test_events_queued_for_a_dropped_socket_never_reach_the_new_one(caplog):
    first, second = ScriptedSocket(open_gate=False), ScriptedSocket()
    engine = engine_for(ToolCatalogue(), "marin", [first, second])
    transport: VirtualTransport = engine.transport
    caplog.set_level(logging.WARNING)
    task = asyncio.create_task(engine.run())
    await first.first_send.wait()  # the writer is stuck sending session.update on the first socket
    transport.push(b"\x01" * FRAME_BYTES * 5)  # these appends pile up behind it
    while transport._frames.qsize():
        await asyncio.sleep(0)
    first.drop()
    while engine.core.counters["reconnects"] < 1:
        await asyncio.sleep(0)
    first.release()  # the stuck send fails only now, with the new socket already in place
    transport.push(b"\x02" * FRAME_BYTES)
    while not any(e["type"] == "input_audio_buffer.append" for e in second.sent):
        await asyncio.sleep(0)
    engine.stop()
    await asyncio.wait_for(task, 5)
    assert second.sent[0]["type"] == "session.update"
    appends = [e["audio"] for e in second.sent if e["type"] == "input_audio_buffer.append"]
    import base64

    assert all(set(base64.b64decode(a)) == {2} for a in appends)  # nothing from before the drop
    assert engine.dropped_sends >= 5
    assert all(f"[call {engine.call.call_id}]" in r.getMessage() for r in caplog.records
               if r.name == "voice.call.engine")
