"""A call through this computer's microphone and speaker (PortAudio via `sounddevice`).

PortAudio runs both stream callbacks on its own threads. The input callback resamples to 24 kHz,
re-chunks into 20 ms frames, passes them through the echo gate and hops to the event loop; the
output callback pulls frames from a PacedSpeaker, so the sound card is the playback clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

from voice.audio import FrameChunker, Resampler, rms_dbfs
from voice.call.transports.base import FRAME_BYTES, FRAME_MS, RATE, PlaybackListener
from voice.call.transports.playback_queue import LocalPlayback, PacedSpeaker

INSTALL_HINT = (
    "install it with `pip install 'switchboard[audio]'` "
    "(on Debian/Ubuntu the PortAudio library too: `apt-get install -y libportaudio2`)"
)


class TerminalAudioUnavailable(RuntimeError):
    """No usable sounddevice/PortAudio or audio device; the message says what to install or check."""


def load_sounddevice() -> ModuleType:
    """Import `sounddevice`, turning a missing package or PortAudio library into a clear error."""
    try:
        import sounddevice
    except ImportError:
        raise TerminalAudioUnavailable(f"terminal audio needs the `sounddevice` package: {INSTALL_HINT}") from None
    except OSError as exc:  # sounddevice raises this when libportaudio is absent
        raise TerminalAudioUnavailable(f"PortAudio is missing ({exc}): {INSTALL_HINT}") from None
    return sounddevice


class EchoGate:
    """An energy rule that keeps the assistant from barging in on itself through open speakers.

    While assistant audio was played within the last `hangover_ms` (which also covers the
    speaker-to-mic delay), the expected echo is the loudest assistant frame of that window plus
    `coupling_db` (the acoustic loss from speaker to mic, negative). A mic frame passes only if it is
    at least `margin_db` louder than that; otherwise it is replaced by silence — not dropped, the
    provider's VAD needs a continuous stream. Outside the window every frame passes unchanged.
    Thread-safe: playback and capture are noted from different PortAudio threads.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        hangover_ms: int = 200,
        coupling_db: float = -20.0,
        margin_db: float = 12.0,
    ) -> None:
        self._clock = clock
        self._window = hangover_ms / 1000
        self.coupling_db = coupling_db
        self.margin_db = margin_db
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, float]] = deque()  # (time, dBFS) of assistant frames
        self.suppressed = 0
        self.passed_over_echo = 0  # frames loud enough to get through while the assistant spoke

    def note_playback(self, frame: bytes | None) -> None:
        """An assistant frame went to the speaker now (None or silence frames need not be noted)."""
        if frame is None:
            return
        level = rms_dbfs(frame)
        now = self._clock()
        with self._lock:
            self._recent.append((now, level))
            self._prune(now)

    def threshold_dbfs(self) -> float | None:
        """The level a mic frame must reach right now to pass, or None when the gate is open."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            if not self._recent:
                return None
            return max(level for _, level in self._recent) + self.coupling_db + self.margin_db

    def filter(self, frame: bytes) -> bytes:
        """The mic frame itself, or silence of the same length if it is probably echo."""
        threshold = self.threshold_dbfs()
        if threshold is None:
            return frame
        if rms_dbfs(frame) >= threshold:
            self.passed_over_echo += 1
            return frame
        self.suppressed += 1
        return bytes(len(frame))

    def _prune(self, now: float) -> None:
        recent = self._recent
        while recent and now - recent[0][0] > self._window:
            recent.popleft()


class _LoopHop:
    """Delivers PacedSpeaker listener calls (made on the PortAudio thread) on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, listener: PlaybackListener) -> None:
        self._loop = loop
        self._listener = listener

    def on_playback_started(self, item_id: str) -> None:
        self._post(self._listener.on_playback_started, item_id)

    def on_playback_idle(self) -> None:
        self._post(self._listener.on_playback_idle)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed while a callback was in flight at shutdown
            pass


