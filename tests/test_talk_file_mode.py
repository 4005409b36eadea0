"""`switchboard talk --input-wav … --output-wav …` end to end, as a real subprocess against the fake."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import wave
from pathlib import Path

import numpy as np

from tests.support.fake_realtime import AudioReply, FakeRealtime, ToolCallReply

KEY = "sk-file-mode-secret-777"
ROOT = Path(__file__).resolve().parent.parent


def write_conversation_wav(path: Path) -> None:
    """48 kHz stereo: speak 0.4 s, pause 0.8 s, speak again 0.4 s (over the answer), pause 0.8 s."""
    rate = 48_000

    def tone(seconds: float) -> np.ndarray:
        t = np.arange(int(rate * seconds)) / rate
        return 0.3 * np.sin(2 * math.pi * 220 * t)

    def quiet(seconds: float) -> np.ndarray:
        return np.zeros(int(rate * seconds))

    mono = np.concatenate([tone(0.4), quiet(0.8), tone(0.4), quiet(0.8)])
    stereo = np.repeat((mono * 32767).astype("<i2"), 2)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(stereo.tobytes())


async def test_file_mode_holds_a_conversation_with_a_tool_call_and_a_barge_in(tmp_path):
    def script(ctx):
        if ctx.response_count == 0:
            return ToolCallReply("talk_status", {})
        if ctx.response_count == 1:  # long enough that the second utterance cuts it off
            return AudioReply("Here is a very long status report.", audio_ms=4000, chunk_ms=100,
                              delay_ms_per_chunk=40)
        return AudioReply("Short answer.", audio_ms=500)

    wav_in, wav_out, metrics = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "turns.jsonl"
    write_conversation_wav(wav_in)
    async with FakeRealtime(script, user_transcripts=["status please", "stop, thanks"]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "SWITCHBOARD_HOME": str(tmp_path), "OPENAI_API_KEY": KEY,
               "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", "/nonexistent", "talk",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), "--metrics-json", str(metrics),
            "--timeout", "30", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 40)
        stdout, stderr = out.decode(), err.decode()
        assert proc.returncode == 0, stderr
        fake.assert_clean()
        types = [e["type"] for e in fake.received]
    assert "you: status please" in stdout and "assistant: Short answer." in stdout
    assert KEY not in stdout + stderr
    assert types.count("conversation.item.truncate") == 1
    outputs = [e for e in fake.received if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "function_call_output"]
    assert len(outputs) == 1 and json.loads(outputs[0]["item"]["output"])["provider"] == "openai"
    with wave.open(str(wav_out)) as wav:
        assert (wav.getframerate(), wav.getnchannels()) == (24_000, 1)
        heard_ms = wav.getnframes() / 24
    assert 500 < heard_ms < 4000  # the long answer was cut off; the short one played in full
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(records) >= 2 and all("latency_ms" in r for r in records)
    answered = [r for r in records if r["status"] == "completed"]
    assert answered and all("first_audio_played" in r["latency_ms"] for r in answered)
    assert "wrote" in stderr and "ms of assistant audio" in stderr


async def test_ctrl_c_ends_the_call_cleanly_and_keeps_what_was_said(tmp_path):
    import signal

    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_conversation_wav(wav_in)
    slow = AudioReply("A long story.", audio_ms=3000, chunk_ms=100, delay_ms_per_chunk=20)
    async with FakeRealtime([slow]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "OPENAI_API_KEY": KEY, "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", "/nonexistent", "talk",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        await fake.wait_for(lambda: any(e["type"] == "response.output_audio.delta" for e in fake.sent), timeout=10)
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    with wave.open(str(wav_out)) as wav:  # a valid, finalised file
        assert wav.getframerate() == 24_000
