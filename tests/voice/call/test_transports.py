"""Local transports: the paced speaker, WAV-file calls, and the terminal through a fake sounddevice."""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
import threading
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.clock import VirtualClock
from voice.audio import read_wav, rms_dbfs
from voice.call.attribution import LOCAL_SPEAKER
from voice.call.transports.base import FRAME_BYTES, CallTransport
from voice.call.transports.file import FileTransport
from voice.call.transports.playback_queue import SILENCE_FRAME, PacedSpeaker
from voice.call.transports.terminal import EchoGate, TerminalAudioUnavailable, TerminalTransport


def tone(freq: float, ms: int, rate: int = 24_000, amplitude: float = 0.5) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    return np.round(amplitude * 32767 * np.sin(2 * math.pi * freq * t)).astype("<i2").tobytes()


def pitch(pcm: bytes, rate: int = 24_000) -> float:
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    return float(np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * rate / len(x))


def write_wav(path: Path, pcm: bytes, rate: int = 24_000, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(pcm)
    return path


class Recorder:
    """A PlaybackListener that notes each call and the thread it arrived on."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.threads: set[int] = set()

    def on_playback_started(self, item_id: str) -> None:
        self.events.append(("started", item_id))
        self.threads.add(threading.get_ident())

    def on_playback_idle(self) -> None:
        self.events.append(("idle", None))
        self.threads.add(threading.get_ident())


# -- PacedSpeaker --------------------------------------------------------------------------------


def test_speaker_credits_played_ms_per_item_and_pads_only_a_finished_items_tail():
    spk = PacedSpeaker()
    spk.play(tone(300, 50), "a")  # 2.5 frames
    frames = [spk.pull_frame() for _ in range(3)]
    assert [item for _, item in frames] == ["a", "a", None]  # the half frame waits for more audio
    assert spk.played_ms("a") == 40 and spk.is_playing()
    spk.finish_item("a")
    frame, item = spk.pull_frame()
    assert item == "a" and frame[480:] == bytes(480) and spk.played_ms("a") == 50
    spk.play(tone(300, 30), "b")
    spk.play(tone(300, 20), "c")  # a following item also releases b's partial frame
    assert [item for _, item in (spk.pull_frame() for _ in range(4))] == ["b", "b", "c", None]
    assert (spk.played_ms("b"), spk.played_ms("c"), spk.played_ms("zzz")) == (30, 20, 0)
    assert not spk.is_playing() and spk.underruns == 2


def test_speaker_clear_drops_unplayed_audio_and_keeps_the_played_count():
    spk = PacedSpeaker()
    spk.play(tone(300, 1000), "a")
    for _ in range(5):
        spk.pull_frame()
    spk.clear()
    assert spk.pull_frame() == (SILENCE_FRAME, None) and not spk.is_playing()
    assert spk.played_ms("a") == 100 and spk.buffered_ms() == 0 and spk.clears == 1
    spk.play(tone(300, 40), "b")
    assert [spk.pull_frame()[1] for _ in range(3)] == ["b", "b", None]


def test_speaker_listener_hears_each_start_once_and_one_idle_per_drain_or_clear():
    spk = PacedSpeaker()
    rec = Recorder()
    spk.set_listener(rec)
    spk.pull_frame()  # idle from the start: nothing to report
    spk.play(tone(300, 40), "a")
    spk.play(tone(300, 20), "b")
    for _ in range(6):
        spk.pull_frame()
    assert rec.events == [("started", "a"), ("started", "b"), ("idle", None)]
    spk.play(tone(300, 200), "c")
    spk.pull_frame()
    spk.clear()
    spk.pull_frame()
    spk.pull_frame()
    assert rec.events[3:] == [("started", "c"), ("idle", None)]


def test_speaker_listener_may_query_the_speaker_without_deadlock():
    spk = PacedSpeaker()

    class Asking(Recorder):
        def on_playback_started(self, item_id: str) -> None:
            super().on_playback_started(item_id)
            self.seen_ms = spk.played_ms(item_id)

    rec = Asking()
    spk.set_listener(rec)
    spk.play(tone(300, 20), "a")
    spk.pull_frame()
    assert rec.seen_ms == 20


def test_speaker_is_consistent_under_a_concurrent_producer_and_consumer():
    spk = PacedSpeaker()
    items = [f"item{i}" for i in range(100)]
    pulled: dict[str | None, int] = {}
    done = threading.Event()
    delta = tone(300, 30)

    def produce() -> None:
        for item in items:
            for _ in range(5):  # 5 deltas of 30 ms: partial frames cross delta boundaries
                spk.play(delta, item)
            spk.finish_item(item)
        done.set()

    def consume() -> None:
        while not (done.is_set() and not spk.is_playing()):
            _, item = spk.pull_frame()
            pulled[item] = pulled.get(item, 0) + 1
            if item is None:
                time.sleep(0)  # an underrun: let the producer have the GIL

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert [spk.played_ms(i) for i in items[-64:]] == [150] * 64  # history keeps the latest 64
    assert all(pulled[i] == 8 for i in items)  # 150 ms = 7.5 frames, the last one padded


# -- FileTransport -------------------------------------------------------------------------------


def test_both_transports_implement_every_call_transport_method(tmp_path):
    transports = [
        FileTransport(write_wav(tmp_path / "in.wav", tone(300, 20)), tmp_path / "out.wav"),
        TerminalTransport(sd_module=FakeSoundDevice({24_000})),
    ]
    for transport in transports:
        for name, member in inspect.getmembers(CallTransport, inspect.isfunction):
            if not name.startswith("_"):
                assert inspect.signature(getattr(transport, name)).parameters.keys() == (
                    inspect.signature(member).parameters.keys() - {"self"}
                ), name
        assert transport.turn_context().speakers == frozenset({LOCAL_SPEAKER})  # one local person


async def test_file_input_is_24k_mono_frames_then_silence_until_close_input(tmp_path):
    stereo = np.repeat(np.frombuffer(tone(440, 1010, 48_000), "<i2"), 2).tobytes()
    transport = FileTransport(write_wav(tmp_path / "in.wav", stereo, 48_000, 2), tmp_path / "out.wav", realtime=False)
    assert transport.input_ms == 1010
    frames: list[bytes] = []
    async for frame in transport.frames():
        frames.append(frame)
        assert transport.input_done.is_set() == (len(frames) > 51)
        if len(frames) == 60:
            transport.close_input()
    assert len(frames) == 60 and all(len(f) == FRAME_BYTES for f in frames)
    assert abs(pitch(b"".join(frames[:50])) - 440.0) < 2
    assert frames[50][480:] == bytes(480)  # 10 ms of audio padded to a frame
    assert frames[51:] == [SILENCE_FRAME] * 9


async def test_file_input_without_tail_ends_with_the_wav(tmp_path):
    transport = FileTransport(
        write_wav(tmp_path / "in.wav", tone(440, 100)), tmp_path / "out.wav", realtime=False, tail_silence=False
    )
    assert len([f async for f in transport.frames()]) == 5 and transport.input_done.is_set()


async def test_out_wav_holds_exactly_the_assistant_audio_that_was_played(tmp_path):
    transport = FileTransport(write_wav(tmp_path / "in.wav", tone(440, 20)), tmp_path / "out.wav", realtime=False)
    a, b, c = tone(300, 200), tone(500, 100), tone(700, 1000)
    transport.play(a, "a")
    transport.finish_item("a")
    transport.tick(15)  # 10 frames of a, then 5 of underrun that must not reach OUT.wav
    transport.play(b, "b")
    transport.finish_item("b")
    transport.play(c, "c")
    transport.tick(10)  # all of b, half of c
    transport.clear()  # barge-in: the rest of c is never played
    transport.tick(5)
    await transport.aclose()
    samples, rate = read_wav(tmp_path / "out.wav")
    assert rate == 24_000 and samples.tobytes() == a + b + c[: 5 * FRAME_BYTES]
    assert (transport.played_ms("a"), transport.played_ms("b"), transport.played_ms("c")) == (200, 100, 100)


async def test_file_playback_runs_on_a_20ms_schedule_and_reports_on_the_loop(tmp_path):
    clock = VirtualClock()
    transport = FileTransport(
        write_wav(tmp_path / "in.wav", tone(440, 20)), tmp_path / "out.wav", sleep=clock.sleep, clock=clock
    )
    rec = Recorder()
    transport.set_listener(rec)
    transport.start()
    await asyncio.sleep(0)
    transport.play(tone(300, 100), "a")
    transport.finish_item("a")
    await clock.run_for(0.061)
    assert transport.played_ms("a") == 60 and transport.is_playing()
    await clock.run_for(0.06)
    assert transport.played_ms("a") == 100 and rec.events == [("started", "a"), ("idle", None)]
    assert rec.threads == {threading.get_ident()}
    await transport.aclose()
    assert read_wav(tmp_path / "out.wav")[0].shape == (2400, 1)


async def test_file_input_schedule_is_absolute_so_late_wakeups_do_not_drift(tmp_path):
    now = [0.0]

    async def oversleeping(delay: float) -> None:
        now[0] += delay + 0.007  # every wake-up 7 ms late
        await asyncio.sleep(0)

    transport = FileTransport(
        write_wav(tmp_path / "in.wav", tone(440, 1000)), tmp_path / "out.wav", sleep=oversleeping, clock=lambda: now[0]
    )
    times = []
    async for _ in transport.frames():
        times.append(now[0])
        if len(times) == 50:
            transport.close_input()
    assert abs(times[-1] - 1.0) <= 0.0071  # drift-accumulating sleeps would be 350 ms late here


async def test_file_input_is_paced_in_real_time(tmp_path):
    transport = FileTransport(write_wav(tmp_path / "in.wav", tone(440, 200)), tmp_path / "out.wav")
    start = time.monotonic()
    count = 0
    async for _ in transport.frames():
        count += 1
        if transport.input_done.is_set():
            transport.close_input()
    elapsed = time.monotonic() - start
    assert count == 11  # ten frames of audio, then one of silence before input_done is seen
    assert 0.2 <= elapsed < 2.0


async def test_file_transport_rejects_a_bad_input_before_any_call_starts(tmp_path):
    (tmp_path / "in.wav").write_bytes(b"RIFF....WAVEjunk")
    with pytest.raises(ValueError, match="in.wav"):
        FileTransport(tmp_path / "in.wav", tmp_path / "out.wav")


# -- TerminalTransport ---------------------------------------------------------------------------


class FakeStream:
    """Records what the transport asked PortAudio for; the test plays the PortAudio thread."""

    def __init__(self, sd: FakeSoundDevice, kind: str, **kwargs: Any) -> None:
        sd.check_kwargs(kind, kwargs)
        self.kind = kind
        self.kwargs = kwargs
        self.callback = kwargs["callback"]
        self.started = self.closed = False
        sd.streams[kind] = self

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.started = False

    def close(self) -> None:
        self.closed = True

    def capture(self, pcm: bytes) -> None:
        self.callback(pcm, len(pcm) // 2, None, 0)

    def render(self) -> bytes:
        out = bytearray(self.kwargs["blocksize"] * 2)
        self.callback(out, self.kwargs["blocksize"], None, 0)
        return bytes(out)


class FakeSoundDevice:
    """The slice of the `sounddevice` module the transport uses, for a device at fixed rates."""

    class PortAudioError(Exception):
        pass

    def __init__(self, rates: set[int], native: int = 48_000) -> None:
        self.rates = rates
        self.native = native
        self.streams: dict[str, FakeStream] = {}

    def check_kwargs(self, kind: str, kwargs: dict[str, Any]) -> None:
        try:  # the fake accepts only what the real stream classes would
            import sounddevice as real
        except (ImportError, OSError):
            real = None
        if real is not None:
            cls = real.RawInputStream if kind == "input" else real.RawOutputStream
            inspect.signature(cls.__init__).bind(None, **kwargs)
        if kwargs["samplerate"] not in self.rates:
            raise self.PortAudioError("Invalid sample rate [PaErrorCode -9997]")

    def _check(self, device=None, channels=None, dtype=None, extra_settings=None, samplerate=None) -> None:
        if samplerate not in self.rates:
            raise self.PortAudioError("Invalid sample rate [PaErrorCode -9997]")

    check_input_settings = check_output_settings = _check

    def query_devices(self, device=None, kind=None) -> dict[str, Any]:
        return {"name": "fake", "default_samplerate": float(self.native), "max_input_channels": 1}

    def RawInputStream(self, **kwargs: Any) -> FakeStream:  # noqa: N802 - mirrors sounddevice
        return FakeStream(self, "input", **kwargs)

    def RawOutputStream(self, **kwargs: Any) -> FakeStream:  # noqa: N802 - mirrors sounddevice
        return FakeStream(self, "output", **kwargs)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def collect(transport: TerminalTransport) -> list[bytes]:
    transport.close_input()
    return [f async for f in transport.frames()]


async def test_terminal_at_24k_moves_mic_frames_to_the_loop_and_speaker_frames_to_the_card():
    sd = FakeSoundDevice({24_000})
    transport = TerminalTransport(sd_module=sd, echo_gate=False)
    rec = Recorder()
    transport.set_listener(rec)
    await transport.__aenter__()
    mic, out = sd.streams["input"], sd.streams["output"]
    assert mic.started and out.started and mic.kwargs["blocksize"] == 480 and out.kwargs["samplerate"] == 24_000

    speech = tone(440, 100)
    await asyncio.to_thread(lambda: [mic.capture(speech[i : i + 960]) for i in range(0, len(speech), 960)])
    await settle()

    reply = tone(300, 40)
    transport.play(reply, "a")
    transport.finish_item("a")
    rendered = await asyncio.to_thread(lambda: [out.render() for _ in range(3)])
    await settle()
    assert b"".join(rendered) == reply + SILENCE_FRAME
    assert transport.played_ms("a") == 40 and not transport.is_playing()
    assert rec.events == [("started", "a"), ("idle", None)] and rec.threads == {threading.get_ident()}

    await transport.__aexit__(None, None, None)
    assert b"".join(await collect(transport)) == speech and mic.closed and out.closed
    assert "headphones" in transport.headphones_hint() and "\n" not in transport.headphones_hint()


async def test_terminal_uses_the_native_rate_when_24k_is_not_offered():
    sd = FakeSoundDevice({48_000})
    transport = TerminalTransport(sd_module=sd, echo_gate=False)
    transport.start()
    mic, out = sd.streams["input"], sd.streams["output"]
    assert (transport.input_rate, transport.output_rate, mic.kwargs["blocksize"]) == (48_000, 48_000, 960)

    speech = tone(440, 500, 48_000)
    for i in range(0, len(speech), 1920):
        mic.capture(speech[i : i + 1920])
    await settle()
    transport.play(tone(660, 500), "a")
    transport.finish_item("a")
    rendered = b"".join(out.render() for _ in range(25))
    await transport.aclose()

    frames = await collect(transport)
    assert all(len(f) == FRAME_BYTES for f in frames) and len(frames) in (23, 24, 25)  # HQ holds ~20 ms back
    assert abs(pitch(b"".join(frames[2:22])) - 440.0) < 3
    assert len(rendered) == 25 * 1920 and abs(pitch(rendered[3840:], 48_000) - 660.0) < 3
    assert transport.played_ms("a") >= 480


async def test_terminal_clear_silences_the_card_at_once_even_with_resampling():
    sd = FakeSoundDevice({44_100}, native=44_100)
    transport = TerminalTransport(sd_module=sd, echo_gate=False)
    transport.start()
    transport.play(tone(300, 1000), "a")
    out = sd.streams["output"]
    for _ in range(5):
        out.render()
    transport.clear()
    assert out.render() == bytes(882 * 2)
    await transport.aclose()


async def test_echo_gate_suppresses_quiet_echo_but_passes_loud_speech_while_the_assistant_talks():
    now = [0.0]
    sd = FakeSoundDevice({24_000})
    transport = TerminalTransport(sd_module=sd, clock=lambda: now[0])
    transport.start()
    mic, out = sd.streams["input"], sd.streams["output"]
    transport.play(tone(300, 1000, amplitude=0.5), "a")  # about -9 dBFS on the speaker
    echo = tone(300, 20, amplitude=0.03)  # about -33.5 dBFS back at the mic
    speech = tone(180, 20, amplitude=0.3)  # about -13.5 dBFS: the user talking over it

    out.render()
    mic.capture(echo)
    mic.capture(speech)
    now[0] += 0.15  # playback stopped 150 ms ago: echo may still be in the room
    mic.capture(echo)
    now[0] += 0.1  # past the 200 ms hangover
    mic.capture(echo)
    await settle()

    frames = await collect(transport)
    assert frames == [bytes(FRAME_BYTES), speech, bytes(FRAME_BYTES), echo]
    gate = transport.echo_gate
    assert gate is not None and (gate.suppressed, gate.passed_over_echo) == (2, 1)
    assert rms_dbfs(echo) < -30 and rms_dbfs(speech) > -15


def test_echo_gate_threshold_follows_the_loudest_recent_assistant_frame():
    now = [0.0]
    gate = EchoGate(clock=lambda: now[0], coupling_db=-20, margin_db=12)
    assert gate.threshold_dbfs() is None
    gate.note_playback(tone(300, 20, amplitude=0.5))
    now[0] += 0.05
    gate.note_playback(tone(300, 20, amplitude=0.05))
    threshold = gate.threshold_dbfs()
    assert threshold is not None and abs(threshold - (-9.03 - 8)) < 0.1
    now[0] += 0.19  # the loud frame has left the window, the quiet one has not
    threshold = gate.threshold_dbfs()
    assert threshold is not None and abs(threshold - (-29.03 - 8)) < 0.1


async def test_terminal_drops_the_oldest_mic_frames_when_the_engine_falls_behind():
    sd = FakeSoundDevice({24_000})
    transport = TerminalTransport(sd_module=sd, echo_gate=False, max_queued_frames=5)
    transport.start()
    mic = sd.streams["input"]
    frames = [bytes([i]) * FRAME_BYTES for i in range(8)]
    for frame in frames:
        mic.capture(frame)
    await settle()
    await transport.aclose()
    assert await collect(transport) == frames[3:] and transport.dropped_frames == 3


def test_missing_sounddevice_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    with pytest.raises(TerminalAudioUnavailable) as err:
        TerminalTransport()
    assert "pip install 'switchboard[audio]'" in str(err.value) and "apt-get install -y libportaudio2" in str(err.value)


async def test_unopenable_device_is_reported_and_nothing_is_left_open():
    class Refusing(FakeSoundDevice):
        def RawOutputStream(self, **kwargs: Any) -> FakeStream:  # noqa: N802
            raise self.PortAudioError("Device unavailable [PaErrorCode -9985]")

    sd = Refusing({24_000})
    transport = TerminalTransport(sd_module=sd)
    with pytest.raises(TerminalAudioUnavailable, match="Device unavailable.*python -m sounddevice"):
        transport.start()
    assert sd.streams["input"].closed
