"""Audio plumbing shared by the transports: format conversion, WAV files, levels, framing.

Everything speaks s16le PCM. The model's format is 24 kHz mono; these helpers get other audio
into it (and out to files) without aliasing or drift.
"""

from __future__ import annotations

import io
import math
import struct
import wave
from pathlib import Path
from types import TracebackType

import numpy as np
import soxr

MODEL_RATE = 24_000
SILENCE_DBFS = -120.0  # what rms_dbfs() reports for digital silence, so comparisons never see -inf

_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_FLOAT = 0x0003
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
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
    mono = downmix(samples)
    if rate != MODEL_RATE and len(mono):
        mono = soxr.resample(mono, rate, MODEL_RATE, quality="HQ")
    return _float_to_s16(mono)


def _float_to_s16(x: np.ndarray) -> bytes:
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


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a PCM WAV (8/16/24/32-bit integer, any channels, any rate) -> (int16 (n, ch), rate).

    Also accepts WAVE_FORMAT_EXTENSIBLE PCM (what ffmpeg writes for 24-bit and multichannel) and a
    recording cut short before its header was finalised (data size 0 or past the end of the file).
    Raises AudioFileError for anything else.
    """
    path = Path(path)
    try:
        raw = bytearray(path.read_bytes())
    except FileNotFoundError:
        raise AudioFileError(f"{path}: no such file — check the path") from None
    except OSError as exc:
        raise AudioFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    _repair_header(raw, path)
    try:
        with wave.open(io.BytesIO(raw)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            data = w.readframes(w.getnframes())
    except (wave.Error, EOFError, struct.error) as exc:
        raise AudioFileError(f"{path}: not a readable WAV file ({exc or 'truncated'}); {_CONVERT_HINT}") from None
    if rate <= 0:
        raise AudioFileError(f"{path}: the header says the sample rate is {rate} Hz; {_CONVERT_HINT}")
    if width not in (1, 2, 3, 4):
        raise AudioFileError(f"{path}: {8 * width}-bit samples are not supported; {_CONVERT_HINT}")
    data = data[: len(data) - len(data) % (width * channels)]
    return _decode_s16(data, width).reshape(-1, channels), rate


def _repair_header(raw: bytearray, path: Path) -> None:
    """Patch in place what the 3.11 `wave` module rejects but we can read safely; reject non-PCM."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        return  # not RIFF/WAVE at all: let `wave` say so
    struct.pack_into("<I", raw, 4, len(raw) - 8)  # a stale RIFF size would hide the data chunk
    pos = 12
    while pos + 8 <= len(raw):
        chunk_id = bytes(raw[pos : pos + 4])
        (size,) = struct.unpack_from("<I", raw, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt " and size >= 16 and body + 16 <= len(raw):
            (tag,) = struct.unpack_from("<H", raw, body)
            if tag == _WAVE_FORMAT_EXTENSIBLE and size >= 40 and body + 26 <= len(raw):
                (tag,) = struct.unpack_from("<H", raw, body + 24)  # first field of the SubFormat GUID
                if tag == _WAVE_FORMAT_PCM:
                    struct.pack_into("<H", raw, body, _WAVE_FORMAT_PCM)
            if tag == _WAVE_FORMAT_FLOAT:
                raise AudioFileError(f"{path}: floating-point WAV is not supported, only integer PCM; {_CONVERT_HINT}")
            if tag != _WAVE_FORMAT_PCM:
                raise AudioFileError(f"{path}: WAV encoding {tag:#06x} is not PCM; {_CONVERT_HINT}")
        elif chunk_id == b"data":
            available = len(raw) - body
            if size == 0 or size > available:  # writer died before finalising the header
                struct.pack_into("<I", raw, pos + 4, available)
            return
        pos = body + size + (size & 1)


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
