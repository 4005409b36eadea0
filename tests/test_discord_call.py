"""A voice call in Discord, end to end: `switchboard run` (a real process, real discord.py) joins the
fake Discord's voice channel on `/talk join`, hears members through genuine DAVE-encrypted packets
of real speech, talks to the fake Realtime server, and gates a delegation on who actually spoke."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import discord.opus
import pytest

from bot.store import DB_FILENAME
from tests.support.fake_discord import FakeDiscord, SimUser
from tests.support.fake_realtime import AudioReply, FakeRealtime, ToolCallReply
from tests.support.speech import speech_frames
from tests.test_runs_harness import FAKE_AGENT

ROOT = Path(__file__).resolve().parent.parent
OPENAI_KEY = "sk-discord-call-NEVER-SHOWN"
WAIT_S = 30.0


def opus_speech(text: str) -> list[bytes]:
    encoder = discord.opus.Encoder()
    return [encoder.encode(frame, 960) for frame in speech_frames(text)]


@dataclass
class Room:
    fake: FakeDiscord
    realtime: FakeRealtime
    olive: SimUser  # the operator
    gus: SimUser  # a guest whose display name is the operator's
    home: Path
    proc: asyncio.subprocess.Process

    async def command(self, command: str, user: SimUser, options: dict | None = None) -> dict:
        pending = await self.fake.send_interaction(command, options, user=user)
        response = await self.fake.wait_response(pending, timeout=WAIT_S)
        if response["type"] == 5:
            await self.fake.journal.wait_for(lambda: pending.followups, WAIT_S)
            return pending.followups[0]
        return response["data"]

    def tickets(self) -> list[tuple]:
        if not (self.home / DB_FILENAME).exists():
            return []
        with sqlite3.connect(self.home / DB_FILENAME) as db:
            return db.execute("SELECT id, requester_id, task FROM runs ORDER BY id").fetchall()

    def outputs(self) -> list[dict]:
        return [json.loads(e["item"]["output"]) for e in self.realtime.received
                if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"]


def script(ctx):
    """Every turn: check_work (read-only), then delegate_task in the follow-up, then a spoken answer;
    an announcement (asked for with instructions) is spoken."""
    if ctx.trigger == "client" and ctx.params.get("instructions"):
        return AudioReply("Run one has finished.", audio_ms=600)
    step = ctx.response_count % 3
    if step == 0:
        return ToolCallReply("check_work", {})
    if step == 1:
        return ToolCallReply("delegate_task", {"task": "audit the auth module"})
    return AudioReply("On it.", audio_ms=400)


@contextlib.asynccontextmanager
async def room(tmp_path, **extra: str) -> AsyncIterator[Room]:
    async with FakeDiscord(voice=True, workdir=tmp_path) as fake, FakeRealtime(script) as realtime:
        olive, gus = fake.add_user("olive", nick="Olive"), fake.add_user("gus", nick="Olive")
        home = tmp_path / "home"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
               **fake.bot_env(), "DISCORD_BOT_TOKEN": fake.token, "OPENAI_API_KEY": OPENAI_KEY,
               "SWITCHBOARD_REALTIME_URL": realtime.url, "SWITCHBOARD_HOME": str(home),
               "SWITCHBOARD_OPERATOR_USER_IDS": str(olive.id), "SWITCHBOARD_AGENT_LANES": "command",
               "SWITCHBOARD_AGENT_COMMAND": f"{sys.executable} {FAKE_AGENT} answer {{task}}",
               "SWITCHBOARD_RUNS_CHANNEL_ID": str(fake.text_channel.id), **extra}
        log = (tmp_path / "switchboard.log").open("wb")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.support.fake_discord.run_switchboard",
                                                    cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            await fake.wait_gateway_ready(timeout=WAIT_S)
            yield Room(fake, realtime, olive, gus, home, proc)
        finally:
            if proc.returncode is None:
                proc.terminate()  # SIGTERM: the graceful path
            code = await asyncio.wait_for(proc.wait(), 20)
            log.close()
        text = (tmp_path / "switchboard.log").read_text()
        assert code == 0, text[-3000:]
        assert OPENAI_KEY not in text and fake.token not in text
        assert "Traceback" not in text, text[-3000:]
        realtime.assert_clean()


async def join_and_settle(r: Room, member: SimUser) -> None:
    await r.fake.join_voice(member)
    joined = await r.command("talk join", r.olive, {"channel": r.fake.voice_channel.id})
    assert joined["embeds"][0]["title"] == "In the call", joined
    await in_voice(r)
    await r.realtime.wait_received("session.update", timeout=WAIT_S)


async def in_voice(r: Room) -> None:
    """The bot's voice session is described and it is a member of the channel's DAVE group."""
    await r.fake.wait_bot_voice(timeout=WAIT_S)
    await r.fake.journal.wait_for(lambda: r.fake.bot.id in r.fake.voice.relay.members, WAIT_S)


async def say(r: Room, *speakers: SimUser, text: str = "audit the auth module and report back") -> None:
    """Each speaker says `text` (overlapping when several), until the engine commits a turn."""
    frames = opus_speech(text)
    commits = len([e for e in r.realtime.received if e["type"] == "input_audio_buffer.commit"])
    for _attempt in range(3):  # DAVE may still be settling for the first packets: say it again
        await asyncio.gather(*(r.fake.speak(s, frames) for s in speakers))
        with contextlib.suppress(AssertionError):
            await r.realtime.wait_for(lambda: len([e for e in r.realtime.received
                                                   if e["type"] == "input_audio_buffer.commit"]) > commits, 8)
            return
    raise AssertionError("the bot never committed a turn")


async def seed_fact(home, fact: str) -> None:
    """A phone call the listener archived earlier, with one durable fact learned from it."""
    from bot.compose import STORE_MIGRATIONS
    from bot.store import open_store
    from listener.archive import Archive
    from listener.memory import Fact, Memory
    from listener.model import Transcript, Turn

    store = await open_store(home, STORE_MIGRATIONS)
    try:
        call = Transcript("call_1", (Turn(0, "FROM", "My daughter Maya starts school on Monday."),),
                          direction="outbound")
        archived = await Archive(store).archive(call, "raw", received_at=1.0, user_label="FROM")
        await Memory(store).save(archived.transcript_id, [Fact(fact, "Maya starts school on Monday", 0, "FROM")])
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_the_operator_delegates_by_voice_and_the_run_lands_in_the_runs_channel(tmp_path):
    await seed_fact(tmp_path / "home", "The user's daughter Maya starts school on Monday.")
    async with room(tmp_path) as r:
        await join_and_settle(r, r.olive)
        session = next(e["session"] for e in r.realtime.received if e["type"] == "session.update")
        assert "The user's daughter Maya starts school on Monday." in session["instructions"]  # learned from a call
        await say(r, r.olive)
        await r.realtime.wait_for(lambda: len(r.outputs()) >= 2, WAIT_S)
        await r.fake.journal.wait_for(lambda: r.fake.state.messages, WAIT_S)  # the finished run's embed
        status = await r.command("talk status", r.gus)
        await r.realtime.wait_for(lambda: any(e["type"] == "response.done" for e in r.realtime.sent), WAIT_S)
        heard, plain = r.fake.hear_bot(r.olive)
        left = await r.command("talk leave", r.olive)
    outputs = r.outputs()
    assert "summary" in outputs[0] and outputs[1]["summary"].startswith("run 1 is starting on command")
    assert r.tickets() == [(1, r.olive.id, "audit the auth module")]
    context = [e["item"]["content"][0]["text"] for e in r.realtime.received if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "message" and e["item"]["role"] == "system"]
    assert any(f"user id {r.olive.id}" in text for text in context)
    (posted,) = r.fake.state.messages
    assert posted["embeds"][0]["title"] == "Run 1: audit the auth module"
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert f"<@{r.olive.id}>" in fields["heard"] and "ok" in fields["receiver"]
    assert fields["voice activity"] == "silero" and "commit" in fields["last turns (from end of speech)"]
    assert left["embeds"][0]["title"] == "Left the call"
    assert heard, plain  # the member heard the assistant (DAVE frames the fake could open)


@pytest.mark.asyncio
async def test_a_guest_with_the_operators_name_is_refused_and_an_overlap_is_two_turns_only_the_operators_runs(tmp_path):
    async with room(tmp_path) as r:
        await join_and_settle(r, r.gus)
        await say(r, r.gus)
        await r.realtime.wait_for(lambda: len(r.outputs()) >= 2, WAIT_S)
        await r.fake.join_voice(r.olive)
        await say(r, r.olive, r.gus)  # operator and guest at once: each is their own turn
        await r.realtime.wait_for(lambda: len(r.outputs()) >= 6, WAIT_S)
    outputs = r.outputs()
    assert "summary" in outputs[0] and "only an operator can start work" in outputs[1]["error"]
    later = [outputs[3], outputs[5]]  # the delegations of the two overlapping turns
    assert sum(o.get("summary", "").startswith("run 1 is starting") for o in later) == 1
    assert sum("only an operator can start work" in o.get("error", "") for o in later) == 1
    assert r.tickets() == [(1, r.olive.id, "audit the auth module")]
    context = [e["item"]["content"][0]["text"] for e in r.realtime.received if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "message" and e["item"]["role"] == "system"]
    assert len(context) == 3 and all(text.count("user id ") == 1 for text in context)  # one speaker per turn
    assert sum(f"user id {r.olive.id}" in text for text in context) == 1


@pytest.mark.asyncio
async def test_join_leave_join_at_once_still_hears_and_an_empty_channel_is_left(tmp_path):
    async with room(tmp_path, SWITCHBOARD_IDLE_LEAVE_S="0.5") as r:
        await join_and_settle(r, r.olive)
        left = await r.command("talk leave", r.olive)
        again = await r.command("talk join", r.olive, {"channel": r.fake.voice_channel.id})  # at once
        await in_voice(r)
        await say(r, r.olive)  # the second call hears her
        await r.fake.leave_voice(r.olive)  # nobody left: the bot goes after SWITCHBOARD_IDLE_LEAVE_S
        await r.fake.journal.wait_for(lambda: r.fake.state.guild.voice.get(r.fake.bot.id) is None, WAIT_S)
        await r.fake.journal.wait_for(lambda: any("Nobody was left" in m.get("content", "")
                                                  for m in r.fake.state.messages), WAIT_S)
    assert left["embeds"][0]["title"] == "Left the call" and again["embeds"][0]["title"] == "In the call"
