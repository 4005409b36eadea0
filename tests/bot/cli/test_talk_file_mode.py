"""`switchboard talk --input-wav … --output-wav …` end to end, as a real subprocess against the fake."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import wave

import pytest

from bot.cli.main import main
from tests.support.fake_realtime import AudioReply, FakeRealtime, ToolCallReply
from tests.support.paths import ROOT
from tests.support.wavs import write_conversation_wav, write_wav

KEY = "sk-file-mode-secret-777"


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
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), "--metrics-json", str(metrics),
            "--timeout", "30", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 40)
        stdout, stderr = out.decode(), err.decode()
        assert proc.returncode == 0, stderr
        fake.assert_clean()
        types = [e["type"] for e in fake.received]
        sent_types = [e["type"] for e in fake.sent]
    assert "you: status please" in stdout and "assistant: Short answer." in stdout
    assert KEY not in stdout + stderr
    assert types.count("conversation.item.truncate") == 1, (_story(types), _story(sent_types), stderr)
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
    assert " tokens in (audio " in stderr.splitlines()[-1]  # what the call used, as the provider reported it


async def test_ctrl_c_ends_the_call_with_exit_130_and_keeps_what_was_said(tmp_path):
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_conversation_wav(wav_in)
    slow = AudioReply("A long story.", audio_ms=3000, chunk_ms=100, delay_ms_per_chunk=20)
    async with FakeRealtime([slow]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "OPENAI_API_KEY": KEY, "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        # some of the answer has reached OUT.wav (past the writer's buffer), so something was said
        await fake.wait_for(lambda: wav_out.exists() and wav_out.stat().st_size > 16_384, timeout=20)
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode() and KEY not in err.decode()
    with wave.open(str(wav_out)) as wav:  # a valid, finalised file holding what was said
        assert wav.getframerate() == 24_000 and wav.getnframes() >= 8_000


async def test_ctrl_c_before_the_assistant_said_anything_exits_130_and_leaves_no_empty_wav(tmp_path):
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_conversation_wav(wav_in)
    async with FakeRealtime([AudioReply("Never heard.", audio_ms=500)]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "OPENAI_API_KEY": KEY, "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        await fake.wait_received("input_audio_buffer.append")  # the call is on; the caller is still speaking
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        answered = "response.output_audio.delta" in fake.sent_types()
    assert proc.returncode == 130 and not answered, err.decode()
    assert err.decode().splitlines()[-1] == (f"switchboard talk: interrupted before the assistant said anything; "
                                             f"{wav_out} not written")
    assert not wav_out.exists()  # not a 44-byte WAV holding nothing


async def test_timeout_exits_3_and_leaves_no_empty_wav(tmp_path):
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_conversation_wav(wav_in)
    async with FakeRealtime([AudioReply("Never heard.", audio_ms=500)]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "OPENAI_API_KEY": KEY, "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
            "--output-wav", str(wav_out), "--timeout", "0.2", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 3, err.decode()
    assert "stopped after --timeout 0.2 s" in err.decode() and "Traceback" not in err.decode()
    assert not wav_out.exists()  # nothing was said before the timeout: no empty 44-byte WAV


def test_anyone_can_start_the_fake_server_and_talk_to_it_with_no_key(tmp_path, monkeypatch, capsys):
    """What docs/testing.md shows: `python -m tests.support.fake_realtime --port N`, then `talk` at it."""
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav_in, [(0.4, True), (1.2, False)])  # silence enough for a slow machine's server VAD
    server = subprocess.Popen([sys.executable, "-m", "tests.support.fake_realtime", "--port", "0", "--audio-ms", "200"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()  # '' if the server died: no hang
        url = first.split(" on ", 1)[1].split()[0]
        assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1/realtime")
        monkeypatch.chdir(tmp_path)
        code = main(["talk", "--input-wav", str(wav_in), "--output-wav", str(wav_out), "--timeout", "30"],
                    environ={"HOME": str(tmp_path), "OPENAI_API_KEY": "fake-key", "SWITCHBOARD_REALTIME_URL": url})
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "assistant: This is the fake Realtime server." in out, (out, err)
    finally:
        server.send_signal(signal.SIGINT)
        rest, _ = server.communicate(timeout=20)
    assert server.returncode == 0 and "0 GA violation(s)" in rest
    with wave.open(str(wav_out)) as wav:
        assert wav.getnframes() == 200 * 24


def _story(types: list[str]) -> str:
    """Event types in order, appends and deltas collapsed: what to read when a timing test fails."""
    out: list[str] = []
    for t in types:
        if out and out[-1].startswith(t):
            count = int(out[-1].rsplit("x", 1)[1]) + 1 if " x" in out[-1] else 2
            out[-1] = f"{t} x{count}"
        else:
            out.append(t)
    return ", ".join(out)


async def test_local_endpointing_commits_each_spoken_sentence_with_the_trained_vad(tmp_path):
    """File mode with `--endpointing local`: real espeak-ng speech, the Silero detector (loaded off
    the event loop) ends each turn itself; the server's own VAD is off."""
    from tests.support.speech import speech_frames

    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    silence = b"\x00" * 3840 * 60  # 1.2 s of 48 kHz stereo silence
    with wave.open(str(wav_in), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(48_000)
        for text in ("what is the weather like today", "and what about tomorrow"):
            wav.writeframes(b"".join(speech_frames(text)) + silence)
    async with FakeRealtime(lambda ctx: AudioReply("Sunny.", audio_ms=300)) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "SWITCHBOARD_HOME": str(tmp_path), "OPENAI_API_KEY": KEY, "SWITCHBOARD_REALTIME_URL": fake.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--endpointing", "local",
            "--input-wav", str(wav_in), "--output-wav", str(wav_out), "--timeout", "30", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 40)
        assert proc.returncode == 0, err.decode()[-2000:]
        fake.assert_clean()
        commits = [e for e in fake.received if e["type"] == "input_audio_buffer.commit"]
        update = next(e for e in fake.received if e["type"] == "session.update")
    assert len(commits) == 2, err.decode()[-2000:]
    assert update["session"]["audio"]["input"]["turn_detection"] is None
    assert "silero" in err.decode().lower()


