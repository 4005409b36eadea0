"""Calls outlive the process: `switchboard run` killed (-9) or stopped (SIGTERM) mid-call and started again
rejoins the call on its own, with the earlier turns in the new provider session, says once that it is back,
and keeps one row for the call; a channel emptied meanwhile is not rejoined and its call ends."""

from __future__ import annotations

import json

import pytest

from bot.discord.calls import BACK_NOTICE
from tests.support.discord_room import (
    WAIT_S,
    in_voice,
    join_and_settle,
    opus_speech,
    real_time,
    room,
    say,
    speak_live,
)
from tests.support.fake_hermes import FakeHermes
from tests.support.fake_realtime import AudioReply, ToolCallReply
from tests.support.fake_text_model import FakeTextModel
from tests.support.runs import KEY as HERMES_KEY
from voice.call.usage import NO_USAGE, CallUsage

pytestmark = real_time("resume")
ASKED = "my team meets every thursday in room four"
FACT = "The team meets every Thursday in room four."
ASKED_AFTER = "and add a projector"


def script(ctx):
    if ctx.trigger == "client" and ctx.params.get("instructions"):
        return AudioReply("I'm back.", audio_ms=600)
    return AudioReply("Done.", audio_ms=400)


def text_answer(body: dict) -> dict:
    """The fake text model: a summary for the recap, one operator fact for the debrief."""
    if body["response_format"]["json_schema"]["name"] == "call_summary":
        return {"summary": "Olive said the team meets on Thursdays.", "decisions": ["Room four on Thursdays"]}
    return {"facts": [{"fact": FACT, "assertion_turn": 1, "quote": ASKED, "confirmation_turn": None,
                       "confirmation_quote": None, "confidence": "high"}]}


def delegating(ctx):
    """The first turn delegates; announcements (asked for with instructions) are spoken."""
    if ctx.trigger == "client" and ctx.params.get("instructions"):
        return AudioReply("Noted.", audio_ms=600)
    if ctx.response_count == 0:
        return ToolCallReply("delegate_task", {"task": "book the meeting room"})
    return AudioReply("On it.", audio_ms=400)


def asked_to_say(realtime) -> list[str]:
    return [str((e.get("response") or {}).get("instructions")) for e in realtime.received
            if e.get("type") == "response.create" and (e.get("response") or {}).get("instructions")]


def newest_session(realtime) -> list[dict]:
    """What the newest provider session (socket) received."""
    return realtime.received_on(realtime.connections)


def texts(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["item"]["role"], e["item"]["content"][0]["text"]) for e in events
            if e.get("type") == "conversation.item.create" and e["item"]["type"] == "message"]


def reported(realtime) -> CallUsage:
    """Everything the fake reported the calls used (each answer's and transcription's usage), over every
    session and every process."""
    total = NO_USAGE
    for e in realtime.sent:
        if e.get("type") == "response.done" and e["response"].get("usage"):
            total = total.add_response(e["response"]["usage"])
        elif e.get("type") == "conversation.item.input_audio_transcription.completed" and e.get("usage"):
            total = total.add_transcription(e["usage"])
    return total


def row_usage(call: dict) -> CallUsage:
    return CallUsage.from_json(json.loads(call["usage"])) if call["usage"] else NO_USAGE


def back_asked(realtime) -> int:
    return sum(1 for e in realtime.received if e.get("type") == "response.create"
               and BACK_NOTICE in str((e.get("response") or {}).get("instructions") or ""))


