"""Local endpointing's pieces: speech detectors and the hysteresis over their per-frame probability
(20 ms frames of 24 kHz mono). `voice.call.speakers` runs one hysteresis per member of a room; a
`VadBank` scores many streams at once (`voice.call.silero_batch.SileroBank` batches them).

Sans-I/O. The detector is injected: `EnergyDetector` (loudness only, no model, the fallback) lives
here; `voice.call.silero_vad.SileroDetector` (a trained model, which loads a file) lives in its own
module and is built by the shell, so importing the call core never loads a model runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class VadConfig:
    threshold_dbfs: float = -45.0  # the energy detector: this loud counts as speech
    start_ms: int = 60  # this much voiced audio starts a turn (ignores clicks)
    silence_ms: int = 500  # this much quiet ends it
    prefix_ms: int = 300  # audio kept from before the start, so first syllables survive
    speech_threshold: float = 0.5  # a frame is voiced at this speech probability ...
    release_threshold: float = 0.35  # ... and, once a turn has started, quiet only below this one


class SpeechDetector(Protocol):
    """How likely one frame is speech: 20 ms of 24 kHz mono s16le in, a probability in [0, 1] out.

    Stateful (a model may look at more than one frame, or buffer to its own window): one per call.
    """

    name: str

    def probability(self, frame: bytes) -> float: ...


class EnergyDetector:
    """Loudness as speech: 1.0 when the frame's RMS reaches `threshold_dbfs`, else 0.0.

    Cheap, and fooled by anything loud — a fan, a keyboard, music. The fallback when no model loads.
    """

    name = "energy"

    def __init__(self, threshold_dbfs: float = VadConfig.threshold_dbfs) -> None:
        self.threshold_dbfs = threshold_dbfs
        self._threshold = 32768.0 * 10 ** (threshold_dbfs / 20)

    def probability(self, frame: bytes) -> float:
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
        if not samples.size:
            return 0.0
        return 1.0 if float(np.sqrt(np.dot(samples, samples) / samples.size)) >= self._threshold else 0.0


class SpeechVad:
    """Feed frames with `push`; it returns 'start', 'end' or None. Pure, frame-counted.

    A turn starts after `start_ms` of consecutive voiced frames (probability >= speech_threshold)
    and ends after `silence_ms` of consecutive quiet ones (probability < release_threshold).
    """

    def __init__(self, config: VadConfig = VadConfig(), frame_ms: int = 20,
                 detector: SpeechDetector | None = None) -> None:
        self.config = config
        self.frame_ms = frame_ms
        self.detector: SpeechDetector = detector or EnergyDetector(config.threshold_dbfs)
        self.speaking = False
        self.last_probability = 0.0
        self._voiced_run = 0
        self._quiet_run = 0

    def push(self, frame: bytes) -> str | None:
        return self.push_probability(self.detector.probability(frame))

    def push_probability(self, p: float) -> str | None:
        """The same decision for a frame whose probability was computed elsewhere (a batched VAD)."""
        self.last_probability = p
        if not self.speaking:
            self._voiced_run = self._voiced_run + self.frame_ms if p >= self.config.speech_threshold else 0
            if self._voiced_run >= self.config.start_ms:
                self.speaking, self._quiet_run = True, 0
                return "start"
            return None
        self._quiet_run = 0 if p >= self.config.release_threshold else self._quiet_run + self.frame_ms
        if self._quiet_run >= self.config.silence_ms:
            self.speaking, self._voiced_run = False, 0
            return "end"
        return None


class EnergyVad(SpeechVad):
    """`SpeechVad` over loudness alone (`EnergyDetector` at `config.threshold_dbfs`)."""

    def __init__(self, config: VadConfig = VadConfig(), frame_ms: int = 20) -> None:
        super().__init__(config, frame_ms, EnergyDetector(config.threshold_dbfs))


class VadStream(Protocol):
    """One speaker's speech detector state inside a `VadBank`: frames in, a probability out after `run`."""

    last: float

    @property
    def pending(self) -> bool: ...

    def push(self, frame: bytes) -> bool: ...

    def reset(self) -> None: ...


class VadBank(Protocol):
    """Speech detection for many streams at once (every member of every call): `push` each stream's
    frame, then one `run` scores every stream with a window waiting — batched where the model allows."""

    name: str

    def stream(self) -> VadStream: ...

    def run(self, streams: Iterable[VadStream]) -> int: ...


class _DetectorStream:
    __slots__ = ("detector", "last", "_frame")

    def __init__(self, detector: SpeechDetector) -> None:
        self.detector = detector
        self.last = 0.0
        self._frame: bytes | None = None

    @property
    def pending(self) -> bool:
        return self._frame is not None

    def push(self, frame: bytes) -> bool:
        self._frame = frame
        return True

    def reset(self) -> None:
        self._frame = None
        self.last = 0.0


class DetectorBank:
    """A `VadBank` of per-frame detectors, one per stream, scored one by one (no batching): the
    loudness fallback, and any `SpeechDetector` a test injects."""

    def __init__(self, make: Callable[[], SpeechDetector]) -> None:
        self._make = make
        self.name = make().name

    def stream(self) -> _DetectorStream:
        return _DetectorStream(self._make())

    def run(self, streams: Iterable[VadStream]) -> int:
        ran = 0
        for stream in streams:
            if isinstance(stream, _DetectorStream) and stream._frame is not None:
                stream.last = stream.detector.probability(stream._frame)
                stream._frame = None
                ran += 1
        return ran
