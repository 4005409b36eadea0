"""Background runs inside a call: the model delegates, the call goes on, the result is spoken when
the floor is free — through the real engine, the fake GA server, the fake api_server or a real agent
subprocess, and a SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sqlite3
import sys
import wave

from bot.tools.runs import run_tools
from common.store import DB_FILENAME, open_store
from runs import Delivery, RunsConfig, RunService, RunState, TerminalSink
from runs.repository import MIGRATIONS
from tests.support.fake_hermes import FakeHermes
from tests.support.fake_realtime import AudioReply, FakeRealtime, ToolCallReply, silence_pcm16, tone_pcm16
from tests.support.paths import ROOT
from tests.support.runs import FAKE_AGENT, SAFETY_S
from tests.support.runs import KEY as HERMES_KEY
from tests.support.virtual_transport import VirtualTransport
from tests.support.wavs import write_wav
from voice.call.core import CallOptions
from voice.call.engine import CallEngine
from voice.call.identity import Identity
from voice.call.providers import OpenAIRealtime
from voice.call.tools import AllowKnownSpeakers, ToolCatalogue
from voice.call.transports.base import TurnContext

OPENAI_KEY = "sk-runs-in-a-call-NEVER-PRINT"
ALICE = 4242


class Listening:
    """An announcer in front of the engine that says when the runs service asked it to speak."""

    def __init__(self, engine: CallEngine) -> None:
        self.engine = engine
        self.asked = asyncio.Event()
        self.texts: list[str] = []

    async def announce(self, text: str) -> bool:
        self.texts.append(text)
        self.asked.set()
        return await self.engine.announce(text)


def floor_when_requested(fake: FakeRealtime) -> dict:
    """What the fake had told the client when a response was asked for: is the user mid-speech,
    and has every response so far finished?"""
    def count(kind: str) -> int:
        return sum(1 for e in fake.sent if e.get("type") == kind)
    return {"user_speaking": count("input_audio_buffer.speech_started") > count("input_audio_buffer.speech_stopped"),
            "responses_open": count("response.created") - count("response.done")}


async def test_a_delegated_run_lands_while_the_user_speaks_and_is_spoken_after_their_answer(tmp_path):
    requests: list[dict] = []

    def script(ctx):
        requests.append({"trigger": ctx.trigger, "instructions": ctx.params.get("instructions", ""),
                         **floor_when_requested(fake)})
        if ctx.response_count == 0:
            return ToolCallReply("delegate_task", {"task": "audit the auth module"})
        if ctx.response_count == 1:
            return AudioReply("Run 1 is starting; I'll say when it lands.", audio_ms=300)
        if ctx.response_count == 2:
            return AudioReply("Sure, go on.", audio_ms=300)
        return AudioReply("Run 1 finished: three gaps.", audio_ms=300)

    async with FakeHermes(key=HERMES_KEY) as hermes, FakeRealtime(script) as fake:
        store = await open_store(tmp_path / "home", MIGRATIONS)
        service = RunService(store, RunsConfig(lanes=("hermes-api",), hermes_url=hermes.url, hermes_key=HERMES_KEY))
        await service.start()
        transport = VirtualTransport()
        transport.context = TurnContext(frozenset({ALICE}))
        catalogue = ToolCatalogue(AllowKnownSpeakers(), run_tools(service))
        provider = OpenAIRealtime(OPENAI_KEY, "gpt-realtime-2.1-mini", "marin", url=fake.url)
        engine = CallEngine(provider, transport, catalogue, Identity("You are a test assistant."),
                            options=CallOptions(endpointing="server"))
        listening = Listening(engine)
        service.attach(listening)
        call = asyncio.create_task(engine.run())
        try:
            transport.push(tone_pcm16(400, 300.0) + silence_pcm16(700))  # "audit the auth module, please"
            ticket = await asyncio.wait_for(service.wait_until(1, lambda t: t.external_id is not None), SAFETY_S)
            assert ticket.requester_id == ALICE and ticket.lane == "hermes-api"
            await fake.wait_for(lambda: fake.response_count >= 2 and not floor_when_requested(fake)["responses_open"],
                                timeout=SAFETY_S)
            transport.push(tone_pcm16(400, 300.0))  # the user starts talking again...
            await fake.wait_for(lambda: floor_when_requested(fake)["user_speaking"], timeout=SAFETY_S)
            hermes.complete(ticket.external_id, output="three gaps in token refresh")  # ...and the run lands
            await asyncio.wait_for(listening.asked.wait(), SAFETY_S)
            transport.push(silence_pcm16(700))  # the user stops; the server answers them first
            done = await asyncio.wait_for(service.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
        finally:
            engine.stop()
            await asyncio.wait_for(call, 5)
            await service.close()
            await store.close()
        fake.assert_clean()
        hermes.assert_clean()

    assert done.state is RunState.COMPLETED and done.announced is True
    assert "three gaps in token refresh" in listening.texts[0]
    announcement = [r for r in requests if "three gaps" in r["instructions"]]
    assert len(announcement) == 1, requests
    # the announcement was asked for only after the user stopped and the server's answer to them was done
    assert requests.index(announcement[0]) == 3 and requests[2]["trigger"] == "vad"
    assert announcement[0] == {**announcement[0], "trigger": "client", "user_speaking": False, "responses_open": 0}
    outputs = [json.loads(e["item"]["output"]) for e in fake.received
               if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"]
    assert outputs[0]["summary"].startswith("run 1 is starting on hermes-api")


async def test_talk_file_mode_delegates_to_a_real_agent_process_and_speaks_the_result_before_ending(tmp_path):
    announced: list[str] = []

    def script(ctx):
        if ctx.response_count == 0:
            return ToolCallReply("delegate_task", {"task": "audit the auth module"})
        if ctx.response_count == 1:
            return AudioReply("Run 1 is starting; I'll say when it lands.", audio_ms=300)
        announced.append(ctx.params.get("instructions", ""))
        return AudioReply("Run 1 finished.", audio_ms=900)

    wav_in, wav_out, home = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "home"
    write_wav(wav_in, [(0.4, True), (1.0, False)])
    # the agent works longer than the call's settle time: the call must stay open for its result
    command = shlex.join([sys.executable, FAKE_AGENT, "answer", "--think", "2.5", "{task}"])
    async with FakeRealtime(script, user_transcripts=["audit the auth module and report back"]) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "SWITCHBOARD_HOME": str(home),
               "OPENAI_API_KEY": OPENAI_KEY, "SWITCHBOARD_REALTIME_URL": fake.url,
               "SWITCHBOARD_AGENT_LANES": "command", "SWITCHBOARD_AGENT_COMMAND": command}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
            "--output-wav", str(wav_out), "--timeout", "60", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        stdout, stderr = out.decode(), err.decode()
        fake.assert_clean()
    assert proc.returncode == 0, stderr
    assert OPENAI_KEY not in stdout + stderr and "Traceback" not in stderr
    assert len(announced) == 1 and "answer: audit the auth module" in announced[0], (announced, stderr)
    assert "run 1 finished on command" in stderr  # the terminal's notification sink
    with wave.open(str(wav_out)) as wav:  # the answer and the whole announcement are in OUT.wav
        assert wav.getnframes() / 24 >= 300 + 900
    with sqlite3.connect(home / DB_FILENAME) as db:
        state, delivery, announced_flag = db.execute(
            "SELECT state, delivery, announced FROM runs WHERE id = 1").fetchone()
    assert (state, delivery, announced_flag) == ("completed", "delivered", 1)


async def test_terminal_sink_prints_a_finished_run_with_its_output_bounded(tmp_path):
    import io

    store = await open_store(tmp_path / "home", MIGRATIONS)
    try:
        service = RunService(store, RunsConfig(lanes=("command",),
                                               command=(sys.executable, FAKE_AGENT, "flood", "--bytes", "9000", "{task}")),
                             sink=TerminalSink(stream := io.StringIO(), output_chars=500))
        await service.start()
        await service.delegate("print a lot")
        await asyncio.wait_for(service.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
        await service.close()
    finally:
        await store.close()
    text = stream.getvalue()
    assert "run 1 finished on command" in text and "switchboard runs show 1" in text
    assert "THE END" not in text  # cut at 500 characters; the rest is in the store


async def test_a_talk_killed_mid_run_leaves_a_ticket_the_next_start_reconciles_with_the_lane(tmp_path):
    def script(ctx):
        if ctx.response_count == 0:
            return ToolCallReply("delegate_task", {"task": "audit the auth module"})
        return AudioReply("Run 1 is starting.", audio_ms=300)

    wav_in, wav_out, home = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "home"
    write_wav(wav_in, [(0.4, True), (1.0, False)])
    async with FakeHermes(key=HERMES_KEY) as hermes, FakeRealtime(script) as fake:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "SWITCHBOARD_HOME": str(home),
               "OPENAI_API_KEY": OPENAI_KEY, "SWITCHBOARD_REALTIME_URL": fake.url,
               "SWITCHBOARD_AGENT_LANES": "hermes-api", "SWITCHBOARD_HERMES_API_URL": hermes.url,
               "SWITCHBOARD_HERMES_API_KEY": HERMES_KEY}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "talk", "--input-wav", str(wav_in),
            "--output-wav", str(wav_out), "--timeout", "60", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            await asyncio.wait_for(hermes.run_created.wait(), SAFETY_S)
            await asyncio.wait_for(hermes.only_run().stream_open.wait(), SAFETY_S)  # talk is following it
        finally:
            proc.kill()  # no chance to clean up: as a crash or an OOM kill would leave it
            await proc.wait()
        run = hermes.only_run()
        hermes.set_status(run.run_id, "completed", output="three gaps")  # it finished while nobody watched

        listing = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--env-file", os.devnull, "runs", "list", "--json", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(listing.communicate(), 30)
        assert listing.returncode == 0, err.decode()
        (row,) = json.loads(out)
        assert row["state"] in ("starting", "running") and row["watched"] is False  # never "still running"

        store = await open_store(home, MIGRATIONS)
        try:
            service = RunService(store, RunsConfig(lanes=("hermes-api",), hermes_url=hermes.url, hermes_key=HERMES_KEY))
            await service.start()
            done = await asyncio.wait_for(service.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
            await service.close()
        finally:
            await store.close()
    assert done.state is RunState.COMPLETED and done.output == "three gaps"
    assert hermes.submissions == 1  # reconciled by asking, never submitted again
