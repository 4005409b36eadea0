"""A Discord voice channel as a call transport: many speakers in, one assistant voice out.

Receive: `on_speech(user_id, ssrc, pcm)` is the `ListeningVoiceClient` sink (on the event loop,
48 kHz stereo, one 20 ms frame per call). Each speaker's frames are downmixed and resampled to the
model's 24 kHz mono by their own resampler and queued; `frames()` ticks every 20 ms and mixes the
oldest queued frame of every speaker with audio pending (scaled by 1/sqrt(n)), so overlapping speech becomes one frame
whose `turn_context()` names everyone in it. Discord clients stop sending in silence, so a speaker
with no queued frame contributes nothing; the call core's local endpointing (VAD on the mixed
frames) decides turns and unions the speakers of exactly the frames it commits.

Playback: a `voice.media.playback.PlaybackSource` that discord.py's player thread reads; its start and
idle notices are handed to the engine on the loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import numpy as np

from voice.audio import Resampler
from voice.call.actions import PlaybackPosition
from voice.call.transports.base import FRAME_BYTES, PlaybackListener, TurnContext
from voice.media.playback import PlaybackSource

DISCORD_RATE = 48_000
MODEL_RATE = 24_000
_MAX_QUEUED_FRAMES = 150  # 3 s per speaker (network bursts); a stalled loop drops the oldest, not memory
_SILENCE = bytes(FRAME_BYTES)


class _Speaker:
    __slots__ = ("resampler", "pending", "queue")

    def __init__(self) -> None:
        self.resampler = Resampler(DISCORD_RATE, MODEL_RATE, 1, "HQ")
        self.pending = bytearray()  # resampled audio short of a whole frame
        self.queue: deque[bytes] = deque(maxlen=_MAX_QUEUED_FRAMES)


class RoomTransport:
    def __init__(self, *, names: Callable[[int], str | None] = lambda _user: None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.source = PlaybackSource(MODEL_RATE)
        self._names = names
        self._clock = clock
        self._sleep = sleep
        self._loop = loop
        self._speakers: dict[int, _Speaker] = {}
        self._context: TurnContext | None = None
        self._closed = asyncio.Event()
        self._arrived = asyncio.Event()
        self.frames_in = 0
        self.frames_mixed = 0
        self.heard: dict[int, int] = {}  # user id -> frames received

    # -- receive (event loop) --------------------------------------------------------------------

    def on_speech(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        speaker = self._speakers.get(user_id)
        if speaker is None:
            speaker = self._speakers[user_id] = _Speaker()
        stereo = np.frombuffer(pcm, dtype="<i2")
        mono = ((stereo[0::2].astype(np.int32) + stereo[1::2]) // 2).astype("<i2").tobytes()
        speaker.pending += speaker.resampler.convert(mono)
        while len(speaker.pending) >= FRAME_BYTES:
            speaker.queue.append(bytes(speaker.pending[:FRAME_BYTES]))
            del speaker.pending[:FRAME_BYTES]
        self.frames_in += 1
        self.heard[user_id] = self.heard.get(user_id, 0) + 1
        self._arrived.set()

    def forget(self, user_id: int) -> None:
        """The user left the channel: drop what they had queued."""
        self._speakers.pop(user_id, None)

    def mix(self) -> tuple[bytes, frozenset[int]]:
        """One 20 ms frame: the oldest queued frame of every speaker, summed, scaled by 1/sqrt(n), clipped."""
        parts, who = [], []
        for user_id, speaker in self._speakers.items():
            if speaker.queue:
                parts.append(np.frombuffer(speaker.queue.popleft(), dtype="<i2"))
                who.append(user_id)
        if not parts:
            return _SILENCE, frozenset()
        if len(parts) == 1:
            return parts[0].tobytes(), frozenset(who)
        # Independent voices add up in power, not amplitude: scaling by 1/sqrt(n) keeps a crowd at about
        # one voice's loudness (a plain sum clips at a few speakers and the VAD then hears noise).
        total = np.sum(parts, axis=0, dtype=np.int32) / np.sqrt(len(parts))
        mixed = np.clip(total, -32768, 32767).astype("<i2")
        return mixed.tobytes(), frozenset(who)

    async def frames(self) -> AsyncIterator[bytes]:
        """20 ms frames in real time until `close()`; silence when nobody is sending."""
        period = len(_SILENCE) / 2 / MODEL_RATE
        next_at = self._clock()
        while not self._closed.is_set():
            frame, who = self.mix()
            self.frames_mixed += 1
            self._context = TurnContext(who, self._display_names(who)) if who else TurnContext()
            yield frame
            next_at += period
            delay = next_at - self._clock()
            if delay < -0.2:  # the loop stalled: do not burst to catch up
                next_at = self._clock()
                delay = 0.0
            await self._sleep(max(0.0, delay))

    def _display_names(self, who: frozenset[int]) -> Mapping[int, str]:
        names = {}
        for user_id in who:
            name = self._names(user_id)
            if name:
                names[user_id] = name
        return names

    def turn_context(self) -> TurnContext | None:
        return self._context

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

    def played_ms(self, item_id: str) -> int:
        return self.source.played_ms(item_id)

    def is_playing(self) -> bool:
        return self.source.is_playing()

    def position(self) -> PlaybackPosition:
        return self.source.position()
