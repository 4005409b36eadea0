"""Playback into Discord: 24 kHz mono PCM from the model in, exact 20 ms 48 kHz stereo frames out.

`feed()` runs on the event loop (resampling happens there); `read()` runs on discord.py's player
thread. In between is the same `PacedSpeaker` the terminal and file transports use, sized for
Discord's frames, so the source knows exactly how many milliseconds of each assistant item were
handed to Discord (the figure barge-in truncation needs) and tells its listener when an item starts
and when the output goes idle. Those listener calls come on the player thread: a listener on the
event loop must hand them over with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import discord
import numpy as np

from voice.audio import Resampler
from voice.call.transports.playback_queue import PacedSpeaker
from voice.media.opus import FRAME_BYTES
from voice.media.rtp import OPUS_SILENCE

MODEL_RATE = 24_000
DISCORD_RATE = 48_000
_BYTES_PER_MS = DISCORD_RATE * 2 * 2 // 1000  # 192


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


class PlaybackSource(PacedSpeaker, discord.AudioSource):
    """A thread-safe `discord.AudioSource` that never ends on its own (silence on underrun).

    It is the `PacedSpeaker` every transport plays through, sized for Discord (20 ms of 48 kHz
    stereo), whose `play` takes the model's 24 kHz mono and upsamples it on the way in."""

    def __init__(self, in_rate: int = MODEL_RATE) -> None:
        super().__init__(FRAME_BYTES, _BYTES_PER_MS)
        self._upsampler = StereoUpsampler(in_rate)
        self._carry_item: str | None = None  # item whose tail is still inside the resampler
        self._opus = False  # what the last read() returned: Opus silence, or PCM to encode

    # -- event loop side -----------------------------------------------------------------------

    def play(self, pcm: bytes, item_id: str) -> None:
        """Queue model audio (24 kHz mono s16le) belonging to assistant item `item_id`."""
        if self._carry_item is not None and self._carry_item != item_id:
            self.finish_item(self._carry_item)
        self._carry_item = item_id
        out = self._upsampler.convert(pcm)
        if out:
            super().play(out, item_id)

    def finish_item(self, item_id: str) -> None:
        """The item's audio is complete: flush the resampler tail so it plays to the end."""
        if self._carry_item is not None and self._carry_item == item_id:
            tail = self._upsampler.convert(b"", last=True)
            self._carry_item = None
            if tail:
                super().play(tail, item_id)
        super().finish_item(item_id)

    def clear(self) -> None:
        """Barge-in: drop everything not yet played, at once. The next read() is silence."""
        super().clear()
        self._upsampler.reset()
        self._carry_item = None

    @property
    def frames_read(self) -> int:
        return self.frames_pulled

    # -- player thread side ---------------------------------------------------------------------

    def read(self) -> bytes:
        frame, item_id = self.pull_frame()
        # Nothing to play: Opus's own 3-byte silence frame, which costs no encoding (discord.py asks
        # `is_opus()` after every read); encoding 20 ms of zeros 50 times a second per call costs more
        # than the call's whole receive path.
        self._opus = item_id is None
        return OPUS_SILENCE if self._opus else frame

    def is_opus(self) -> bool:
        return self._opus
