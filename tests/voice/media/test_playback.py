"""Playback source: exact frames, silence on underrun, per-item played time, barge-in clear."""

from __future__ import annotations

import math
import threading

import numpy as np

from tests.support.packets import dominant_frequency
from voice.media.playback import PlaybackSource
from voice.media.rtp import OPUS_SILENCE


def tone24k(freq: float, ms: int, amplitude: float = 0.3) -> bytes:
    n = 24 * ms
    t = np.arange(n) / 24_000
    return (amplitude * 32767 * np.sin(2 * math.pi * freq * t)).astype("<i2").tobytes()


def drain(src: PlaybackSource, frames: int) -> list[bytes]:
    return [src.read() for _ in range(frames)]


def test_underrun_is_opus_silence_that_costs_no_encoding_and_never_ends_playback():
    src = PlaybackSource()
    frames = drain(src, 3)
    assert frames == [OPUS_SILENCE] * 3 and src.underruns == 3 and src.is_opus()
    src.play(tone24k(440.0, 100), "item")
    src.finish_item("item")
    assert len(src.read()) == 3840 and not src.is_opus()  # audio is PCM for discord.py to encode


def test_model_audio_is_upsampled_to_48k_stereo_frames_at_the_right_pitch():
    src = PlaybackSource()
    src.play(tone24k(440.0, 1000), "item_a")
    src.finish_item("item_a")
    frames = drain(src, 52)
    assert all(len(f) == 3840 or f == OPUS_SILENCE for f in frames)
    assert all(len(f) == 3840 for f in frames[2:48])
    pcm = b"".join(frames[2:48])
    stereo = np.frombuffer(pcm, "<i2").reshape(-1, 2)
    assert np.array_equal(stereo[:, 0], stereo[:, 1])
    freq, rms = dominant_frequency(pcm)
    assert abs(freq - 440.0) < 3 and 0.19 < rms < 0.23
    assert src.played_ms("item_a") == 1000  # every sample of the item was handed over


def test_played_ms_counts_only_frames_actually_read():
    src = PlaybackSource()
    src.play(tone24k(300.0, 2000), "item_b")
    drain(src, 10)
    assert src.played_ms("item_b") == 200
    assert src.buffered_ms() > 1500


def test_clear_stops_playback_on_the_next_frame_and_keeps_the_played_count():
    src = PlaybackSource()
    src.play(tone24k(300.0, 2000), "item_c")
    drain(src, 5)
    src.clear()
    assert src.read() == OPUS_SILENCE and not src.is_playing()
    assert src.played_ms("item_c") == 100
    src.play(tone24k(300.0, 100), "item_d")  # a new item after barge-in plays from its start
    src.finish_item("item_d")
    assert any(drain(src, 6)) and src.played_ms("item_d") == 100


def test_items_are_counted_separately_and_a_new_item_flushes_the_previous_tail():
    src = PlaybackSource()
    src.play(tone24k(300.0, 300), "one")
    src.play(tone24k(500.0, 300), "two")
    src.finish_item("two")
    drain(src, 40)
    assert src.played_ms("one") == 300 and src.played_ms("two") == 300


def test_mid_stream_partial_frame_waits_for_more_audio():
    src = PlaybackSource()
    src.play(tone24k(300.0, 205), "x")  # 205 ms: not a whole number of 20 ms frames
    drain(src, 15)
    assert 0 < src.played_ms("x") < 205  # the partial tail was not padded out mid-item
    src.finish_item("x")
    drain(src, 3)
    assert src.played_ms("x") == 205


def test_concurrent_feed_and_read_lose_nothing():
    src = PlaybackSource()
    stop = threading.Event()
    read_frames: list[bytes] = []

    def player() -> None:
        while not stop.is_set() or src.is_playing():
            read_frames.append(src.read())

    thread = threading.Thread(target=player)
    thread.start()
    chunk = tone24k(440.0, 100)
    for _ in range(20):
        src.play(chunk, "long")
    src.finish_item("long")
    stop.set()
    thread.join(10)
    assert src.played_ms("long") == 2000


def test_the_discord_source_tells_its_listener_when_an_item_starts_and_when_it_goes_idle():
    source = PlaybackSource()
    heard: list[tuple[str, str | None]] = []

    class Listener:
        def on_playback_started(self, item_id: str) -> None:
            heard.append(("started", item_id))

        def on_playback_idle(self) -> None:
            heard.append(("idle", None))

    source.set_listener(Listener())
    source.play(bytes(24_000 * 2 // 10), "item_1")  # 100 ms of model audio
    source.finish_item("item_1")
    while source.is_playing():
        source.read()
    source.read()
    assert heard == [("started", "item_1"), ("idle", None)]
