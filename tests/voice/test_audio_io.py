"""Audio helpers: WAV in every integer width, conversion to the model format, streaming, framing."""

from __future__ import annotations

import math
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
import soxr

from voice.audio import (
    SILENCE_DBFS,
    AudioFileError,
    FrameChunker,
    MonoConverter,
    Resampler,
    WavReader,
    WavWriter,
    read_wav,
    rms_dbfs,
    to_mono_24k,
)


def tone(freq: float, ms: int, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return amplitude * np.sin(2 * math.pi * freq * t)


def pitch(pcm: bytes, rate: int = 24_000) -> float:
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def encode(signal: np.ndarray, width: int) -> bytes:
    """Float [-1, 1) (n, ch) -> little-endian integer PCM of `width` bytes, the WAV way."""
    full = 2 ** (8 * width - 1)
    ints = np.clip(np.round(signal * full), -full, full - 1).astype(np.int64).ravel()
    if width == 1:
        return (ints + 128).astype(np.uint8).tobytes()
    return b"".join(int(v).to_bytes(width, "little", signed=True) for v in ints)


def write_wav(path: Path, signal: np.ndarray, rate: int, width: int) -> Path:
    signal = signal.reshape(len(signal), -1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(signal.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(encode(signal, width))
    return path


def extensible_wav(path: Path, data: bytes, *, rate: int, channels: int, bits: int, subformat: int) -> Path:
    """A WAVE_FORMAT_EXTENSIBLE file as ffmpeg writes for 24-bit or multichannel audio."""
    block = channels * bits // 8
    guid = struct.pack("<H", subformat) + bytes.fromhex("000000001000800000aa00389b71")
    fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0) + guid
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


# -- reading -------------------------------------------------------------------------------------


def test_stereo_48k_16bit_wav_becomes_24k_mono_with_same_duration_and_pitch(tmp_path):
    left = tone(440.0, 1000, 48_000, 0.5)
    stereo = np.stack([left, 0.5 * left], axis=1)
    samples, rate = read_wav(write_wav(tmp_path / "in.wav", stereo, 48_000, 2))
    assert rate == 48_000 and samples.shape == (48_000, 2) and samples.dtype == np.int16

    pcm = to_mono_24k(samples, rate)
    assert len(pcm) == 24_000 * 2  # exactly one second at 24 kHz
    assert abs(pitch(pcm) - 440.0) < 2
    assert abs(rms_dbfs(pcm[4800:-4800]) - 20 * math.log10(0.375 / math.sqrt(2))) < 0.2  # mean of L and R


def test_8bit_unsigned_wav_is_centred_and_scaled_to_16_bits(tmp_path):
    path = tmp_path / "u8.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(1), w.setframerate(8000)
        w.writeframes(bytes([0, 64, 128, 192, 255]))
    samples, rate = read_wav(path)
    assert rate == 8000
    assert samples[:, 0].tolist() == [-32768, -16384, 0, 16384, 32512]


def test_24bit_wav_keeps_the_top_16_bits_and_converts_at_pitch(tmp_path):
    path = tmp_path / "s24.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(3), w.setframerate(16_000)
        w.writeframes(b"".join(v.to_bytes(3, "little", signed=True) for v in (0x123456, -0x123456, -1, 0x7FFFFF)))
    samples, _ = read_wav(path)
    assert samples[:, 0].tolist() == [0x1234, -0x1235, -1, 0x7FFF]

    samples, rate = read_wav(write_wav(tmp_path / "tone24.wav", tone(1000.0, 500, 16_000), 16_000, 3))
    pcm = to_mono_24k(samples, rate)
    assert len(pcm) == 12_000 * 2 and abs(pitch(pcm) - 1000.0) < 3


def test_32bit_and_multichannel_wav_read_back(tmp_path):
    signal = np.stack([tone(300.0, 100, 22_050, a) for a in (0.1, 0.2, 0.3, 0.4)], axis=1)
    samples, rate = read_wav(write_wav(tmp_path / "s32.wav", signal, 22_050, 4))
    assert rate == 22_050 and samples.shape == (2205, 4)
    expected = np.round(signal * 32768).astype(np.int64)
    assert np.max(np.abs(samples.astype(np.int64) - expected)) <= 1


def test_extensible_pcm_wav_as_ffmpeg_writes_it_is_read(tmp_path):
    data = b"".join(v.to_bytes(3, "little", signed=True) for v in (0x010000, -0x020000, 0x7FFF00, 0))
    samples, rate = read_wav(extensible_wav(tmp_path / "ext.wav", data, rate=48_000, channels=2, bits=24, subformat=1))
    assert rate == 48_000 and samples.tolist() == [[0x0100, -0x0200], [0x7FFF, 0]]


def test_missing_file_error_names_the_path(tmp_path):
    with pytest.raises(AudioFileError, match=r"nope\.wav: no such file"):
        read_wav(tmp_path / "nope.wav")


def test_directory_instead_of_file_is_an_audio_file_error(tmp_path):
    with pytest.raises(AudioFileError, match="cannot read"):
        read_wav(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"hello, this is not audio at all",
        b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00",  # header cut inside fmt
        b"RIFF\x04\x00\x00\x00WAVE",  # no chunks at all
        b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x00\x00\x40\x1f\x00\x00"
        b"\x80\x3e\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00",  # zero channels
    ],
)
def test_corrupt_file_gives_an_actionable_audio_file_error(tmp_path, content):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(AudioFileError) as err:
        read_wav(path)
    assert "bad.wav" in str(err.value) and "ffmpeg" in str(err.value)


def test_an_empty_file_says_so_instead_of_empty_parentheses(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioFileError) as err:
        read_wav(tmp_path / "empty.wav")
    assert "empty.wav: the file is empty (0 bytes)" in str(err.value) and "()" not in str(err.value)


def test_float_and_compressed_wavs_are_rejected_with_a_conversion_hint(tmp_path):
    data = np.zeros(10, "<f4").tobytes()
    path = extensible_wav(tmp_path / "f32.wav", data, rate=48_000, channels=1, bits=32, subformat=3)
    with pytest.raises(AudioFileError, match="floating-point.*pcm_s16le"):
        read_wav(path)
    mulaw = bytearray(write_wav(tmp_path / "ulaw.wav", tone(100, 10, 8000), 8000, 1).read_bytes())
    struct.pack_into("<H", mulaw, 20, 7)
    (tmp_path / "ulaw.wav").write_bytes(mulaw)
    with pytest.raises(AudioFileError, match="0x0007 is not PCM"):
        read_wav(tmp_path / "ulaw.wav")


def test_recording_whose_header_was_never_finalised_is_recovered(tmp_path):
    path = write_wav(tmp_path / "cut.wav", tone(200.0, 100, 24_000), 24_000, 2)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 4, 36)  # RIFF size and data size as a writer leaves them at the start
    struct.pack_into("<I", raw, 40, 0)
    path.write_bytes(bytes(raw) + b"\x01")  # plus half a sample from a torn last write
    samples, _ = read_wav(path)
    assert samples.shape == (2400, 1)
    with WavReader(path) as reader:
        assert not reader.format.cut_short  # a data size of 0 promises nothing: not "cut short"


