"""Audio plumbing shared by the transports: format conversion, WAV files, levels, framing.

Everything speaks s16le PCM. The model's format is 24 kHz mono; these helpers get other audio
into it (and out to files) without aliasing or drift.
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
import soxr

MODEL_RATE = 24_000
SILENCE_DBFS = -120.0  # what rms_dbfs() reports for digital silence, so comparisons never see -inf

_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_FLOAT = 0x0003
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_SIZE_UNKNOWN = (0, 0xFFFFFFFF)  # a data size a writer leaves when it cannot rewind (a pipe) or never finished
_CONVERT_HINT = "convert it with `ffmpeg -i IN -ac 1 -c:a pcm_s16le OUT.wav`"


class AudioFileError(ValueError):
    """A WAV file is missing, unreadable, corrupt or not PCM; the message names the file and a fix."""


# -- conversion ------------------------------------------------------------------------------------


def downmix(samples: np.ndarray) -> np.ndarray:
    """int16 (n,) or (n, ch) -> float32 (n,) mono, the mean of the channels (no clipping possible)."""
    if samples.ndim == 1:
        return samples.astype(np.float32)
    if samples.ndim != 2:
        raise ValueError(f"samples must have shape (n,) or (n, channels), not {samples.shape}")
    return samples.astype(np.float32).mean(axis=1, dtype=np.float32)


def to_mono_24k(samples: np.ndarray, rate: int) -> bytes:
    """Whole-buffer conversion to the model format: downmix first (half the work), then HQ soxr."""
    return MonoConverter(rate).convert(samples, last=True)


class MonoConverter:
    """Streaming `to_mono_24k`: int16 (n,) or (n, ch) blocks of any size in, 24 kHz mono s16le out.

    The concatenated output is identical to converting the whole buffer at once. `last=True`
    flushes the resampler's tail; the converter is then finished.
    """

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._stream = (
            None if rate == MODEL_RATE else soxr.ResampleStream(rate, MODEL_RATE, 1, dtype="float32", quality="HQ")
        )

    def convert(self, samples: np.ndarray, last: bool = False) -> bytes:
        mono = downmix(samples)
        if self._stream is not None:
            mono = self._stream.resample_chunk(mono, last=last)
        return _float_to_s16(mono)


def _float_to_s16(x: np.ndarray) -> bytes:
    # clip before the cast: soxr overshoots full-scale input, and int16 would wrap +32768 to -32768
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


class Resampler:
    """Streaming s16le resampler (soxr, HQ): feed chunks of any size, get whatever is ready.

    Output is bursty — HQ holds back ~20 ms — so re-chunk it with FrameChunker. `last=True` flushes
    the tail and leaves the resampler ready for a fresh stream. Equal rates pass bytes through.
    A stray odd byte (half a sample) is carried over to the next call rather than dropped.
    Undithered: digital silence in is digital silence out.
    """

    def __init__(self, in_rate: int, out_rate: int, channels: int = 1, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0 or channels <= 0:
            raise ValueError("rates and channels must be positive")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.channels = channels
        self._frame_bytes = 2 * channels
        self._carry = b""
        self._stream = (
            None
            if in_rate == out_rate
            # float32 inside: soxr dithers int16 output, which would turn digital silence into noise
            else soxr.ResampleStream(in_rate, out_rate, channels, dtype="float32", quality=quality)
        )

    def convert(self, pcm: bytes, last: bool = False) -> bytes:
        data = self._carry + pcm
        usable = len(data) - len(data) % self._frame_bytes
        self._carry = data[usable:] if not last else b""
        data = data[:usable]
        if self._stream is None:
            return data
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32)
        if self.channels > 1:
            samples = samples.reshape(-1, self.channels)
        out = self._stream.resample_chunk(samples, last=last)
        if last:
            self._stream.clear()
        return _float_to_s16(out) if len(out) else b""

    def reset(self) -> None:
        """Forget buffered input (barge-in): the next convert() starts a new stream."""
        self._carry = b""
        if self._stream is not None:
            self._stream.clear()


# -- WAV files -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WavFormat:
    """What a WAV header says, checked: integer PCM of `width` bytes, `frames` whole sample frames."""

    channels: int
    width: int
    rate: int
    frames: int
    data_offset: int
    claimed_frames: int | None = None  # what the header said, when the file holds less (cut short)

    @property
    def duration_ms(self) -> int:
        return self.frames * 1000 // self.rate

    @property
    def cut_short(self) -> bool:
        return self.claimed_frames is not None and self.claimed_frames > self.frames


class WavReader:
    """A PCM WAV opened for streaming: the header is checked on open, then `blocks()` reads the audio
    a block at a time, so memory does not grow with the file.

    Accepts 8/16/24/32-bit integer PCM, any channels and rate, WAVE_FORMAT_EXTENSIBLE PCM (what
    ffmpeg writes for 24-bit and multichannel), a stream written into a pipe (data size 0xFFFFFFFF,
    "unknown": read to the end of the file), and a recording cut short before its header was
    finalised (data size 0 or past the end of the file; a torn last sample frame is dropped).
    Raises AudioFileError, naming the file and a fix, for anything else.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")  # closed by close()
        except FileNotFoundError:
            raise AudioFileError(f"{self.path}: no such file — check the path") from None
        except OSError as exc:
            raise AudioFileError(f"{self.path}: cannot read it ({exc.strerror or exc})") from None
        try:
            self.format = _read_header(self._file, self.path)
        except BaseException:
            self._file.close()
            raise

    def blocks(self, frames_per_block: int = 4800) -> Iterator[np.ndarray]:
        """The audio as int16 arrays of shape (n, channels), n <= frames_per_block, from the start."""
        fmt = self.format
        frame_bytes = fmt.width * fmt.channels
        self._file.seek(fmt.data_offset)
        remaining = fmt.frames
        while remaining > 0:
            n = min(frames_per_block, remaining)
            data = self._file.read(n * frame_bytes)
            data = data[: len(data) - len(data) % frame_bytes]
            if not data:  # the file shrank while we read it
                return
            remaining -= len(data) // frame_bytes
            yield _decode_s16(data, fmt.width).reshape(-1, fmt.channels)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> WavReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a whole PCM WAV (see WavReader for what is accepted) -> (int16 (n, ch), rate)."""
    with WavReader(path) as reader:
        fmt = reader.format
        blocks = list(reader.blocks(frames_per_block=max(1, fmt.frames)))
    samples = np.concatenate(blocks) if blocks else np.zeros((0, fmt.channels), np.int16)
    return samples, fmt.rate


def _read_header(file: BinaryIO, path: Path) -> WavFormat:
    """Walk the RIFF chunks up to `data`, checking `fmt ` on the way."""
    size = os.fstat(file.fileno()).st_size
    if size == 0:
        raise AudioFileError(f"{path}: the file is empty (0 bytes), not a WAV file; {_CONVERT_HINT}")
    head = file.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise AudioFileError(f"{path}: not a readable WAV file (no RIFF/WAVE header); {_CONVERT_HINT}")
    fmt: tuple[int, int, int] | None = None
    pos = 12
    while pos + 8 <= size:
        file.seek(pos)
        chunk_id, chunk_size = struct.unpack("<4sI", file.read(8))
        body = pos + 8
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(file.read(min(chunk_size, 40)), chunk_size, path)
        elif chunk_id == b"data":
            if fmt is None:
                raise AudioFileError(f"{path}: not a readable WAV file (audio data before its format); "
                                     f"{_CONVERT_HINT}")
            channels, width, rate = fmt
            available = size - body
            claimed = None
            if chunk_size in _SIZE_UNKNOWN:  # streamed, or the writer died before finalising the header
                chunk_size = available
            elif chunk_size > available:  # cut short: the header promises more than the file holds
                claimed = chunk_size // (channels * width)
                chunk_size = available
            return WavFormat(channels, width, rate, chunk_size // (channels * width), body, claimed)
        pos = body + chunk_size + (chunk_size & 1)
    what = "the header is cut short" if fmt is None else "it has no audio data chunk"
    raise AudioFileError(f"{path}: not a readable WAV file ({what}); {_CONVERT_HINT}")


def _parse_fmt(raw: bytes, chunk_size: int, path: Path) -> tuple[int, int, int]:
    """(channels, bytes per sample, rate) from a `fmt ` chunk; refuses anything but integer PCM."""
    if chunk_size < 16 or len(raw) < 16:
        raise AudioFileError(f"{path}: not a readable WAV file (the format chunk is cut short); {_CONVERT_HINT}")
    tag, channels, rate, _byte_rate, _block_align, bits = struct.unpack_from("<HHIIHH", raw)
    if tag == _WAVE_FORMAT_EXTENSIBLE and chunk_size >= 40 and len(raw) >= 26:
        (tag,) = struct.unpack_from("<H", raw, 24)  # first field of the SubFormat GUID
    if tag == _WAVE_FORMAT_FLOAT:
        raise AudioFileError(f"{path}: floating-point WAV is not supported, only integer PCM; {_CONVERT_HINT}")
    if tag != _WAVE_FORMAT_PCM:
        raise AudioFileError(f"{path}: WAV encoding {tag:#06x} is not PCM; {_CONVERT_HINT}")
    if channels == 0:
        raise AudioFileError(f"{path}: not a readable WAV file (the header says 0 channels); {_CONVERT_HINT}")
    if rate <= 0:
        raise AudioFileError(f"{path}: the header says the sample rate is {rate} Hz; {_CONVERT_HINT}")
    width = (bits + 7) // 8
    if width not in (1, 2, 3, 4):
        raise AudioFileError(f"{path}: {bits}-bit samples are not supported; {_CONVERT_HINT}")
    return channels, width, rate


def _decode_s16(data: bytes, width: int) -> np.ndarray:
    """Integer PCM of 1–4 bytes per sample -> int16, keeping the top 16 bits."""
    if width == 1:  # 8-bit WAV is unsigned
        return ((np.frombuffer(data, dtype=np.uint8).astype(np.int16) - 128) << 8).astype(np.int16)
    if width == 2:
        return np.frombuffer(data, dtype="<i2").astype(np.int16)
    if width == 3:
        b = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3)
        return (b[:, 1].astype(np.uint16) | (b[:, 2].astype(np.uint16) << 8)).view(np.int16)
    return (np.frombuffer(data, dtype="<i4") >> 16).astype(np.int16)


class WavWriter:
    """Incremental 16-bit PCM WAV writer.

    The header's sizes are rewritten (and the file flushed) every `header_every_ms` of audio and on
    close, so a process that dies mid-way leaves a valid file missing at most that much audio (and
    read_wav recovers even that). Writes must be whole sample frames.
    """

    def __init__(
        self, path: str | Path, rate: int = MODEL_RATE, channels: int = 1, *, header_every_ms: int = 1000
    ) -> None:
        if rate <= 0 or channels <= 0:
            raise ValueError("rate and channels must be positive")
        self.path = Path(path)
        self.rate = rate
        self.channels = channels
        self._block = 2 * channels
        self._header_every = max(self._block, rate * self._block * header_every_ms // 1000)
        self._data_bytes = 0
        self._since_header = 0
        self._file: io.BufferedWriter | None = open(self.path, "wb")  # closed by close()
        self._file.write(self._header())
        self._file.flush()

    @property
    def frames_written(self) -> int:
        return self._data_bytes // self._block

    @property
    def duration_ms(self) -> int:
        return self.frames_written * 1000 // self.rate

    @property
    def closed(self) -> bool:
        return self._file is None

    def write(self, pcm: bytes) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: write to a closed WavWriter")
        if len(pcm) % self._block:
            raise ValueError(f"write {len(pcm)} bytes: not a whole number of {self._block}-byte frames")
        self._file.write(pcm)
        self._data_bytes += len(pcm)
        self._since_header += len(pcm)
        if self._since_header >= self._header_every:
            self._update_header()

    def close(self) -> None:
        """Finalise the header and close; idempotent."""
        if self._file is None:
            return
        try:
            self._update_header()
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _update_header(self) -> None:
        assert self._file is not None
        self._file.seek(0)
        self._file.write(self._header())
        self._file.seek(0, io.SEEK_END)
        self._file.flush()
        self._since_header = 0

    def _header(self) -> bytes:
        byte_rate = self.rate * self._block
        return (
            b"RIFF"
            + struct.pack("<I", 36 + self._data_bytes)
            + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, _WAVE_FORMAT_PCM, self.channels, self.rate, byte_rate, self._block, 16)
            + b"data"
            + struct.pack("<I", self._data_bytes)
        )


# -- levels and framing ----------------------------------------------------------------------------


def rms_dbfs(pcm: bytes) -> float:
    """RMS level of s16le PCM in dBFS (a full-scale square wave is 0, a full-scale sine about -3).

    Empty input and digital silence give SILENCE_DBFS rather than -inf.
    """
    samples = np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], dtype="<i2")
    if not len(samples):
        return SILENCE_DBFS
    rms = math.sqrt(float(np.mean(np.square(samples, dtype=np.float64))))
    if rms <= 0.0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 20.0 * math.log10(rms / 32768.0))


class FrameChunker:
    """Re-chunks a byte stream arriving in arbitrary pieces into exact `frame_bytes` frames."""

    def __init__(self, frame_bytes: int) -> None:
        if frame_bytes <= 0:
            raise ValueError("frame_bytes must be positive")
        self.frame_bytes = frame_bytes
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held back, waiting to complete a frame (always < frame_bytes)."""
        return len(self._buf)

    def push(self, data: bytes) -> list[bytes]:
        """Add bytes; return every frame now complete, in order."""
        self._buf += data
        n = len(self._buf) // self.frame_bytes * self.frame_bytes
        if not n:
            return []
        out = [bytes(self._buf[i : i + self.frame_bytes]) for i in range(0, n, self.frame_bytes)]
        del self._buf[:n]
        return out

    def flush(self) -> bytes | None:
        """The held-back partial frame padded with silence, or None if nothing is pending."""
        if not self._buf:
            return None
        frame = bytes(self._buf) + bytes(self.frame_bytes - len(self._buf))
        self._buf.clear()
        return frame

    def clear(self) -> None:
        self._buf.clear()