@pytest.mark.asyncio
async def test_a_killed_bot_rejoins_its_call_with_the_earlier_turns_and_a_stopped_one_too(tmp_path):
    async with FakeTextModel(key="text-key", model="gpt-test") as text, room(
            tmp_path, script, transcripts={"olive": [ASKED, ASKED_AFTER, ASKED_AFTER]}, SWITCHBOARD_TEXT_URL=text.url,
            SWITCHBOARD_TEXT_API_KEY="text-key", SWITCHBOARD_TEXT_MODEL="gpt-test") as r:
        text.answer = text_answer
        await join_and_settle(r, r.olive)
        await speak_live(r.fake, r.olive, opus_speech(ASKED))  # paced: all of it is heard, seconds of speech
        (call,) = await r.recorded(lambda calls: calls and ("assistant", None, "Done.") in calls[0]["turns"]
                                   and calls[0]["spoken"])
        before = call["spoken"][r.olive.id]  # ms olive spoke before the crash: more than the "yes" below
        # before the kill, the row holds what the provider reported so far, the answer's usage included
        await r.recorded(lambda calls: row_usage(calls[0]).responses and row_usage(calls[0]) == reported(r.realtime))

        await r.kill()  # a crash: nothing is left, nothing marked
        assert r.calls()[0]["state"] == "live"
        await r.start()
        await in_voice(r)  # rejoined on its own: nobody used /talk join
        await r.realtime.wait_for(lambda: back_asked(r.realtime) == 1, WAIT_S)
        restored = texts(newest_session(r.realtime))
        assert ("user", ASKED) in restored and ("assistant", "Done.") in restored  # the earlier turns
        who = restored[restored.index(("user", ASKED)) - 1]
        assert who[0] == "system" and f"user id {r.olive.id}" in who[1]  # with who said them
        await r.fake.journal.wait_for(lambda: r.fake.hear_bot(r.olive)[0], WAIT_S)  # it spoke in the channel
        # "I'm back" is an answer no person's turn follows: its usage reaches the row as it is reported
        await r.recorded(lambda calls: row_usage(calls[0]) == reported(r.realtime))
        status = await r.command("talk status", r.olive)
        usage = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}["usage"]
        assert usage == reported(r.realtime).describe()  # what came before the crash, and since

        await say(r, r.olive, text="yes")  # the call goes on in the same row (a shorter sentence than before)
        await r.recorded(lambda calls: ("user", r.olive.id, ASKED_AFTER) in calls[0]["turns"]
                         and calls[0]["spoken"][r.olive.id] > before)  # counted on from before the crash

        assert await r.terminate() == 0  # a deploy: marked to resume, not ended
        (stopped,) = r.calls()
        assert stopped["state"] == "resume"
        await r.start()
        await in_voice(r)
        await r.realtime.wait_for(lambda: back_asked(r.realtime) == 2, WAIT_S)
        assert ("user", ASKED_AFTER) in texts(newest_session(r.realtime))
        left = await r.command("talk leave", r.olive)
        assert "Left" in left["embeds"][0]["description"], left
        (recap,) = await r.fake.journal.wait_for(lambda: [m for m in r.fake.state.messages if m["embeds"]], WAIT_S)
        (fact,) = await r.stored(r.facts, bool)  # the debrief: the operator's statement, with where it came from
    text.assert_clean()
    assert len(text.requests) == 2  # the summary, then the debrief
    embed = recap["embeds"][0]
    assert embed["title"] == "Call recap" and "Olive said the team meets on Thursdays." in embed["description"]
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert "Olive" in fields["who spoke"] and str(r.olive.id) in embed["footer"]["text"]
    assert (fact["fact"], fact["guild_id"], fact["call_id"], fact["assertion_turn"], fact["speaker"]) == \
        (FACT, r.fake.guild_id, call["id"], 0, str(r.olive.id))  # turn 0: the call's first (seq 1)
    (ended,) = r.calls()  # one row across two restarts
    assert (ended["id"], ended["state"], ended["started_at"]) == (call["id"], "ended", call["started_at"])
    assert [t for t in ended["turns"] if t[0] == "user"] == [("user", r.olive.id, ASKED),
                                                            ("user", r.olive.id, ASKED_AFTER)]


@pytest.mark.asyncio
async def test_a_call_whose_channel_emptied_while_the_bot_was_down_is_ended_not_rejoined(tmp_path):
    async with room(tmp_path, script, transcripts={"olive": [ASKED]}) as r:
        await join_and_settle(r, r.olive)
        await say(r, r.olive)
        await r.recorded(lambda calls: calls and calls[0]["turns"])
        await r.kill()
        await r.fake.leave_voice(r.olive)
        voice_requests = len(r.fake.journal.frames_of("gateway", "in", 4))
        await r.start()
        (call,) = await r.recorded(lambda calls: calls[0]["state"] == "ended")
        assert call["end_reason"] == "nobody was in the channel when Switchboard restarted"
        (recap,) = await r.fake.journal.wait_for(lambda: [m for m in r.fake.state.messages if m["embeds"]], WAIT_S)
        assert len(r.fake.journal.frames_of("gateway", "in", 4)) == voice_requests  # it never asked to join
        assert back_asked(r.realtime) == 0
    embed = recap["embeds"][0]  # the call's recap, from its row: no model here, so no summary
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert embed["title"] == "Call recap" and "Summary unavailable" in embed["description"]
    assert "nobody was in the channel" in fields["ended"] and "Olive" in fields["who spoke"]


@pytest.mark.asyncio
async def test_a_run_that_finished_while_the_bot_was_down_is_announced_in_the_rejoined_call_and_posted_once(tmp_path):
    async with FakeHermes(key=HERMES_KEY) as hermes, room(
            tmp_path, delegating, transcripts={"olive": [ASKED]}, SWITCHBOARD_AGENT_LANES="hermes-api",
            SWITCHBOARD_HERMES_API_URL=hermes.url, SWITCHBOARD_HERMES_API_KEY=HERMES_KEY) as r:
        await join_and_settle(r, r.olive)
        await say(r, r.olive)
        await r.realtime.wait_for(lambda: r.outputs(), WAIT_S)  # run 1 accepted by the agent
        await r.fake.journal.wait_for(lambda: hermes.runs, WAIT_S)
        await r.kill()
        hermes.complete(hermes.only_run().run_id, "room 4 is booked for thursday")  # while nobody watches
        await r.start()
        await in_voice(r)
        await r.realtime.wait_for(lambda: any("Run 1" in said for said in asked_to_say(r.realtime)), WAIT_S)
        said = asked_to_say(r.realtime)
        assert BACK_NOTICE in said[-2] and "Run 1" in said[-1]  # back first, then what finished meanwhile
        await r.fake.journal.wait_for(lambda: any(m["embeds"] for m in r.fake.state.messages), WAIT_S)
        await r.terminate()
        await r.start()  # a second restart: nothing is delivered twice
        await in_voice(r)
        await r.realtime.wait_for(lambda: sum(BACK_NOTICE in s for s in asked_to_say(r.realtime)) == 2, WAIT_S)
    posts = [m for m in r.fake.state.messages if m["embeds"] and m["embeds"][0]["title"].startswith("Run 1")]
    assert len(posts) == 1 and sum("Run 1" in s for s in asked_to_say(r.realtime)) == 1
    hermes.assert_clean()