def test_a_file_cut_short_after_its_header_was_written_is_read_and_says_so(tmp_path):
    from voice.call.transports.file import FileTransport

    path = write_wav(tmp_path / "full.wav", tone(200.0, 1000, 24_000), 24_000, 2)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(path.read_bytes()[:44 + 4800])  # the header still claims 1 s; 0.1 s is left
    with WavReader(cut) as reader:
        assert (reader.format.frames, reader.format.claimed_frames, reader.format.cut_short) == (2400, 24000, True)
    warning = FileTransport(cut, tmp_path / "out.wav").input_warning
    assert warning == f"{cut} is cut short: its header says 1.0 s of audio, the file holds 0.10 s; using what is there"
    assert FileTransport(path, tmp_path / "out.wav").input_warning is None


def test_a_streamed_wav_whose_sizes_say_unknown_is_read_to_the_end_quietly(tmp_path):
    """What `ffmpeg … -f wav -` or `arecord` into a pipe writes: RIFF and data sizes 0xFFFFFFFF
    ("unknown"), since a pipe cannot be rewound to fill them in."""
    from voice.call.transports.file import FileTransport

    path = write_wav(tmp_path / "streamed.wav", tone(200.0, 700, 16_000), 16_000, 2)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 4, 0xFFFFFFFF)
    struct.pack_into("<I", raw, 40, 0xFFFFFFFF)
    path.write_bytes(bytes(raw))
    with WavReader(path) as reader:
        assert (reader.format.frames, reader.format.claimed_frames, reader.format.cut_short) == (11_200, None, False)
    samples, rate = read_wav(path)
    assert samples.shape == (11_200, 1) and rate == 16_000
    assert FileTransport(path, tmp_path / "out.wav").input_warning is None  # not "cut short"


# -- writing -------------------------------------------------------------------------------------


def test_wav_writer_round_trips_and_is_readable_before_close(tmp_path):
    path = tmp_path / "out.wav"
    pcm = np.round(tone(500.0, 300, 24_000) * 32767).astype("<i2").tobytes()
    writer = WavWriter(path, header_every_ms=100)
    for i in range(0, len(pcm), 960):
        writer.write(pcm[i : i + 960])
    with wave.open(str(path)) as w:  # the process could die here: the header already covers ≥200 ms
        assert w.getframerate() == 24_000 and w.getnframes() >= 4800
    writer.close()
    writer.close()
    samples, rate = read_wav(path)
    assert rate == 24_000 and samples.tobytes() == pcm and writer.duration_ms == 300
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"\x00\x00")


