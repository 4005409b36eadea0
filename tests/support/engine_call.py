"""A `CallEngine` running against the fake Realtime server, for engine tests:

    async with running(fake, transport, engine) as call:
        call.say()                                   # a tone the energy detector hears, then silence
        await fake.wait_for(lambda: call.transcripts)

`call.transcripts` collects (role, text) of every transcript line; the engine is stopped (and must end
within 5 s) on the way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.support.clock import VirtualClock
from tests.support.fake_realtime import FakeRealtime, silence_pcm16, tone_pcm16
from tests.support.virtual_transport import VirtualTransport
from voice.call.engine import CallEngine


async def no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


class Call:
    def __init__(self, fake: FakeRealtime, transport: VirtualTransport, engine: CallEngine,
                 clock: VirtualClock | None = None) -> None:
        self.fake, self.transport, self.engine, self.clock = fake, transport, engine, clock
        self.transcripts: list[tuple[str, str]] = []

    def say(self, speech_ms: int = 400, silence_ms: int = 700, hz: float = 300.0) -> None:
        """Someone says something (a tone: the energy detector hears it) and stops."""
        self.transport.push(tone_pcm16(speech_ms, hz) + silence_pcm16(silence_ms))

    def received(self, kind: str) -> list[dict]:
        return [e for e in self.fake.received if e.get("type") == kind]

    async def answered(self, text: str) -> None:
        """Until `text` was said and played out, and the call is quiet again."""
        await self.fake.wait_for(lambda: ("assistant", text) in self.transcripts and self.engine.core.idle()
                                 and not self.transport.is_playing(), timeout=10)

    def spoken(self) -> list[dict]:
        """Announcements the call asked for (responses without tools)."""
        return [e for e in self.fake.received if e.get("type") == "response.create"
                and e.get("response", {}).get("tool_choice") == "none"]


@asynccontextmanager
async def running(fake: FakeRealtime, transport: VirtualTransport, engine: CallEngine,
                  clock: VirtualClock | None = None) -> AsyncIterator[Call]:
    call = Call(fake, transport, engine, clock)
    engine._on_transcript = lambda line: call.transcripts.append((line.role, line.text))
    task = asyncio.create_task(engine.run())
    try:
        yield call
    finally:
        engine.stop()
        await asyncio.wait_for(task, 5)