async def test_a_transcript_reader_that_goes_away_does_not_cut_the_call_short(tmp_path):
    """`switchboard talk … | head -1`: stdout closes, the call goes on and OUT.wav gets the whole answer."""
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav_in, [(0.4, True), (1.2, False)])
    async with FakeRealtime([AudioReply("Hello there.", audio_ms=300)], user_transcripts=["hi"]) as fake:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader has gone before the first transcript line
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
                "--output-wav", str(wav_out), "--timeout", "30", cwd=ROOT,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "OPENAI_API_KEY": KEY,
                     "SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_REALTIME_URL": fake.url},
                stdout=write_end, stderr=asyncio.subprocess.PIPE)
        finally:
            os.close(write_end)
        _, err = await asyncio.wait_for(proc.communicate(), 40)
    assert proc.returncode == 0 and "Traceback" not in err.decode() and "Broken" not in err.decode(), err.decode()
    with wave.open(str(wav_out)) as wav:
        assert wav.getnframes() == 300 * 24  # the whole answer


@pytest.mark.parametrize("limit", [[], ["--timeout", "60"]], ids=["no-timeout", "timeout"])
async def test_ctrl_c_during_a_stalled_handshake_ends_at_once_with_exit_130(tmp_path, limit):
    """A server that accepts TCP and never answers the websocket upgrade: Ctrl-C must not wait out the
    handshake's 15 s timeout."""
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_conversation_wav(wav_in)
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        accepted.set()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
        "--output-wav", str(wav_out), *limit, cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "OPENAI_API_KEY": KEY,
             "SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_REALTIME_URL": f"ws://127.0.0.1:{port}/v1/realtime"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.wait_for(accepted.wait(), 30)  # the handshake has started and will never finish
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 5)  # not the 15 s handshake timeout
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    lines = err.decode().splitlines()
    assert proc.returncode == 130, lines
    assert lines[-1] == (f"switchboard talk: interrupted while connecting to the voice service at "
                         f"ws://127.0.0.1:{port}/v1/realtime?…; nothing was said")  # the query not shown
    assert "Traceback" not in err.decode() and KEY not in err.decode()
    assert not wav_out.exists()  # nothing was said: no empty OUT.wav


async def test_a_wav_of_pure_silence_ends_by_saying_it_holds_no_speech(tmp_path):
    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav_in, [(1.0, False)])
    async with FakeRealtime([AudioReply("Never asked.", audio_ms=300)]) as fake:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
            "--output-wav", str(wav_out), "--timeout", "30", cwd=ROOT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "OPENAI_API_KEY": KEY,
                 "SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_REALTIME_URL": fake.url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 40)
    lines = err.decode().splitlines()
    assert proc.returncode == 0, err.decode()
    assert lines[-1] == (f"switchboard talk: wrote 0 ms of assistant audio to {wav_out} (0 turns: {wav_in} holds no "
                         "speech, it is silent; record or pick a file with speech in it)")
