"""Playback into Discord: 24 kHz mono PCM from the model in, exact 20 ms 48 kHz stereo frames out.

`feed()` runs on the event loop (resampling happens there); `read()` runs on discord.py's player
thread. They meet at one lock around a queue of per-item segments, so the source knows exactly how
many milliseconds of each assistant item were actually handed to Discord — the figure barge-in
truncation needs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

import discord
import numpy as np

from .audio import Resampler
from .opus import FRAME_BYTES

MODEL_RATE = 24_000
DISCORD_RATE = 48_000
_BYTES_PER_MS = DISCORD_RATE * 2 * 2 // 1000  # 192
_SILENCE = bytes(FRAME_BYTES)
_KEEP_ITEMS = 64


class StereoUpsampler:
    """24 kHz mono s16le -> 48 kHz stereo s16le: `voice.audio.Resampler`, then both channels."""

    def __init__(self, in_rate: int = MODEL_RATE, quality: str = "HQ") -> None:
        self._resampler = Resampler(in_rate, DISCORD_RATE, 1, quality)

    def convert(self, pcm: bytes, last: bool = False) -> bytes:
        mono = self._resampler.convert(pcm, last=last)
        if not mono:
            return b""
        return np.repeat(np.frombuffer(mono, dtype="<i2"), 2).tobytes()

    def reset(self) -> None:
        self._resampler.reset()


class PlaybackSource(discord.AudioSource):
    """A thread-safe `discord.AudioSource` that never ends on its own (silence on underrun)."""

    def __init__(self, in_rate: int = MODEL_RATE) -> None:
        self._lock = threading.Lock()
        self._upsampler = StereoUpsampler(in_rate)
        self._segments: deque[list] = deque()  # [item_id, bytearray]
        self._carry_item: str | None = None  # item whose tail is still inside the resampler
        self._played: OrderedDict[str | None, int] = OrderedDict()  # item -> bytes played
        self._closed_items: set[str | None] = set()
        self.frames_read = 0
        self.underruns = 0
        self.clears = 0

    # -- event loop side -----------------------------------------------------------------------

    def feed(self, pcm: bytes, item_id: str | None = None) -> None:
        """Queue model audio (24 kHz mono s16le) belonging to assistant item `item_id`."""
        if self._carry_item is not None and self._carry_item != item_id:
            self.finish_item(self._carry_item)
        self._carry_item = item_id
        out = self._upsampler.convert(pcm)
        if out:
            self._append(item_id, out)

    def finish_item(self, item_id: str | None = None) -> None:
        """The item's audio is complete: flush the resampler tail so it plays to the end."""
        if self._carry_item is not None and self._carry_item == item_id:
            tail = self._upsampler.convert(b"", last=True)
            self._carry_item = None
            if tail:
                self._append(item_id, tail)
        with self._lock:
            self._closed_items.add(item_id)

    def clear(self) -> None:
        """Barge-in: drop everything not yet played, at once. The next read() is silence."""
        with self._lock:
            self._segments.clear()
            self._closed_items.clear()
            self.clears += 1
        self._upsampler.reset()
        self._carry_item = None

    def played_ms(self, item_id: str | None) -> int:
        """Milliseconds of `item_id` actually handed to Discord so far."""
        with self._lock:
            return self._played.get(item_id, 0) // _BYTES_PER_MS

    def buffered_ms(self) -> int:
        with self._lock:
            return sum(len(seg[1]) for seg in self._segments) // _BYTES_PER_MS

    def is_playing(self) -> bool:
        with self._lock:
            return bool(self._segments)

    def current_item(self) -> str | None:
        with self._lock:
            return self._segments[0][0] if self._segments else None

    def _append(self, item_id: str | None, data: bytes) -> None:
        with self._lock:
            segments = self._segments
            if segments and segments[-1][0] == item_id:
                segments[-1][1] += data
            else:
                segments.append([item_id, bytearray(data)])
                self._closed_items.discard(item_id)

    # -- player thread side ---------------------------------------------------------------------

    def read(self) -> bytes:
        with self._lock:
            self.frames_read += 1
            segments = self._segments
            if not segments:
                self.underruns += 1
                return _SILENCE
            item_id, data = segments[0]
            if len(data) >= FRAME_BYTES:
                frame = bytes(data[:FRAME_BYTES])
                del data[:FRAME_BYTES]
                taken = FRAME_BYTES
            elif item_id in self._closed_items or len(segments) > 1:
                taken = len(data)
                frame = bytes(data) + bytes(FRAME_BYTES - taken)
                data.clear()
            else:  # mid-stream and short of a frame: wait for more rather than split a word
                self.underruns += 1
                return _SILENCE
            if not data:
                segments.popleft()
            self._credit(item_id, taken)
            return frame

    def _credit(self, item_id: str | None, nbytes: int) -> None:
        played = self._played
        played[item_id] = played.get(item_id, 0) + nbytes
        played.move_to_end(item_id)
        while len(played) > _KEEP_ITEMS:
            played.popitem(last=False)

    def is_opus(self) -> bool:
        return False
