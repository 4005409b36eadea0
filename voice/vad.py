"""Local endpointing: an energy VAD with hysteresis over 20 ms frames of 24 kHz mono audio."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class VadConfig:
    threshold_dbfs: float = -45.0
    start_ms: int = 60  # this much voiced audio starts a turn (ignores clicks)
    silence_ms: int = 500  # this much quiet ends it
    prefix_ms: int = 300  # audio kept from before the start, so first syllables survive


class EnergyVad:
    """Feed frames with `push`; it returns 'start', 'end' or None. Pure, frame-counted."""

    def __init__(self, config: VadConfig = VadConfig(), frame_ms: int = 20) -> None:
        self.config = config
        self.frame_ms = frame_ms
        self.speaking = False
        self._voiced_run = 0
        self._quiet_run = 0
        self._threshold = 32768.0 * 10 ** (config.threshold_dbfs / 20)

    def push(self, frame: bytes) -> str | None:
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
        loud = bool(samples.size) and float(np.sqrt(np.mean(samples * samples))) >= self._threshold
        if not self.speaking:
            self._voiced_run = self._voiced_run + self.frame_ms if loud else 0
            if self._voiced_run >= self.config.start_ms:
                self.speaking, self._quiet_run = True, 0
                return "start"
            return None
        self._quiet_run = 0 if loud else self._quiet_run + self.frame_ms
        if self._quiet_run >= self.config.silence_ms:
            self.speaking, self._voiced_run = False, 0
            return "end"
        return None


class LocalEndpointer(Generic[T]):
    """Local endpointing: which frames belong to a turn, and when it starts and ends.

    `push(frame, tag)` returns (decision, [(frame, tag), ...] to append): nothing while quiet (the
    last `prefix_ms` are kept back), the kept-back prefix plus the frame at the start, every frame
    during speech including the closing silence. So a committed buffer holds one turn of speech and
    nothing else, and each frame keeps the tag it came with (the call core tags frames with who
    spoke them, so a turn is attributed to exactly the audio it holds).
    """

    def __init__(self, config: VadConfig = VadConfig(), frame_ms: int = 20) -> None:
        self.vad = EnergyVad(config, frame_ms)
        self._prefix: deque[tuple[bytes, T | None]] = deque(maxlen=max(1, config.prefix_ms // frame_ms))

    def push(self, frame: bytes, tag: T | None = None) -> tuple[str | None, list[tuple[bytes, T | None]]]:
        decision = self.vad.push(frame)
        if decision == "start":
            frames = [*self._prefix, (frame, tag)]
            self._prefix.clear()
            return decision, frames
        if self.vad.speaking or decision == "end":
            return decision, [(frame, tag)]
        self._prefix.append((frame, tag))
        return decision, []