class TerminalTransport(LocalPlayback):
    """CallTransport over the default (or given) microphone and speaker.

    Construction only imports sounddevice (TerminalAudioUnavailable if it cannot); `start()` opens
    the devices — at 24 kHz when they support it, else at their native rate with soxr in between.
    If the loop falls behind, the oldest mic frames are dropped (counted in `dropped_frames`).
    """

    def __init__(
        self,
        *,
        input_device: int | str | None = None,
        output_device: int | str | None = None,
        echo_gate: bool = True,
        sd_module: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_queued_frames: int = 50,
    ) -> None:
        self._sd = sd_module if sd_module is not None else load_sounddevice()
        self.input_device = input_device
        self.output_device = output_device
        self.echo_gate: EchoGate | None = EchoGate(clock=clock) if echo_gate else None
        self._speaker = PacedSpeaker()
        self._listener: PlaybackListener | None = None
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._max_queued = max_queued_frames
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: list[Any] = []
        self._input_closed = False
        self.input_rate = RATE
        self.output_rate = RATE
        self.dropped_frames = 0
        self.xruns = 0  # PortAudio status flags seen (input overflow, output underflow, ...)
        # owned by the input callback thread
        self._in_resampler = Resampler(RATE, RATE)
        self._in_chunker = FrameChunker(FRAME_BYTES)
        # owned by the output callback thread
        self._out_resampler = Resampler(RATE, RATE)
        self._out_buf = bytearray()
        self._out_clears = 0

    @property
    def speaker(self) -> PacedSpeaker:
        return self._speaker

    @staticmethod
    def headphones_hint() -> str:
        """One line for the user before the call starts."""
        return (
            "Tip: use headphones — on open speakers the assistant can hear itself, and the echo gate "
            "mutes you while it talks unless you speak up."
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Open and start both streams (needs a running loop); idempotent."""
        if self._streams:
            return
        self._loop = asyncio.get_running_loop()
        if self._listener is not None:
            self._speaker.set_listener(_LoopHop(self._loop, self._listener))
        sd = self._sd
        self.input_rate = self._pick_rate(self.input_device, "input")
        self.output_rate = self._pick_rate(self.output_device, "output")
        self._in_resampler = Resampler(self.input_rate, RATE)
        self._out_resampler = Resampler(RATE, self.output_rate)
        opening = (
            (sd.RawInputStream, self.input_rate, self.input_device, self._on_input),
            (sd.RawOutputStream, self.output_rate, self.output_device, self._on_output),
        )
        try:
            for open_stream, rate, device, callback in opening:
                stream = open_stream(
                    samplerate=rate,
                    blocksize=rate * FRAME_MS // 1000,
                    device=device,
                    channels=1,
                    dtype="int16",
                    latency="low",
                    callback=callback,
                )
                self._streams.append(stream)  # before start(), so a failure below still closes it
                stream.start()
        except (sd.PortAudioError, ValueError) as exc:  # no such device, or it refused the format
            self._close_streams()
            raise TerminalAudioUnavailable(
                f"cannot open the audio device ({exc}); list devices with `python -m sounddevice`"
            ) from None

    async def aclose(self) -> None:
        """Stop the streams and end `frames()`; idempotent."""
        self._close_streams()
        self.close_input()

    def close_input(self) -> None:
        """End `frames()` after the frames already queued."""
        if not self._input_closed:
            self._input_closed = True
            self._enqueue(None)

    def _pick_rate(self, device: int | str | None, kind: str) -> int:
        sd = self._sd
        check = sd.check_input_settings if kind == "input" else sd.check_output_settings
        try:
            check(device=device, channels=1, dtype="int16", samplerate=RATE)
            return RATE
        except Exception:  # PortAudioError or ValueError: 24 kHz is not offered, use the native rate
            pass
        try:
            info = sd.query_devices(device, kind)
        except Exception as exc:
            raise TerminalAudioUnavailable(
                f"no usable {kind} device ({exc}); list devices with `python -m sounddevice`"
            ) from None
        return int(info["default_samplerate"])

    def _close_streams(self) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            try:
                stream.stop()
            finally:
                stream.close()

    # -- capture -------------------------------------------------------------------------------

    async def frames(self) -> AsyncIterator[bytes]:
        """Mic audio, 24 kHz mono 20 ms frames, echo-gated; ends after close_input()/aclose()."""
        while True:
            frame = await self._queue.get()
            if frame is None:
                return
            yield frame

    def _on_input(self, indata: Any, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio input thread: resample, frame, gate, hop to the loop."""
        if status:
            self.xruns += 1
        loop = self._loop
        if loop is None or self._input_closed:
            return
        for frame in self._in_chunker.push(self._in_resampler.convert(bytes(indata))):
            if self.echo_gate is not None:
                frame = self.echo_gate.filter(frame)
            try:
                loop.call_soon_threadsafe(self._enqueue, frame)
            except RuntimeError:  # loop closed during shutdown
                return

    def _enqueue(self, frame: bytes | None) -> None:
        """On the loop: queue a frame, dropping the oldest if the engine has fallen behind."""
        if frame is None:  # the end marker never costs an audio frame
            self._queue.put_nowait(None)
            return
        if self._input_closed:
            return
        while self._queue.qsize() >= self._max_queued:
            self._queue.get_nowait()
            self.dropped_frames += 1
        self._queue.put_nowait(frame)

    # -- playback ------------------------------------------------------------------------------

    def _on_output(self, outdata: Any, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio output thread: fill `frames` samples from the speaker, resampled if needed."""
        if status:
            self.xruns += 1
        if self._speaker.clears != self._out_clears:  # barge-in: drop what the resampler holds too
            self._out_clears = self._speaker.clears
            self._out_buf.clear()
            self._out_resampler.reset()
        need = frames * 2
        buf = self._out_buf
        while len(buf) < need:
            frame, item_id = self._speaker.pull_frame()
            if self.echo_gate is not None and item_id is not None:
                self.echo_gate.note_playback(frame)
            buf += self._out_resampler.convert(frame)
        outdata[:need] = bytes(buf[:need])
        del buf[:need]

    def set_listener(self, listener: PlaybackListener) -> None:
        self._listener = listener
        if self._loop is not None:
            self._speaker.set_listener(_LoopHop(self._loop, listener))


