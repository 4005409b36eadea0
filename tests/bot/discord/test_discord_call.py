"""A voice call in Discord, end to end: `switchboard run` (a real process, real discord.py) joins the
fake Discord's voice channel on `/talk join`, hears members through genuine DAVE-encrypted packets
of real speech, talks to the fake Realtime server, and gates a delegation on who actually spoke."""

from __future__ import annotations

import pytest

from tests.support.discord_room import (
    WAIT_S,
    dave_settled,
    in_voice,
    join_and_settle,
    real_time,
    room,
    say,
)
from tests.support.fake_realtime import AudioReply, ToolCallReply

pytestmark = real_time("call")
SAID = "audit the auth module and report back"


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


async def seed_fact(home, fact: str) -> None:
    """A phone call the listener archived earlier, with one durable fact learned from it."""
    from bot.services import STORE_MIGRATIONS
    from common.store import open_store
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
    async with room(tmp_path, script, transcripts={"olive": [SAID]}) as r:
        await join_and_settle(r, r.olive)
        session = next(e["session"] for e in r.realtime.received if e["type"] == "session.update")
        # a phone call's fact is the owner's: a Discord call never starts knowing it (everyone there would hear it)
        assert "Maya" not in session["instructions"]
        await say(r, r.olive)
        (call,) = await r.recorded(lambda calls: calls and any(t[0] == "user" for t in calls[0]["turns"]))
        assert (call["state"], call["started_by"], call["mode"], call["guild_id"], call["voice_channel_id"]) == \
            ("live", r.olive.id, "everyone", r.fake.state.guild.id, r.fake.voice_channel.id)
        assert ("user", r.olive.id, SAID) in call["turns"]  # the transcription, with who spoke it
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
    posted, recap = r.fake.state.messages  # the run's result, then the call's recap
    assert posted["embeds"][0]["title"] == "Run 1: audit the auth module"
    assert {"name": "started in", "value": f"voice call call-{call['id']}", "inline": True} in posted["embeds"][0]["fields"]
    assert recap["embeds"][0]["title"] == "Call recap"
    recap_fields = {f["name"]: f["value"] for f in recap["embeds"][0]["fields"]}
    assert "/runs show 1" in recap_fields["runs started"] and "Olive" in recap_fields["who spoke"]
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert f"<@{r.olive.id}>" in fields["heard"] and "ok" in fields["receiver"]
    assert fields["voice activity"] == "silero" and "commit" in fields["last turns (from end of speech)"]
    usage = fields["usage"]  # the check_work answer at least is done, so the fake reported what it used
    assert " tokens in (audio " in usage and "; cached " in usage and " out (audio " in usage, usage
    assert left["embeds"][0]["title"] == "Left the call"
    assert heard, plain  # the member heard the assistant (DAVE frames the fake could open)
    (call,) = r.calls()  # left on /talk leave: ended, not to be resumed
    assert (call["state"], call["end_reason"]) == ("ended", f"/talk leave by {r.olive.id}")
    assert call["ended_at"] is not None and any(role == "assistant" for role, _, _ in call["turns"])


@pytest.mark.asyncio
async def test_a_guest_with_the_operators_name_is_refused_and_an_overlap_is_two_turns_only_the_operators_runs(tmp_path):
    async with room(tmp_path, script) as r:
        await join_and_settle(r, r.gus)
        await say(r, r.gus)
        await r.realtime.wait_for(lambda: len(r.outputs()) >= 2, WAIT_S)
        await r.fake.join_voice(r.olive)
        await dave_settled(r)  # the bot holds olive's key (and gus's new one) before either speaks
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
    (call,) = r.calls()  # the room ended with SIGTERM (a deploy): marked to resume, not ended
    assert (call["state"], call["ended_at"], call["started_by"]) == ("resume", None, r.olive.id)
    assert {speaker for role, speaker, _ in call["turns"] if role == "user"} == {r.olive.id, r.gus.id}


@pytest.mark.asyncio
async def test_join_leave_join_at_once_still_hears_and_an_empty_channel_is_left(tmp_path):
    async with room(tmp_path, script, SWITCHBOARD_IDLE_LEAVE_S="0.5") as r:
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


@pytest.mark.asyncio
async def test_a_call_at_its_length_limit_says_so_leaves_and_posts_why(tmp_path):
    async with room(tmp_path, script, SWITCHBOARD_CALL_MAX_MINUTES="0.05") as r:  # 3 s
        await join_and_settle(r, r.olive)
        await r.fake.journal.wait_for(lambda: r.fake.state.guild.voice.get(r.fake.bot.id) is None, WAIT_S)
        await r.fake.journal.wait_for(lambda: any("SWITCHBOARD_CALL_MAX_MINUTES" in m.get("content", "")
                                                  for m in r.fake.state.messages), WAIT_S)
    said = [e["response"].get("instructions", "") for e in r.realtime.received if e["type"] == "response.create"]
    assert any("reached its limit of 0.05 minutes" in text for text in said), said  # told in the call first
    [posted] = [m["content"] for m in r.fake.state.messages if "SWITCHBOARD_CALL_MAX_MINUTES" in m.get("content", "")]
    assert f"<#{r.fake.voice_channel.id}>" in posted and "/talk join" in posted

