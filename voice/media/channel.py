"""A Discord voice channel as a call transport: many speakers in, each on their own; one assistant voice out.

Receive: `on_speech(user_id, ssrc, pcm)` is the `ListeningVoiceClient` sink (on the event loop, one
20 ms frame per call): the model's 24 kHz mono when the receiver decodes straight to it (a call
does), else 48 kHz stereo, downmixed and resampled by that member's own resampler. Either way each
member's frames are queued on their own — never mixed with anyone else's. `frames()`
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
from voice.call.transports.base import FRAME_BYTES, HeardFrame, PlaybackListener, RoomTick, TurnContext
from voice.call.transports.playback_queue import SpeakerPlayback
from voice.call.vad import DetectorBank, EnergyDetector, VadBank, VadStream
from voice.media.playback import PlaybackSource

DISCORD_RATE = 48_000
MODEL_RATE = 24_000
MAX_QUEUED_FRAMES = 25  # 500 ms per member: a longer backlog (a stalled loop) drops its oldest audio
NAME_TTL_S = 10.0  # display names are looked up again after this long


class _Member:
    __slots__ = ("resampler", "pending", "queue", "vad", "name", "named_at", "dropped")

    def __init__(self, vad: VadStream) -> None:
        self.resampler: Resampler | None = None  # only for 48 kHz input
        self.pending = bytearray()  # resampled audio short of a whole frame
        self.queue: deque[bytes] = deque()
        self.vad = vad
        self.name: str | None = None
        self.named_at = -NAME_TTL_S
        self.dropped = 0


class RoomTransport(SpeakerPlayback):
    def __init__(self, *, names: Callable[[int], str | None] = lambda _user: None,
                 vad: VadBank | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 loop: asyncio.AbstractEventLoop | None = None,
                 max_queued_frames: int = MAX_QUEUED_FRAMES, room_clock: RoomClock | None = None) -> None:
        self.source = PlaybackSource(MODEL_RATE)
        self._speaker = self.source  # the playback half (`SpeakerPlayback`) plays through Discord's source
        self._names = names
        self._vad: VadBank = vad or DetectorBank(EnergyDetector)
        self._clock = clock
        self._loop = loop
        self._max_queued = max_queued_frames
        self._members: dict[int, _Member] = {}
        self._closed = asyncio.Event()
        self._room_clock = room_clock or RoomClock(self._vad, clock=clock, sleep=sleep)
        self._inbox: asyncio.Queue[RoomTick | None] | None = None
        self._taken: list[tuple[int, _Member, bytes]] = []
        self.frames_in = 0
        self.ticks = 0
        self.frames_shed = 0  # audio dropped because a member's backlog outgrew `max_queued_frames`
        self.heard: dict[int, int] = {}  # user id -> frames received

    # -- receive (event loop) --------------------------------------------------------------------

    def on_speech(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        member = self._members.get(user_id)
        if member is None:
            member = self._members[user_id] = _Member(self._vad.stream())
        if len(pcm) == FRAME_BYTES:  # decoded straight to the model's 24 kHz mono: nothing to convert
            member.queue.append(pcm)
        else:  # 48 kHz stereo: downmix, then this member's own resampler
            stereo = np.frombuffer(pcm, dtype="<i2")
            mono = ((stereo[0::2].astype(np.int32) + stereo[1::2]) // 2).astype("<i2").tobytes()
            if member.resampler is None:
                member.resampler = Resampler(DISCORD_RATE, MODEL_RATE, 1, "HQ")
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

    def collect(self) -> list[VadStream]:
        """First half of a tick: every member's oldest queued frame goes into their VAD stream; the
        streams that now wait for the model are returned (for one batched run, maybe across rooms)."""
        taken = self._taken = []
        for user_id, member in self._members.items():
            if member.queue:
                frame = member.queue.popleft()
                member.vad.push(frame)
                taken.append((user_id, member, frame))
        return [member.vad for _, member, _ in taken]

    def publish(self) -> RoomTick:
        """Second half: the tick, each frame with the probability its stream now reports."""
        taken, self._taken = self._taken, []
        if not taken:
            return RoomTick({})
        now = self._clock()
        frames = {}
        names = {}
        for user_id, member, frame in taken:
            frames[user_id] = HeardFrame(frame, member.vad.last)
            if now - member.named_at >= NAME_TTL_S:
                member.name, member.named_at = self._names(user_id), now
            if member.name:
                names[user_id] = member.name
        return RoomTick(frames, names)

    def tick(self) -> RoomTick:
        """One 20 ms tick on its own: every member's oldest queued frame, with its speech probability."""
        run_vad(self._vad, self.collect())
        return self.publish()

    async def frames(self) -> AsyncIterator[RoomTick]:
        """A `RoomTick` every 20 ms in real time until `close()`, from the room clock (the process's
        shared one when the room was given it, else one of its own)."""
        clock = self._room_clock
        self._inbox = asyncio.Queue(maxsize=MAX_QUEUED_FRAMES)
        clock.add(self)
        try:
            while not self._closed.is_set():
                tick = await self._inbox.get()
                if tick is None:
                    return
                self.ticks += 1
                yield tick
        finally:
            clock.remove(self)

    def deliver(self, tick: RoomTick) -> None:
        """The room clock's tick for this room (a call that fell behind by 500 ms sheds its oldest)."""
        inbox = self._inbox
        if inbox is None:
            return
        if inbox.full():
            inbox.get_nowait()
            self.frames_shed += 1
        inbox.put_nowait(tick)

    def turn_context(self) -> TurnContext | None:
        return None  # every tick says who is in it

    def close(self) -> None:
        self._closed.set()
        if self._inbox is not None and not self._inbox.full():
            self._inbox.put_nowait(None)

    # -- playback ----------------------------------------------------------------------------------

    def set_listener(self, listener: PlaybackListener) -> None:
        loop = self._loop or asyncio.get_event_loop()

        class _OnLoop:
            def on_playback_started(self, item_id: str) -> None:
                loop.call_soon_threadsafe(listener.on_playback_started, item_id)

            def on_playback_idle(self) -> None:
                loop.call_soon_threadsafe(listener.on_playback_idle)

        self.source.set_listener(_OnLoop())


