"""WAV files for `talk` file-mode tests: a 220 Hz tone where someone "speaks" (what the fake
Realtime's server VAD hears), silence elsewhere. Real speech for a trained VAD is `tests.support.speech`."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np


def write_conversation_wav(path: Path) -> None:
    """48 kHz stereo: speak 0.4 s, pause 1.4 s, speak again 0.4 s (over the answer), pause 0.8 s.

    The pause leaves room for the tool call's round trip on a loaded machine, so the long answer is
    surely playing when the user speaks again.
    """
    write_wav(path, [(0.4, True), (1.4, False), (0.4, True), (0.8, False)])


def write_wav(path: Path, parts: list[tuple[float, bool]]) -> None:
    """48 kHz stereo: (seconds, speaking) parts; speech is a 220 Hz tone the fake's VAD hears."""
    rate = 48_000

    def part(seconds: float, speaking: bool) -> np.ndarray:
        t = np.arange(int(rate * seconds)) / rate
        return 0.3 * np.sin(2 * math.pi * 220 * t) if speaking else np.zeros(len(t))

    mono = np.concatenate([part(seconds, speaking) for seconds, speaking in parts])
    stereo = np.repeat((mono * 32767).astype("<i2"), 2)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(stereo.tobytes())
