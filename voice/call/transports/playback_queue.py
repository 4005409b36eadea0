"""The one playback queue: assistant audio queued per item, drained one frame at a time.

The engine queues audio on the event loop (`play`, `finish_item`, `clear`); a clock — the file
transport's paced task, the sound card's callback thread, or discord.py's player thread (through
`voice.media.playback.PlaybackSource`) — takes one frame per tick with `pull_frame()`. They meet at one
lock, so `played_ms()` is exactly what was handed to the output, the figure barge-in truncation
needs, and the listener hears when each item starts and when the output goes idle.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Self

from voice.call.actions import PlaybackPosition
from voice.call.attribution import LOCAL_SPEAKER
from voice.call.transports.base import FRAME_BYTES, RATE, PlaybackListener, TurnContext

SILENCE_FRAME = bytes(FRAME_BYTES)
_BYTES_PER_MS = RATE * 2 // 1000  # 48
LOCAL_CONTEXT = TurnContext(frozenset({LOCAL_SPEAKER}))
_KEEP_ITEMS = 64  # played-ms history; the engine only ever asks about recent items


class _Segment:
    __slots__ = ("item_id", "data", "finished")

    def __init__(self, item_id: str, data: bytes) -> None:
        self.item_id = item_id
        self.data = bytearray(data)
        self.finished = False


class PacedSpeaker:
    """Thread-safe per-item playback queue (by default 24 kHz mono s16le); never ends on its own.

    `frame_bytes` and `bytes_per_ms` set the output format: Discord's player pulls 3,840-byte
    frames of 48 kHz stereo (192 bytes per ms).

    Listener calls are made from the thread that calls `pull_frame()`, outside the lock:
    `on_playback_started(item)` on an item's first frame, `on_playback_idle()` once on the first
    pull that finds the queue empty after audio was played. After `clear()` the next pull reports
    idle as well, so every started is followed by exactly one idle.
    """

    def __init__(self, frame_bytes: int = FRAME_BYTES, bytes_per_ms: int = _BYTES_PER_MS) -> None:
        self.frame_bytes = frame_bytes
        self.bytes_per_ms = bytes_per_ms
        self._silence = bytes(frame_bytes)
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self._played: OrderedDict[str, int] = OrderedDict()  # item -> bytes handed out
        self._listener: PlaybackListener | None = None
        self._audible = False  # an item frame went out since the last idle report
        self._paused = False
        self.frames_pulled = 0
        self.underruns = 0
        self.clears = 0  # the output side compares this to drop its own buffers on barge-in

    # -- engine side (event loop) --------------------------------------------------------------

    def set_listener(self, listener: PlaybackListener | None) -> None:
        with self._lock:
            self._listener = listener

    def play(self, pcm: bytes, item_id: str) -> None:
        """Queue audio of `item_id` after everything already queued."""
        if not pcm:
            return
        with self._lock:
            last = self._segments[-1] if self._segments else None
            if last is not None and last.item_id == item_id:
                last.data += pcm
                last.finished = False
            else:
                self._segments.append(_Segment(item_id, pcm))

    def finish_item(self, item_id: str) -> None:
        """No more audio for `item_id`: its last partial frame may now play (padded with silence)."""
        with self._lock:
            for seg in self._segments:
                if seg.item_id == item_id:
                    seg.finished = True

    def clear(self) -> None:
        """Barge-in: drop everything not yet handed out; the next frame is silence (and not paused)."""
        with self._lock:
            self._segments.clear()
            self._paused = False
            self.clears += 1

    def pause(self) -> None:
        """Hold: pulls give silence and take nothing; the queue, and `played_ms`, stay where they are."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._paused = False

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._paused

    def played_ms(self, item_id: str) -> int:
        with self._lock:
            return self._played.get(item_id, 0) // self.bytes_per_ms

    def buffered_ms(self) -> int:
        with self._lock:
            return sum(len(seg.data) for seg in self._segments) // self.bytes_per_ms

    def position(self) -> PlaybackPosition:
        """Playing or not, and the item handed out last with how much of it: one consistent snapshot."""
        with self._lock:
            if not self._played:
                return PlaybackPosition(bool(self._segments))
            item_id = next(reversed(self._played))
            return PlaybackPosition(bool(self._segments), item_id, self._played[item_id] // self.bytes_per_ms)

    def is_playing(self) -> bool:
        with self._lock:
            return bool(self._segments)

    # -- output side (any thread) --------------------------------------------------------------

    def pull_frame(self) -> tuple[bytes, str | None]:
        """The next frame of output and the item it belongs to (silence and None on underrun)."""
        events: list[Callable[[], None]] = []
        with self._lock:
            self.frames_pulled += 1
            if self._paused:
                return self._silence, None
            frame, item_id, taken = self._take()
            listener = self._listener
            if item_id is not None:
                if item_id not in self._played and listener is not None:
                    events.append(partial(listener.on_playback_started, item_id))
                self._credit(item_id, taken)
                self._audible = True
            elif self._audible and not self._segments:
                self._audible = False
                if listener is not None:
                    events.append(listener.on_playback_idle)
        for event in events:
            event()
        return frame, item_id

    def _take(self) -> tuple[bytes, str | None, int]:
        """(frame, item, bytes of real audio in it); the caller holds the lock."""
        segments = self._segments
        size = self.frame_bytes
        if not segments:
            self.underruns += 1
            return self._silence, None, 0
        seg = segments[0]
        if len(seg.data) >= size:
            frame = bytes(seg.data[:size])
            del seg.data[:size]
            taken = size
        elif seg.finished or len(segments) > 1:
            taken = len(seg.data)
            frame = bytes(seg.data) + bytes(size - taken)
            seg.data.clear()
        else:  # mid-item and short of a frame: wait for more rather than split a word
            self.underruns += 1
            return self._silence, None, 0
        if not seg.data:
            segments.popleft()
        return frame, seg.item_id, taken

    def _credit(self, item_id: str, nbytes: int) -> None:
        played = self._played
        played[item_id] = played.get(item_id, 0) + nbytes
        played.move_to_end(item_id)
        while len(played) > _KEEP_ITEMS:
            played.popitem(last=False)


class SpeakerPlayback:
    """CallTransport's playback half, delegated to a `PacedSpeaker` in `self._speaker` (the terminal's,
    the file's, or Discord's `PlaybackSource`)."""

    _speaker: PacedSpeaker

    def play(self, pcm: bytes, item_id: str) -> None:
        self._speaker.play(pcm, item_id)

    def finish_item(self, item_id: str) -> None:
        self._speaker.finish_item(item_id)

    def clear(self) -> None:
        self._speaker.clear()

    def pause(self) -> None:
        self._speaker.pause()

    def resume(self) -> None:
        self._speaker.resume()

    def played_ms(self, item_id: str) -> int:
        return self._speaker.played_ms(item_id)

    def is_playing(self) -> bool:
        return self._speaker.is_playing()

    def position(self) -> PlaybackPosition:
        return self._speaker.position()


class LocalPlayback(SpeakerPlayback):
    """A local transport (terminal, file): one speaker at the keyboard, started and closed by `async with`."""

    def turn_context(self) -> TurnContext:
        return LOCAL_CONTEXT  # one local speaker, always the same person

    def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
