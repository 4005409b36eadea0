"""A CallTransport for engine tests: the test pushes user frames and advances a virtual speaker."""

from __future__ import annotations

import asyncio
from collections import deque

from voice.call.actions import PlaybackPosition
from voice.call.transports.base import FRAME_BYTES, RoomTick, TurnContext

BYTES_PER_MS = 48  # 24 kHz mono s16le


class VirtualTransport:
    def __init__(self, *, autoplay: bool = True) -> None:
        self.autoplay = autoplay
        self._frames: asyncio.Queue[bytes | RoomTick | None] = asyncio.Queue()
        self._segments: deque[list] = deque()
        self._played: dict[str, int] = {}
        self.heard: dict[str, bytearray] = {}  # item -> audio actually played
        self.received: dict[str, int] = {}  # item -> bytes handed to play()
        self.finished: list[str] = []
        self.clears = 0
        self.paused = False
        self.pauses = 0
        self.listener = None
        self.context: TurnContext | None = None
        self.play_log: list[str] = []  # item ids in the order play() was called
        self._last_item: str | None = None

    # -- test side ---------------------------------------------------------------------------

    def push(self, pcm: bytes) -> None:
        for i in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES):
            self._frames.put_nowait(pcm[i : i + FRAME_BYTES])

    def push_tick(self, tick: RoomTick) -> None:
        """One 20 ms tick of a room (each member's own frame and VAD probability)."""
        self._frames.put_nowait(tick)

    def end_input(self) -> None:
        self._frames.put_nowait(None)

    def advance(self, ms: int) -> None:
        """Play `ms` milliseconds of whatever is queued."""
        want = ms * BYTES_PER_MS
        while want and self._segments and not self.paused:
            item, data = self._segments[0]
            if self._played.get(item, 0) == 0 and self.listener is not None:
                self.listener.on_playback_started(item)
            take = min(want, len(data))
            self.heard.setdefault(item, bytearray()).extend(data[:take])
            del data[:take]
            self._played[item] = self._played.get(item, 0) + take
            self._last_item = item
            want -= take
            if not data:
                self._segments.popleft()
                if not self._segments and self.listener is not None:
                    self.listener.on_playback_idle()

    # -- CallTransport -----------------------------------------------------------------------

    async def frames(self):
        while True:
            frame = await self._frames.get()
            if frame is None:
                return
            yield frame

    def play(self, pcm: bytes, item_id: str) -> None:
        self.play_log.append(item_id)
        self.received[item_id] = self.received.get(item_id, 0) + len(pcm)
        if self._segments and self._segments[-1][0] == item_id:
            self._segments[-1][1].extend(pcm)
        else:
            self._segments.append([item_id, bytearray(pcm)])
        if self.autoplay:
            self.advance(len(pcm) // BYTES_PER_MS + 1)

    def finish_item(self, item_id: str) -> None:
        self.finished.append(item_id)

    def clear(self) -> None:
        self._segments.clear()
        self.paused = False
        self.clears += 1

    def pause(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume(self) -> None:
        self.paused = False

    def played_ms(self, item_id: str) -> int:
        return self._played.get(item_id, 0) // BYTES_PER_MS

    def is_playing(self) -> bool:
        return bool(self._segments)

    def position(self) -> PlaybackPosition:
        item = self._last_item
        return PlaybackPosition(bool(self._segments), item, self.played_ms(item) if item else 0)

    def set_listener(self, listener) -> None:
        self.listener = listener

    def turn_context(self) -> TurnContext | None:
        return self.context
