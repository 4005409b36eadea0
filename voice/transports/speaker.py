"""The playback half of the local transports: a queue of assistant audio, drained 20 ms at a time.

The engine queues audio on the event loop (`play`, `finish_item`, `clear`); a clock — the file
transport's paced task or the sound card's callback thread — takes one frame per tick with
`pull_frame()`. They meet at one lock, so `played_ms()` is exactly what was handed to the output,
the figure barge-in truncation needs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Self

from .base import FRAME_BYTES, RATE, PlaybackListener

SILENCE_FRAME = bytes(FRAME_BYTES)
_BYTES_PER_MS = RATE * 2 // 1000  # 48
_KEEP_ITEMS = 64  # played-ms history; the engine only ever asks about recent items


class _Segment:
    __slots__ = ("item_id", "data", "finished")

    def __init__(self, item_id: str, data: bytes) -> None:
        self.item_id = item_id
        self.data = bytearray(data)
        self.finished = False


class PacedSpeaker:
    """Thread-safe per-item playback queue of 24 kHz mono s16le; never ends on its own.

    Listener calls are made from the thread that calls `pull_frame()`, outside the lock:
    `on_playback_started(item)` on an item's first frame, `on_playback_idle()` once on the first
    pull that finds the queue empty after audio was played. After `clear()` the next pull reports
    idle as well, so every started is followed by exactly one idle.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self._played: OrderedDict[str, int] = OrderedDict()  # item -> bytes handed out
        self._listener: PlaybackListener | None = None
        self._audible = False  # an item frame went out since the last idle report
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
        """Barge-in: drop everything not yet handed out; the next frame is silence."""
        with self._lock:
            self._segments.clear()
            self.clears += 1

    def played_ms(self, item_id: str) -> int:
        with self._lock:
            return self._played.get(item_id, 0) // _BYTES_PER_MS

    def buffered_ms(self) -> int:
        with self._lock:
            return sum(len(seg.data) for seg in self._segments) // _BYTES_PER_MS

    def is_playing(self) -> bool:
        with self._lock:
            return bool(self._segments)

    # -- output side (any thread) --------------------------------------------------------------

    def pull_frame(self) -> tuple[bytes, str | None]:
        """The next FRAME_BYTES of output and the item it belongs to (silence and None on underrun)."""
        events: list[Callable[[], None]] = []
        with self._lock:
            self.frames_pulled += 1
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
        if not segments:
            self.underruns += 1
            return SILENCE_FRAME, None, 0
        seg = segments[0]
        if len(seg.data) >= FRAME_BYTES:
            frame = bytes(seg.data[:FRAME_BYTES])
            del seg.data[:FRAME_BYTES]
            taken = FRAME_BYTES
        elif seg.finished or len(segments) > 1:
            taken = len(seg.data)
            frame = bytes(seg.data) + bytes(FRAME_BYTES - taken)
            seg.data.clear()
        else:  # mid-item and short of a frame: wait for more rather than split a word
            self.underruns += 1
            return SILENCE_FRAME, None, 0
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
    """CallTransport's playback half, delegated to a `PacedSpeaker` in `self._speaker`."""

    _speaker: PacedSpeaker

    def play(self, pcm: bytes, item_id: str) -> None:
        self._speaker.play(pcm, item_id)

    def finish_item(self, item_id: str) -> None:
        self._speaker.finish_item(item_id)

    def clear(self) -> None:
        self._speaker.clear()

    def played_ms(self, item_id: str) -> int:
        return self._speaker.played_ms(item_id)

    def is_playing(self) -> bool:
        return self._speaker.is_playing()

    def turn_context(self) -> None:
        return None  # one local speaker: no per-turn speaker context

    def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
