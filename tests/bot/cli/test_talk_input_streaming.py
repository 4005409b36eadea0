"""`talk --input-wav` streams IN.wav: read, converted and paced a block at a time; refuses a WAV with
no audio before any call; a failed call can drop its empty OUT.wav."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import pytest

from voice.audio import AudioFileError, WavReader, read_wav, to_mono_24k
from voice.call.transports.base import FRAME_BYTES
from voice.call.transports.file import FileTransport


def write_wav(path: Path, seconds: float, rate: int = 48_000, channels: int = 2) -> Path:
    t = np.arange(int(rate * seconds)) / rate
    mono = (0.4 * 32767 * np.sin(2 * math.pi * 330 * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(np.repeat(mono, channels).tobytes())
    return path


async def test_the_first_frame_leaves_after_one_block_is_read_not_the_whole_file(tmp_path, monkeypatch):
    reads: list[int] = []
    real_blocks = WavReader.blocks

    def counting_blocks(self, frames_per_block=4800):
        for block in real_blocks(self, frames_per_block):
            reads.append(len(block))
            yield block

    monkeypatch.setattr(WavReader, "blocks", counting_blocks)
    transport = FileTransport(write_wav(tmp_path / "in.wav", 60.0), tmp_path / "out.wav", realtime=False)
    assert reads == []  # the constructor only checks the header
    frames = transport.frames()
    first = await anext(frames)
    assert len(first) == FRAME_BYTES and sum(reads) <= 2 * 4800  # at most two 100 ms blocks of 48 kHz
    await frames.aclose()
    await transport.aclose()


async def test_streamed_input_frames_equal_the_whole_file_converted_at_once(tmp_path):
    path = write_wav(tmp_path / "in.wav", 1.337, rate=44_100)
    transport = FileTransport(path, tmp_path / "out.wav", realtime=False, tail_silence=False)
    streamed = b"".join([frame async for frame in transport.frames()])
    whole = to_mono_24k(*read_wav(path))
    assert streamed[: len(whole)] == whole and streamed[len(whole):] == bytes(len(streamed) - len(whole))
    assert len(streamed) % FRAME_BYTES == 0 and len(streamed) - len(whole) < FRAME_BYTES
    assert transport.input_ms == 58_961 * 1000 // 44_100  # whole milliseconds of the input
    await transport.aclose()


def test_a_wav_with_no_audio_is_refused_before_any_call(tmp_path):
    with pytest.raises(AudioFileError, match=r"in\.wav: holds no audio"):
        FileTransport(write_wav(tmp_path / "in.wav", 0.0), tmp_path / "out.wav")
    assert not (tmp_path / "out.wav").exists()


async def test_an_output_without_audio_can_be_discarded_and_one_with_audio_is_kept(tmp_path):
    empty = FileTransport(write_wav(tmp_path / "in.wav", 0.1), tmp_path / "empty.wav", realtime=False)
    empty.start()
    await empty.aclose()
    assert (tmp_path / "empty.wav").stat().st_size == 44 and empty.discard_empty_output()
    assert not (tmp_path / "empty.wav").exists()

    spoken = FileTransport(tmp_path / "in.wav", tmp_path / "spoken.wav", realtime=False)
    spoken.play(bytes(FRAME_BYTES), "item")
    spoken.tick(1)
    await spoken.aclose()
    assert not spoken.discard_empty_output() and read_wav(tmp_path / "spoken.wav")[0].shape == (480, 1)
