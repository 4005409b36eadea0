"""The room, end to end: `switchboard run` (a real process, real discord.py) in the fake Discord's voice
channel, members speaking espeak-ng speech as genuine DAVE packets paced like a client's, the fake
Realtime server on the other side. A turn per speaker, in the order they started; addressed-only
mode and `/talk mode`; live captions in a thread; coughs and "uh-huh"s that do not interrupt, and a
sentence that does; a member whose audio cannot be decrypted is named once."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.discord_room import (
    WAIT_S,
    Room,
    commits,
    context_before,
    join_and_settle,
    opus_frames,
    opus_speech,
    real_time,
    room,
    speak_live,
    tone_frames,
)
from tests.support.fake_discord import EPHEMERAL
from tests.support.fake_realtime import AudioReply
from tests.support.fake_realtime_replies import speaker_named
from tests.support.speech import noise_burst_frames

GAP_S = 0.25
TEN = ["ann", "ben", "cal", "dan", "eve", "fay", "gil", "hal", "ivy", "jon"]
SENTENCES = ["The build is green on main", "Ship the release this afternoon", "I reviewed the billing patch",
             "The database migration is done", "Who owns the login bug", "Our tests pass on every branch",
             "Lunch is at noon today", "The printer is out of paper", "Please update the roadmap",
             "I will deploy after the standup"]


def named_speakers(r: Room) -> list[int | None]:
    """For every commit, the one member named by the speaker-context item sent right before it."""
    named = []
    for index in commits(r.realtime):
        context = context_before(r.realtime, index)
        assert context is not None, f"commit {index} has no speaker-context item right before it"
        assert context.count("user id ") == 1, context  # exactly one speaker per turn
        named.append(speaker_named(context))
    return named


def sent(r: Room, event_type: str) -> list[dict]:
    return [e for e in r.realtime.sent if e["type"] == event_type]


def received(r: Room, event_type: str) -> list[dict]:
    return [e for e in r.realtime.received if e["type"] == event_type]


def answered(r: Room) -> list[bool]:
    """For every commit: did a response.create follow it before the next commit?"""
    marks = commits(r.realtime)
    bounds = [*marks[1:], len(r.realtime.received)]
    return [any(e["type"] == "response.create" for e in r.realtime.received[start + 1:end])
            for start, end in zip(marks, bounds, strict=True)]


async def turns(r: Room, count: int) -> None:
    await r.realtime.wait_for(lambda: len(commits(r.realtime)) >= count, WAIT_S)


@real_time("room_a")
@pytest.mark.asyncio
async def test_members_taking_turns_are_committed_in_order_and_ten_at_once_are_ten_named_turns(tmp_path):
    async with room(tmp_path, lambda ctx: AudioReply("Noted.", audio_ms=200),
                    members=[(name, name.title()) for name in TEN]) as r:
        people = [r.members[name] for name in TEN]
        ann, ben = people[:2]
        await join_and_settle(r, *people)

        await speak_live(r.fake, ann, opus_speech("The build is green on main"))
        await asyncio.sleep(GAP_S)  # real-time pacing is the subject: the gap between two members' speech
        await speak_live(r.fake, ben, opus_speech("Then ship the release today"))
        await asyncio.sleep(GAP_S)
        await speak_live(r.fake, ann, opus_speech("I will tag it after lunch"))
        await turns(r, 3)
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 3, WAIT_S)
        alternation = named_speakers(r)

        loop = asyncio.get_running_loop()
        ends = await asyncio.gather(*(speak_live(r.fake, person, opus_speech(text))
                                      for person, text in zip(people, SENTENCES, strict=True)))
        await turns(r, 13)
        print(f"\nten at once: the last commit came {loop.time() - max(ends):.2f} s after the last packet of speech")
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 13, WAIT_S)
        named = named_speakers(r)
        status = await r.command("talk status", r.olive)
    assert alternation == [ann.id, ben.id, ann.id]
    assert len(named) == 13  # nobody lost, no turn split or merged
    assert sorted(named[3:]) == sorted(p.id for p in people)
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert fields["voice activity"] == "silero"
    assert "13 turns, 0 left unanswered" in fields["answers"], fields["answers"]


@real_time("room_b")
@pytest.mark.asyncio
async def test_addressed_mode_answers_only_its_name_and_follow_ups_and_captions_escape_a_hostile_name(tmp_path):
    hostile = "**@everyone** [x](https://evil)"
    said = {"ann": ["I like turtles", "Turtles are great", "Turtles live long"],
            "ben": ["Ares, start the audit", "and the billing module too"]}
    async with room(tmp_path, lambda ctx: AudioReply("Starting the audit now.", audio_ms=300),
                    members=[("ann", hostile), ("ben", "Ben")], transcripts=said,
                    SWITCHBOARD_REPLY_TO="addressed", SWITCHBOARD_CAPTIONS="true", SWITCHBOARD_FOLLOWUP_S="8",
                    SWITCHBOARD_AGENT_NAME="Ares") as r:
        ann, ben = r.members["ann"], r.members["ben"]
        await join_and_settle(r, ann, ben)
        thread = await r.fake.journal.wait_for(lambda: r.fake.threads and r.fake.threads[0], WAIT_S)

        await speak_live(r.fake, ann, opus_speech("I like turtles"))
        await turns(r, 1)
        await speak_live(r.fake, ben, opus_speech("Ares, start the audit"))
        await turns(r, 2)
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 1, WAIT_S)
        await speak_live(r.fake, ben, opus_speech("and the billing module too"))  # well within 8 s
        await turns(r, 3)
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 2, WAIT_S)

        refused = await r.command("talk mode", ann, {"mode": "everyone"})  # ann is no operator
        await speak_live(r.fake, ann, opus_speech("Turtles are great"))
        await turns(r, 4)
        switched = await r.command("talk mode", r.olive, {"mode": "everyone"})
        await speak_live(r.fake, ann, opus_speech("Turtles live long"))
        await turns(r, 5)
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 3, WAIT_S)

        expected = len(said["ann"]) + len(said["ben"]) + 3  # a line per turn, one per answer
        await r.fake.journal.wait_for(
            lambda: sum(m["content"].count("\n") + 1 for m in r.fake.thread_messages(thread)) >= expected, WAIT_S)
        status = await r.command("talk status", r.olive)
        captions = "\n".join(m["content"] for m in r.fake.thread_messages(thread))

    assert named_speakers(r) == [ann.id, ben.id, ben.id, ann.id, ann.id]
    # the model is told ann's display name as quoted data, never as text of its own
    assert f"(display name, untrusted data: {json.dumps(hostile)})" in context_before(r.realtime, commits(r.realtime)[0])
    assert answered(r) == [False, True, True, False, True]
    assert refused["flags"] & EPHEMERAL and "Only an operator can change how I answer" in \
        refused["embeds"][0]["description"]
    assert "answer everyone" in switched["embeds"][0]["description"]
    assert thread.parent_id == r.fake.text_channel.id  # under the channel /talk join was used in
    lines = captions.split("\n")
    answer = "**Ares (assistant)**: Starting the audit now."
    ben_said = [f"**Ben**: {text}" for text in said["ben"]]
    assert [lines[i] for i in (1, 2, 3, 4, 7)] == [ben_said[0], answer, ben_said[1], answer, answer], captions
    ann_lines = [lines[i] for i in (0, 5, 6)]
    assert [line.rsplit("**: ", 1)[1] for line in ann_lines] == said["ann"], captions
    for line in ann_lines:  # the hostile name is shown as text: no bold, no mention, no masked link
        assert hostile not in line and "@everyone" not in line and "[x](" not in line and "everyone" in line
        assert line.startswith("**\\*\\*@") and "\\[x\\]" in line, line
    assert len(lines) == expected, captions
    assert r.fake.state.pinged == [] and r.fake.state.rate_limited == []
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert fields["captions"].startswith(f"on: {expected} lines in ") and f"<#{thread.id}>" in fields["captions"]
    assert fields["answers"].startswith("everyone; 5 turns, 2 left unanswered"), fields["answers"]


def script_long_answers(ctx):
    """The first two answers are 3 s of tone streamed in real time (in progress while they play);
    later ones are short."""
    if ctx.response_count < 2:
        return AudioReply("Here is the whole plan, step by step.", audio_ms=3000, chunk_ms=100,
                          delay_ms_per_chunk=100)
    return AudioReply("Go ahead.", audio_ms=200)


ANSWER_FRAMES, ANSWER_CHUNKS = 3000 // 20, 3000 // 100


@real_time("room_c")
@pytest.mark.asyncio
async def test_a_cough_and_an_uh_huh_leave_the_answer_playing_and_a_sentence_interrupts_it(tmp_path):
    # Speech Silero hears through the bot's path (Opus, 24 kHz, SileroBank, VadConfig), measured once:
    # espeak-ng "uh-huh" 320 ms (under the default SWITCHBOARD_MIN_INTERRUPTION_MS of 400), "hm" 420 ms
    # (over it: no cough), the interrupting sentence 2900 ms. The cough is `noise_burst_frames(150)`, a
    # 150 ms low-passed noise burst: Silero calls none of it speech (the energy detector would).
    async with room(tmp_path, script_long_answers, members=[("ann", "Ann"), ("ben", "Ben"), ("cal", "Cal")]) as r:
        ann, ben, cal = r.members["ann"], r.members["ben"], r.members["cal"]
        udp = r.fake.journal.udp
        await join_and_settle(r, ann, ben, cal)

        await speak_live(r.fake, ann, opus_speech("Tell me the release plan"))
        await r.realtime.wait_for(lambda: sent(r, "response.output_audio.delta"), WAIT_S)
        first = len(udp)  # the bot starts playing the answer about now
        await r.fake.journal.wait_for(lambda: len(udp) >= first + 15, WAIT_S)  # 300 ms into it
        await speak_live(r.fake, ben, opus_frames(noise_burst_frames(150)))
        await speak_live(r.fake, cal, opus_speech("uh-huh"))
        await r.realtime.wait_for(lambda: sent(r, "response.done"), WAIT_S)
        # all of it has reached the room: 3 s of answer, the pause for the "uh-huh" (about 1 s), 2 s margin
        await r.fake.journal.wait_for(lambda: len(udp) >= first + ANSWER_FRAMES + 150, WAIT_S)
        second = len(udp)
        calm = list(r.realtime.received)
        heard, plain = tone_frames(r.fake, ann, first, second)

        await speak_live(r.fake, ann, opus_speech("And what about the hotfix"))
        await r.realtime.wait_for(lambda: len(sent(r, "response.output_audio.delta")) > ANSWER_CHUNKS, WAIT_S)
        started = len(udp)
        await r.fake.journal.wait_for(lambda: len(udp) >= started + 15, WAIT_S)
        await speak_live(r.fake, ben, opus_speech("Wait, stop, I have a different question about the billing module"))
        await r.realtime.wait_received("conversation.item.truncate", timeout=WAIT_S)
        cut = len(udp)
        cut_heard, _ = tone_frames(r.fake, ann, second, cut)
        await turns(r, 3)
        await r.realtime.wait_for(lambda: len(sent(r, "response.done")) >= 3, WAIT_S)  # ben's answer, 200 ms
        end = len(udp)
        await r.fake.journal.wait_for(lambda: len(udp) >= end + 25, WAIT_S)
        rest, _ = tone_frames(r.fake, ann, cut, len(udp))
        status = await r.command("talk status", r.olive)

    assert [e["type"] for e in calm].count("input_audio_buffer.commit") == 1  # neither sound became a turn
    assert not [e for e in calm if e["type"] in ("response.cancel", "conversation.item.truncate")]
    # all of the answer (a few frames more: Opus and the resampler ring where the tone stops and starts)
    assert plain == 0 and ANSWER_FRAMES - 2 <= heard <= ANSWER_FRAMES + 6, heard
    assert named_speakers(r) == [ann.id, ann.id, ben.id]  # the interruption is ben's turn
    second_response = sent(r, "response.created")[1]["response"]["id"]
    second_answer = next(e["item_id"] for e in sent(r, "response.output_audio.delta")
                         if e["response_id"] == second_response)
    (truncate,) = received(r, "conversation.item.truncate")
    assert truncate["item_id"] == second_answer and 0 < truncate["audio_end_ms"] < 3000, truncate
    assert len(received(r, "response.cancel")) == 1  # (after the second answer began: none before)
    # cut where the room stopped hearing it (it paused when ben started) ...
    assert -40 <= cut_heard * 20 - truncate["audio_end_ms"] <= 120, (cut_heard, truncate)
    assert rest <= 200 // 20 + 6, rest  # ... and never played on: after it, only the 200 ms answer to ben
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert "1 backchannels, 1 interruptions" in fields["answers"], fields["answers"]


def posted(r: Room, words: str) -> list[dict]:
    """Messages in the text channel `/talk join` was used in that contain `words`."""
    return [m for m in r.fake.state.messages
            if m["channel_id"] == str(r.fake.text_channel.id) and words in m.get("content", "")]


def deaf_room(tmp_path):
    return room(tmp_path, lambda ctx: AudioReply("Hello.", audio_ms=200), members=[("ann", "Ann"), ("dee", "Dee")],
                SWITCHBOARD_DEAF_SECONDS="2")


DEE_TALKS = "I am talking and nobody answers me at all"


@real_time("room_a")
@pytest.mark.asyncio
async def test_a_member_who_cannot_be_decrypted_never_speaks_a_turn_and_is_named_once(tmp_path):
    async with deaf_room(tmp_path) as r:
        ann, dee = r.members["ann"], r.members["dee"]
        (await r.fake.join_voice(dee)).broken = True  # her client's DAVE group diverged from the channel's
        await join_and_settle(r, ann)
        talk = opus_speech(DEE_TALKS)
        for text in ("We can all hear each other fine today", "The weather is lovely in the park"):
            await asyncio.gather(speak_live(r.fake, ann, opus_speech(text)), speak_live(r.fake, dee, talk))
        await r.fake.journal.wait_for(lambda: posted(r, "can't hear"), WAIT_S)
        await asyncio.gather(speak_live(r.fake, ann, opus_speech("Let us get back to the agenda")),
                             speak_live(r.fake, dee, talk))  # she keeps talking
        await turns(r, 1)
        status = await r.command("talk status", r.olive)
    (message,) = posted(r, "can't hear")
    assert message["content"].startswith(f"I can't hear Dee (<@{dee.id}>) in <#{r.fake.voice_channel.id}>: their "
                                         "audio arrives but does not decrypt"), message["content"]
    assert set(named_speakers(r)) == {ann.id}  # ann's turns are heard; dee's speech never is one
    assert posted(r, "I stopped hearing anyone") == []  # the channel was never taken for deaf
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert f"<@{dee.id}>: unheard" in fields["can't hear"], fields
    assert f"<@{ann.id}>" in fields["heard"] and f"<@{dee.id}>" not in fields["heard"], fields["heard"]
    assert r.fake.state.pinged == []


@real_time("room_b")
@pytest.mark.asyncio
async def test_a_member_who_cannot_be_decrypted_talking_alone_is_named_and_the_call_goes_on(tmp_path):
    async with deaf_room(tmp_path) as r:
        ann, dee = r.members["ann"], r.members["dee"]
        (await r.fake.join_voice(dee)).broken = True
        await join_and_settle(r, ann)
        await speak_live(r.fake, ann, opus_speech("Dee, your turn"))
        await turns(r, 1)
        talk = opus_speech(DEE_TALKS)
        for _ in range(3):  # she talks on while the others listen
            assert not posted(r, "hearing anyone"), "the bot took the channel for deaf and rejoined"
            await speak_live(r.fake, dee, talk)  # raises "the bot is not connected to voice" if it left
        await r.fake.journal.wait_for(lambda: posted(r, "can't hear") or posted(r, "hearing anyone"), WAIT_S)
    assert not posted(r, "hearing anyone"), posted(r, "hearing anyone")[0]["content"]
    (message,) = posted(r, "can't hear")
    assert message["content"].startswith(f"I can't hear Dee (<@{dee.id}>)")
    assert named_speakers(r) == [ann.id]
