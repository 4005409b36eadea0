"""A call from a WAV file into a WAV file: IN.wav plays the user, OUT.wav records the assistant.

Both directions run on the event loop on an absolute 20 ms schedule taken from an injectable clock,
so a scripted call behaves like a live one (the provider's server VAD sees real-time audio and a
silent tail) and tests can run it in virtual time. IN.wav is streamed — read, converted and paced a
block at a time — so memory does not grow with its length.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np

from voice.audio import AudioFileError, FrameChunker, MonoConverter, WavReader, WavWriter
from voice.call.transports.base import FRAME_BYTES, FRAME_MS, RATE, PlaybackListener
from voice.call.transports.playback_queue import SILENCE_FRAME, LocalPlayback, PacedSpeaker

FRAME_S = FRAME_MS / 1000
_READ_FRAMES = 4800  # sample frames of IN.wav read per block: 100 ms at 48 kHz
SILENT_PEAK = 33  # -60 dBFS in 16-bit samples: an input that never gets louder holds no speech
SleepFn = Callable[[float], Awaitable[object]]


class FileTransport(LocalPlayback):
    """CallTransport over files. IN.wav's header is validated by the constructor (AudioFileError,
    also when it holds no audio); its audio is read while `frames()` runs.

    `frames()` yields the input as 24 kHz mono 20 ms frames — paced unless `realtime=False` — then,
    with `tail_silence`, silence until `close_input()`; the last partial frame is padded. `start()`
    begins paced playback: every 20 ms one frame leaves the speaker, and frames that belong to an
    assistant item (not underrun silence) are appended to OUT.wav, each padded to a whole frame.
    `aclose()` stops both directions and finalises OUT.wav (created, possibly empty, in any case);
    `discard_empty_output()` then removes an OUT.wav that holds no audio (a call that failed).
    """

    def __init__(
        self,
        input_wav: Path,
        output_wav: Path,
        *,
        realtime: bool = True,
        tail_silence: bool = True,
        sleep: SleepFn = asyncio.sleep,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.input_path = Path(input_wav)
        with WavReader(self.input_path) as reader:
            self._format = reader.format
        if self._format.frames == 0:
            raise AudioFileError(f"{self.input_path}: holds no audio (0 samples); record or pick a file "
                                 "with speech in it")
        self.output_path = Path(output_wav)
        self.realtime = realtime
        self.tail_silence = tail_silence
        self._sleep = sleep
        self._clock = clock  # None: the running loop's clock, looked up when first needed
        self._speaker = PacedSpeaker()
        self._writer: WavWriter | None = None
        self._playback: asyncio.Task[None] | None = None
        self._input_closed = False
        self._input_peak: int | None = None  # the loudest input sample, once the whole WAV has been read
        self.input_done = asyncio.Event()  # set once the WAV has been yielded (or input was closed)

    @property
    def input_ms(self) -> int:
        return self._format.duration_ms

    @property
    def input_warning(self) -> str | None:
        """One line when IN.wav is cut short (its header promises more audio than the file holds)."""
        fmt = self._format
        if not fmt.cut_short:
            return None
        return (f"{self.input_path} is cut short: its header says {(fmt.claimed_frames or 0) / fmt.rate:.1f} s of "
                f"audio, the file holds {fmt.frames / fmt.rate:.2f} s; using what is there")

    @property
    def input_silent(self) -> bool:
        """True once the whole of IN.wav has been read and no sample of it rose above -60 dBFS."""
        return self._input_peak is not None and self._input_peak <= SILENT_PEAK

    @property
    def output_ms(self) -> int:
        """Milliseconds of assistant audio written to OUT.wav so far."""
        return self._writer.duration_ms if self._writer is not None else 0

    @property
    def speaker(self) -> PacedSpeaker:
        return self._speaker

    # -- input ---------------------------------------------------------------------------------

    async def frames(self) -> AsyncIterator[bytes]:
        """The user's audio, then (with tail_silence) silence, until the WAV ends or close_input()."""
        clock = self._now()
        start = clock()
        index = 0
        try:
            with contextlib.closing(self._input_frames()) as input_frames:  # closes IN.wav on early exit
                for frame in input_frames:
                    if not await self._wait_for_frame(clock, start, index):
                        return
                    yield frame
                    index += 1
            self.input_done.set()
            # a provider with server VAD only ends the last turn after hearing silence in real time
            while self.tail_silence and await self._wait_for_frame(clock, start, index):
                yield SILENCE_FRAME
                index += 1
        finally:
            self.input_done.set()

    def _input_frames(self) -> Iterator[bytes]:
        """IN.wav as 24 kHz mono frames, read and converted a block at a time; the last one padded."""
        chunker = FrameChunker(FRAME_BYTES)
        converter = MonoConverter(self._format.rate)
        peak = 0
        with WavReader(self.input_path) as reader:
            for block in reader.blocks(_READ_FRAMES):
                if len(block):  # as read: resampling must not hide (or invent) a sound
                    peak = max(peak, int(np.abs(block.astype(np.int32)).max()))
                yield from chunker.push(converter.convert(block))
        self._input_peak = peak
        yield from chunker.push(converter.convert(np.zeros(0, np.int16), last=True))
        tail = chunker.flush()
        if tail is not None:
            yield tail

    def close_input(self) -> None:
        """End `frames()` at its next frame (the engine is done listening)."""
        self._input_closed = True

    async def _wait_for_frame(self, clock: Callable[[], float], start: float, index: int) -> bool:
        """Wait until frame `index` has been 'captured'; False once the input is closed."""
        if self._input_closed:
            return False
        if self.realtime:  # absolute schedule: late wake-ups do not accumulate as drift
            await self._sleep(max(0.0, start + (index + 1) * FRAME_S - clock()))
        else:
            await self._sleep(0)  # still yield to the loop, so close_input() can happen
        return not self._input_closed

    # -- output --------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin paced playback into OUT.wav (needs a running loop); idempotent."""
        if self._playback is None:
            self._ensure_writer()
            self._playback = asyncio.get_running_loop().create_task(self._play_out())

    def tick(self, frames: int = 1) -> None:
        """Play `frames` frames now — what the paced task does every 20 ms; for offline rendering."""
        writer = self._ensure_writer()
        for _ in range(frames):
            frame, item_id = self._speaker.pull_frame()
            if item_id is not None:
                writer.write(frame)

    async def _play_out(self) -> None:
        clock = self._now()
        start = clock()
        index = 0
        while True:
            index += 1
            await self._sleep(max(0.0, start + index * FRAME_S - clock()))
            self.tick()

    async def aclose(self) -> None:
        """Stop input and playback and finalise OUT.wav; idempotent. Re-raises a playback failure."""
        self.close_input()
        task, self._playback = self._playback, None
        try:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            self._ensure_writer().close()

    def discard_empty_output(self) -> bool:
        """After `aclose()`: remove OUT.wav if it holds no assistant audio. True if it was removed."""
        if self._writer is None or not self._writer.closed or self._writer.frames_written:
            return False
        if not self.output_path.is_file() or self.output_path.is_symlink():
            return False  # never remove /dev/null, a FIFO or what a symlink points at
        self.output_path.unlink(missing_ok=True)
        return True

    def _ensure_writer(self) -> WavWriter:
        if self._writer is None:
            self._writer = WavWriter(self.output_path, RATE, 1)
        return self._writer

    def _now(self) -> Callable[[], float]:
        return self._clock if self._clock is not None else asyncio.get_running_loop().time

    # -- CallTransport playback ----------------------------------------------------------------

    def set_listener(self, listener: PlaybackListener) -> None:
        self._speaker.set_listener(listener)

