"""A Discord voice channel as a call transport: many speakers in, each on their own; one assistant voice out.

Receive: `on_speech(user_id, ssrc, pcm)` is the `ListeningVoiceClient` sink (on the event loop,
48 kHz stereo, one 20 ms frame per call). Each member's frames are downmixed and resampled to the
model's 24 kHz mono by their own resampler and queued — never mixed with anyone else's. `frames()`
ticks every 20 ms: it takes the oldest queued frame of every member with audio pending, scores each
with that member's own speech detector stream (one `VadBank` shared by every member, and by every
call in the process: one batched model run per tick), and yields one `RoomTick`. Discord clients
stop sending in silence, so a member with nothing queued is simply absent from the tick: no VAD
work, and the call core hears their silence (`voice.call.speakers`).

Playback: a `voice.media.playback.PlaybackSource` that discord.py's player thread reads; its start and
idle notices are handed to the engine on the loop with `call_soon_threadsafe`. `pause()` holds it
where it is (someone started talking over the assistant) and `resume()` plays on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from voice.audio import Resampler
from voice.call.actions import PlaybackPosition
from voice.call.transports.base import FRAME_BYTES, HeardFrame, PlaybackListener, RoomTick, TurnContext
from voice.call.vad import DetectorBank, EnergyDetector, VadBank, VadStream
from voice.media.playback import PlaybackSource

DISCORD_RATE = 48_000
MODEL_RATE = 24_000
MAX_QUEUED_FRAMES = 25  # 500 ms per member: a longer backlog (a stalled loop) drops its oldest audio
NAME_TTL_S = 10.0  # display names are looked up again after this long


class _Member:
    __slots__ = ("resampler", "pending", "queue", "vad", "name", "named_at", "dropped")

    def __init__(self, vad: VadStream) -> None:
        self.resampler = Resampler(DISCORD_RATE, MODEL_RATE, 1, "HQ")
        self.pending = bytearray()  # resampled audio short of a whole frame
        self.queue: deque[bytes] = deque()
        self.vad = vad
        self.name: str | None = None
        self.named_at = -NAME_TTL_S
        self.dropped = 0


class RoomTransport:
    def __init__(self, *, names: Callable[[int], str | None] = lambda _user: None,
                 vad: VadBank | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 loop: asyncio.AbstractEventLoop | None = None,
                 max_queued_frames: int = MAX_QUEUED_FRAMES) -> None:
        self.source = PlaybackSource(MODEL_RATE)
        self._names = names
        self._vad: VadBank = vad or DetectorBank(EnergyDetector)
        self._clock = clock
        self._sleep = sleep
        self._loop = loop
        self._max_queued = max_queued_frames
        self._members: dict[int, _Member] = {}
        self._closed = asyncio.Event()
        self.frames_in = 0
        self.ticks = 0
        self.frames_shed = 0  # audio dropped because a member's backlog outgrew `max_queued_frames`
        self.heard: dict[int, int] = {}  # user id -> frames received

    # -- receive (event loop) --------------------------------------------------------------------

    def on_speech(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        member = self._members.get(user_id)
        if member is None:
            member = self._members[user_id] = _Member(self._vad.stream())
        stereo = np.frombuffer(pcm, dtype="<i2")
        mono = ((stereo[0::2].astype(np.int32) + stereo[1::2]) // 2).astype("<i2").tobytes()
        member.pending += member.resampler.convert(mono)
        while len(member.pending) >= FRAME_BYTES:
            member.queue.append(bytes(member.pending[:FRAME_BYTES]))
            del member.pending[:FRAME_BYTES]
        while len(member.queue) > self._max_queued:  # overload: bounded delay beats unbounded memory
            member.queue.popleft()
            member.dropped += 1
            self.frames_shed += 1
        self.frames_in += 1
        self.heard[user_id] = self.heard.get(user_id, 0) + 1

    def forget(self, user_id: int) -> None:
        """The user left the channel: drop what they had queued."""
        self._members.pop(user_id, None)

    def tick(self) -> RoomTick:
        """One 20 ms tick: every member's oldest queued frame, with its speech probability."""
        now = self._clock()
        taken: list[tuple[int, _Member, bytes]] = []
        for user_id, member in self._members.items():
            if member.queue:
                frame = member.queue.popleft()
                member.vad.push(frame)
                taken.append((user_id, member, frame))
        if not taken:
            return RoomTick({})
        streams = [member.vad for _, member, _ in taken]
        while self._vad.run(streams):  # a burst can leave more than one window waiting
            streams = [s for s in streams if s.pending]
        frames = {}
        names = {}
        for user_id, member, frame in taken:
            frames[user_id] = HeardFrame(frame, member.vad.last)
            if now - member.named_at >= NAME_TTL_S:
                member.name, member.named_at = self._names(user_id), now
            if member.name:
                names[user_id] = member.name
        return RoomTick(frames, names)

    async def frames(self) -> AsyncIterator[RoomTick]:
        """A `RoomTick` every 20 ms in real time until `close()`."""
        period = FRAME_BYTES / 2 / MODEL_RATE
        next_at = self._clock()
        while not self._closed.is_set():
            self.ticks += 1
            yield self.tick()
            next_at += period
            delay = next_at - self._clock()
            if delay < -0.2:  # the loop stalled: do not burst to catch up
                next_at = self._clock()
                delay = 0.0
            await self._sleep(max(0.0, delay))

    def turn_context(self) -> TurnContext | None:
        return None  # every tick says who is in it

    def close(self) -> None:
        self._closed.set()

    # -- playback ----------------------------------------------------------------------------------

    def set_listener(self, listener: PlaybackListener) -> None:
        loop = self._loop or asyncio.get_event_loop()

        class _OnLoop:
            def on_playback_started(self, item_id: str) -> None:
                loop.call_soon_threadsafe(listener.on_playback_started, item_id)

            def on_playback_idle(self) -> None:
                loop.call_soon_threadsafe(listener.on_playback_idle)

        self.source.set_listener(_OnLoop())

    def play(self, pcm: bytes, item_id: str) -> None:
        self.source.feed(pcm, item_id)

    def finish_item(self, item_id: str) -> None:
        self.source.finish_item(item_id)

    def clear(self) -> None:
        self.source.clear()

    def pause(self) -> None:
        self.source.speaker.pause()

    def resume(self) -> None:
        self.source.speaker.resume()

    def played_ms(self, item_id: str) -> int:
        return self.source.played_ms(item_id)

    def is_playing(self) -> bool:
        return self.source.is_playing()

    def position(self) -> PlaybackPosition:
        return self.source.position()