def run_vad(vad: VadBank, streams: list[VadStream]) -> None:
    """Score every stream waiting for the model: one batched run (more if a burst left several windows)."""
    while streams and vad.run(streams):
        streams = [s for s in streams if s.pending]


class RoomClock:
    """One 20 ms tick for every room call in the process.

    Each tick, every room takes its members' frames (`collect`), ONE batched run of the shared VAD
    scores them all, and each room gets its `RoomTick` (`publish` → `deliver`). One timer and one
    model run per tick for the whole process, instead of one per call: the cost of a call is its
    members' audio, not its own clock.
    """

    def __init__(self, vad: VadBank, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.vad = vad
        self._clock = clock
        self._sleep = sleep
        self._rooms: list[RoomTransport] = []
        self._task: asyncio.Task | None = None
        self.ticks = 0
        self.late_ticks = 0  # ticks that began more than one period late

    def add(self, room: RoomTransport) -> None:
        self._rooms.append(room)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="room-clock")

    def remove(self, room: RoomTransport) -> None:
        if room in self._rooms:
            self._rooms.remove(room)

    def tick(self) -> None:
        rooms = list(self._rooms)
        streams: list[VadStream] = []
        for room in rooms:
            streams += room.collect()
        run_vad(self.vad, streams)
        for room in rooms:
            room.deliver(room.publish())

    async def _run(self) -> None:
        period = FRAME_BYTES / 2 / MODEL_RATE
        next_at = self._clock()
        while True:
            if not self._rooms:  # no await between this check and add(): a new room always gets a clock
                self._task = None
                return
            self.ticks += 1
            self.tick()
            next_at += period
            delay = next_at - self._clock()
            if delay < -period:
                self.late_ticks += 1
            if delay < -0.2:  # the loop stalled: do not burst to catch up
                next_at = self._clock()
                delay = 0.0
            await self._sleep(max(0.0, delay))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        self._rooms.clear()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