def test_wav_writer_rejects_partial_sample_frames(tmp_path):
    with WavWriter(tmp_path / "s.wav", 48_000, 2) as writer, pytest.raises(ValueError, match="4-byte frames"):
        writer.write(b"\x00" * 6)
    assert read_wav(tmp_path / "s.wav")[0].shape == (0, 2)


# -- streaming conversion, levels, framing -------------------------------------------------------


def test_streaming_resampler_matches_pitch_and_length_over_odd_sized_chunks():
    pcm = np.round(tone(440.0, 1000, 48_000) * 32767).astype("<i2").tobytes()
    rs = Resampler(48_000, 24_000)
    out = bytearray()
    rng = np.random.default_rng(1)
    pos = 0
    while pos < len(pcm):
        step = int(rng.integers(1, 3000))  # odd sizes split samples: the carry must keep them whole
        out += rs.convert(pcm[pos : pos + step])
        pos += step
    out += rs.convert(b"", last=True)
    assert abs(len(out) // 2 - 24_000) <= 2
    assert abs(pitch(bytes(out)) - 440.0) < 2
    assert rs.convert(pcm[:9600]) is not None  # usable again after last=True


def test_resampler_keeps_digital_silence_silent():
    rs = Resampler(24_000, 44_100)  # soxr's own int16 path would dither it into ±1 noise
    out = b"".join(rs.convert(bytes(960)) for _ in range(10))
    assert out and out == bytes(len(out))


def test_equal_rate_resampler_passes_bytes_through():
    rs = Resampler(24_000, 24_000, channels=2)
    assert rs.convert(b"\x01\x02\x03") == b""
    assert rs.convert(b"\x04\x05") == b"\x01\x02\x03\x04"


def test_rms_dbfs_reference_points():
    square = np.full(480, 32767, "<i2")
    square[::2] = -32767
    assert abs(rms_dbfs(square.tobytes())) < 0.01
    sine = np.round(tone(1000.0, 20, 24_000, 0.5) * 32767).astype("<i2").tobytes()
    assert abs(rms_dbfs(sine) - (-9.03)) < 0.05
    assert rms_dbfs(bytes(960)) == SILENCE_DBFS == rms_dbfs(b"")


def test_frame_chunker_reassembles_arbitrary_pieces_into_exact_frames():
    data = bytes(range(256)) * 20
    chunker = FrameChunker(960)
    frames: list[bytes] = []
    for i in range(0, len(data), 333):
        frames += chunker.push(data[i : i + 333])
    assert all(len(f) == 960 for f in frames) and b"".join(frames) == data[: len(frames) * 960]
    assert chunker.pending == len(data) % 960
    tail = chunker.flush()
    assert tail is not None and tail == data[len(frames) * 960 :] + bytes(960 - len(data) % 960)
    assert chunker.flush() is None and chunker.push(b"") == []


# -- streaming ----------------------------------------------------------------------------------


def test_wav_reader_streams_blocks_that_add_up_to_the_whole_file(tmp_path):
    signal = np.stack([tone(300.0, 1000, 44_100, 0.4), tone(500.0, 1000, 44_100, 0.2)], axis=1)
    path = write_wav(tmp_path / "in.wav", signal, 44_100, 3)
    with WavReader(path) as reader:
        assert (reader.format.channels, reader.format.rate, reader.format.frames) == (2, 44_100, 44_100)
        assert reader.format.duration_ms == 1000
        blocks = list(reader.blocks(1000))
    assert [len(b) for b in blocks] == [1000] * 44 + [100]
    assert np.array_equal(np.concatenate(blocks), read_wav(path)[0])


def test_streaming_conversion_is_identical_to_converting_the_whole_buffer(tmp_path):
    signal = np.stack([tone(440.0, 1234, 48_000, 0.5), tone(220.0, 1234, 48_000, 0.3)], axis=1)
    samples, rate = read_wav(write_wav(tmp_path / "in.wav", signal, 48_000, 2))
    converter = MonoConverter(rate)
    rng = np.random.default_rng(3)
    out, pos = bytearray(), 0
    while pos < len(samples):
        step = int(rng.integers(1, 7000))
        out += converter.convert(samples[pos : pos + step])
        pos += step
    out += converter.convert(samples[:0], last=True)
    assert bytes(out) == to_mono_24k(samples, rate)


def test_full_scale_input_clips_instead_of_wrapping_around():
    # a full-scale square wave overshoots after HQ resampling (Gibbs); without a clip before the
    # int16 cast, the overshoot would wrap to large negative values on the positive plateaus
    square = np.where(np.arange(48_000) // 24 % 2 == 0, 32767, -32768).astype(np.int16)
    reference = soxr.resample(square.astype(np.float32), 48_000, 24_000, quality="HQ")
    assert reference.max() > 32767.5  # the overshoot really is there
    out = np.frombuffer(to_mono_24k(square, 48_000), "<i2")
    over = reference > 32767
    assert np.all(out[over] == 32767) and np.all(out[reference < -32768] == -32768)
    assert np.array_equal(out, np.clip(np.rint(reference), -32768, 32767).astype(np.int16))
