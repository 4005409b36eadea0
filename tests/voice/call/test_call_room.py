"""The room in the call core: a turn per speaker, answered one at a time in the order people started
speaking, addressed-only mode, and interruptions that pause first and can be taken back.

Driven with `RoomTick`s (each member's own frame and the probability their VAD gave it), so every
case is a fixed list of inputs; every event the core sends is checked against the GA schema.
"""

from __future__ import annotations

import base64

import numpy as np

from tests.support.call_core import Driven, Speaker, sent
from tests.support.clock import VirtualClock
from voice.call import events as ev
from voice.call.core import (
    CallCore,
    CallOptions,
    PausePlayback,
    ResumePlayback,
    RunTool,
    StopPlayback,
)
from voice.call.providers import OpenAIRealtime, SessionConfig, ToolSpec
from voice.call.transports.base import HeardFrame, RoomTick

ALICE, BOB, CAROL = 111111111111111111, 222222222222222222, 333333333333333333
LOUD = (np.sin(np.arange(480) / 3) * 8000).astype("<i2").tobytes()
VOICED = HeardFrame(LOUD, 0.9)
TICK = 0.02
QUIET_TICKS = 26  # > 500 ms of silence ends a turn


def room(**options) -> tuple[Driven, Speaker]:
    speaker = Speaker()
    provider = OpenAIRealtime("k", "gpt-realtime-2.1-mini", "marin")
    session = SessionConfig("be brief", "marin", (ToolSpec("t", "d", {"type": "object", "properties": {}}),))
    core = CallCore(provider, session, CallOptions(endpointing="local", **options))
    sent(core.start(0.0))
    return Driven(core, speaker), speaker


def play(core: Driven, clock: VirtualClock, schedule: list[set[int]], names: dict[int, str] | None = None) -> list:
    """One tick per entry: the members voiced in it send a frame; everyone else sends nothing."""
    out = []
    for who in schedule:
        frames = {user: VOICED for user in who}
        out += core.core.on_room_audio(RoomTick(frames, names or {}), clock.now, core.speaker.position())
        clock.now += TICK
    return out


def quiet(n: int = QUIET_TICKS) -> list[set[int]]:
    return [set()] * n


def kinds(actions) -> list[str]:
    return [e["type"] for e in sent(actions)]


def context_ids(actions) -> list[int]:
    """The user id each speaker-context item names (exactly one per item, or the test fails)."""
    out = []
    for e in sent(actions):
        if e["type"] == "conversation.item.create" and e["item"].get("role") == "system":
            text = e["item"]["content"][0]["text"]
            ids = [int(w) for w in text.replace(".", " ").replace("(", " ").split() if w.isdigit()]
            assert len(ids) == 1, text
            out.append(ids[0])
    return out


def creates(actions) -> list[dict]:
    return [e for e in sent(actions) if e["type"] == "response.create"]


def answer(core: Driven, rid: str, actions, clock: VirtualClock, *, tool: bool = False) -> list:
    """The provider creates the response asked for last in `actions` and finishes it."""
    metadata = creates(actions)[-1]["response"]["metadata"]
    out = core.on_provider(ev.ResponseCreated(rid, metadata), clock.now)
    if tool:
        out += core.on_provider(ev.FunctionCall(rid, f"{rid}_i", f"{rid}_c", "t", "{}"), clock.now)
    out += core.on_provider(ev.ResponseDone(rid, "completed"), clock.now)
    return out


def origin_of(actions) -> frozenset[int] | None:
    runs = [a for a in actions if isinstance(a, RunTool)]
    return runs[-1].origin.speakers


def test_two_people_talking_over_each_other_are_two_turns_each_naming_exactly_one_speaker():
    core, _ = room()
    clock = VirtualClock()
    # Alice talks for 1 s; Bob starts 200 ms in and stops first.
    out = play(core, clock, [{ALICE}] * 10 + [{ALICE, BOB}] * 20 + [{ALICE}] * 20 + quiet())
    assert context_ids(out) == [ALICE] and kinds(out).count("input_audio_buffer.commit") == 1
    assert len(creates(out)) == 1  # Bob's turn waits until Alice's is answered
    first = answer(core, "r1", out, clock, tool=True)
    assert origin_of(first) == frozenset({ALICE})
    assert "input_audio_buffer.commit" not in kinds(first)  # her answer is not over: its tool is running
    follow = core.on_tool_result("r1_c", '"ok"', clock.now)
    after = answer(core, "r2", follow, clock)
    assert context_ids(after) == [BOB] and kinds(after)[-2:] == ["input_audio_buffer.commit", "response.create"]
    second = answer(core, "r3", after, clock, tool=True)
    assert origin_of(second) == frozenset({BOB})


def test_the_speaker_context_names_the_committed_speaker_while_another_still_talks():
    core, _ = room()
    clock = VirtualClock()
    names = {ALICE: "Alice", BOB: "Bob"}
    # Alice talks for 400 ms; Bob starts 200 ms before she stops and talks on long after her turn ends.
    out = play(core, clock, [{ALICE}] * 10 + [{ALICE, BOB}] * 10 + [{BOB}] * 40, names)
    assert kinds(out).count("input_audio_buffer.commit") == 1 and core.speakers.speaking.keys() == {BOB}
    (context,) = [e["item"]["content"][0]["text"] for e in sent(out) if e["type"] == "conversation.item.create"]
    assert context_ids(out) == [ALICE] and '"Alice"' in context and "Bob" not in context
    out = answer(core, "r1", out, clock) + play(core, clock, quiet(), names)  # Bob's turn, once he stops
    assert context_ids(out) == [BOB] and '"Bob"' in str(sent(out))


def test_the_first_speaker_streams_live_and_an_overlapping_speaker_is_buffered_whole_until_their_turn():
    core, _ = room()
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 5 + [{ALICE, BOB}] * 15 + quiet())
    events = sent(out)
    commit_at = [e["type"] for e in events].index("input_audio_buffer.commit")
    live = [e for e in events[:commit_at] if e["type"] == "input_audio_buffer.append"]
    sizes = [len(base64.b64decode(e["audio"])) for e in live]
    assert len(live) >= 8 and set(sizes[:-1]) == {5 * 960}  # Alice's audio went out while she spoke, 100 ms at a time
    bobs = [base64.b64decode(e["audio"]) for e in events[commit_at:] if e["type"] == "input_audio_buffer.append"]
    # Bob's whole turn, appended only once Alice's was committed: 2 frames of prefix, 13 voiced, 25 of silence
    assert sum(len(b) for b in bobs) == 40 * 960 and len(bobs) == 1
    assert "input_audio_buffer.commit" in kinds(answer(core, "r1", out, clock))


def test_a_remark_that_starts_later_is_answered_after_the_earlier_speaker_even_if_it_ends_first():
    core, _ = room()
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 5 + [{ALICE, BOB}] * 5 + [{ALICE}] * 60 + quiet())
    assert context_ids(out) == [ALICE]
    assert context_ids(answer(core, "r1", out, clock)) == [BOB]


def test_ten_people_speaking_at_once_are_ten_turns_in_order_and_none_is_lost():
    core, _ = room()
    clock = VirtualClock()
    people = [ALICE + i for i in range(10)]
    out = play(core, clock, [set(people)] * 40 + quiet())
    order = context_ids(out)
    for n in range(1, 10):
        out = answer(core, f"r{n}", out, clock, tool=True)
        assert origin_of(out) == frozenset({order[-1]})
        out = answer(core, f"f{n}", core.on_tool_result(f"r{n}_c", '"ok"', clock.now), clock)
        order += context_ids(out)
    assert order == people  # each person once, in the order they started (the tick's order)
    assert core.counters["turns"] == 10


def test_a_member_whose_packets_stop_is_a_member_who_stopped():
    core, _ = room()
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 20 + quiet(QUIET_TICKS - 2))  # Discord sends nothing in silence
    assert "input_audio_buffer.commit" not in kinds(out)
    out = play(core, clock, quiet(2))
    assert kinds(out)[-2:] == ["input_audio_buffer.commit", "response.create"]


def test_a_monologue_is_cut_at_the_turn_length_cap_so_others_get_their_turn():
    core, _ = room(max_turn_ms=1000)
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 10 + [{ALICE, BOB}] * 10 + [{ALICE}] * 70 + quiet())
    order = context_ids(out)
    for n in range(1, 4):
        out = answer(core, f"r{n}", out, clock)
        order += context_ids(out)
    assert order[:3] == [ALICE, BOB, ALICE] and core.counters["turns_cut"] >= 1


def speaking_assistant(core: Driven, speaker: Speaker, clock: VirtualClock) -> list:
    """Alice asks; the assistant answers and is heard (300 ms played of 2 s received)."""
    out = play(core, clock, [{ALICE}] * 20 + quiet())
    core.on_provider(ev.ResponseCreated("r1", creates(out)[-1]["response"]["metadata"]), clock.now)
    core.on_provider(ev.AudioDelta("r1", "a1", bytes(48 * 2000)), clock.now)
    speaker.playing, speaker.played["a1"] = True, 300
    return out


def test_a_cough_over_the_answer_pauses_it_and_it_plays_on_with_the_response_kept():
    core, speaker = room(min_interruption_ms=400)
    clock = VirtualClock()
    speaking_assistant(core, speaker, clock)
    cough = play(core, clock, [{BOB}] * 10)  # 200 ms
    assert any(isinstance(a, PausePlayback) for a in cough)
    assert not any(isinstance(a, StopPlayback) for a in cough)
    after = play(core, clock, quiet())
    assert any(isinstance(a, ResumePlayback) for a in after)
    assert "response.cancel" not in kinds(cough + after) and "conversation.item.truncate" not in kinds(cough + after)
    assert core.counters["backchannels"] == 1 and core.counters["barge_ins"] == 0
    done = core.on_provider(ev.ResponseDone("r1", "completed"), clock.now)
    assert "input_audio_buffer.commit" not in kinds(after + done)  # a cough is not a turn, now or later
    assert not core.speakers.queue


def test_a_real_interruption_truncates_at_what_was_heard_and_cancels_once_it_lasts():
    core, speaker = room(min_interruption_ms=400)
    clock = VirtualClock()
    speaking_assistant(core, speaker, clock)
    start = play(core, clock, [{BOB}] * 15)  # 300 ms: paused, not yet judged
    assert any(isinstance(a, PausePlayback) for a in start) and "response.cancel" not in kinds(start)
    more = play(core, clock, [{BOB}] * 10)  # past 400 ms of speech: a real interruption
    assert any(isinstance(a, StopPlayback) for a in more)
    truncate = [e for e in sent(more) if e["type"] == "conversation.item.truncate"]
    assert truncate and truncate[0]["audio_end_ms"] == 300 and kinds(more).count("response.cancel") == 1


def test_with_no_minimum_any_speech_over_the_assistant_interrupts_at_once():
    core, speaker = room(min_interruption_ms=0)
    clock = VirtualClock()
    speaking_assistant(core, speaker, clock)
    start = play(core, clock, [{BOB}] * 3)
    assert any(isinstance(a, StopPlayback) for a in start) and "response.cancel" in kinds(start)


def addressed_room(**options):
    return room(reply_to="addressed", addressed=lambda text: text.lower().startswith("ares,"), **options)


def committed(core: Driven, item: str, text: str | None, clock: VirtualClock) -> list:
    out = core.on_provider(ev.InputCommitted(item), clock.now)
    if text is None:
        return out + core.on_provider(ev.UserTranscriptFailed(item), clock.now)
    return out + core.on_provider(ev.UserTranscript(item, text), clock.now)


def test_addressed_mode_commits_every_turn_but_answers_only_the_one_that_names_the_assistant():
    core, _ = addressed_room()
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 20 + quiet())
    assert context_ids(out) == [ALICE] and "input_audio_buffer.commit" in kinds(out) and not creates(out)
    out = committed(core, "item_a", "I like turtles", clock)
    assert not creates(out) and core.counters["unanswered"] == 1
    out = play(core, clock, [{BOB}] * 20 + quiet())
    assert context_ids(out) == [BOB] and not creates(out)
    out = committed(core, "item_b", "Ares, start the audit", clock)
    assert len(creates(out)) == 1
    assert origin_of(answer(core, "r1", out, clock, tool=True)) == frozenset({BOB})


def test_addressed_mode_answers_the_same_speaker_continuing_soon_after_and_nobody_else():
    core, _ = addressed_room(followup_s=15.0)
    clock = VirtualClock()
    play(core, clock, [{BOB}] * 20 + quiet())
    answered = answer(core, "r1", committed(core, "i1", "Ares, what is on today?", clock), clock)
    assert answered is not None
    clock.now += 5
    play(core, clock, [{BOB}] * 20 + quiet())
    again = committed(core, "i2", "and tomorrow?", clock)
    assert creates(again)  # Bob, 5 s after his answer
    answer(core, "r2", again, clock)
    clock.now += 5
    play(core, clock, [{ALICE}] * 20 + quiet())
    assert not creates(committed(core, "i3", "and tomorrow?", clock))  # Alice was never answered
    clock.now += 30
    play(core, clock, [{BOB}] * 20 + quiet())
    assert not creates(committed(core, "i4", "and the day after?", clock))  # too long after
    assert core.counters["followups"] == 1 and core.counters["addressed"] == 1


def test_addressed_mode_counts_the_follow_up_window_from_the_answer_after_a_slow_tool_not_the_first_answer():
    core, _ = addressed_room(followup_s=15.0)
    clock = VirtualClock()
    play(core, clock, [{BOB}] * 20 + quiet())
    answer(core, "r1", committed(core, "i1", "Ares, run the audit", clock), clock, tool=True)  # "on it" + a tool
    clock.now += 20  # the tool takes 20 s; its answer is the last thing Bob heard
    answer(core, "r2", core.on_tool_result("r1_c", '"three gaps"', clock.now), clock)
    clock.now += 8
    play(core, clock, [{BOB}] * 20 + quiet())
    assert creates(committed(core, "i2", "which one first?", clock))  # 8 s after that answer, 29 s after the first
    assert core.counters["followups"] == 1


def test_addressed_mode_leaves_a_turn_unanswered_when_its_words_never_come_and_moves_on():
    core, _ = addressed_room(transcript_wait_s=2.0)
    clock = VirtualClock()
    play(core, clock, [{ALICE}] * 20 + quiet())
    core.on_provider(ev.InputCommitted("i1"), clock.now)
    out = play(core, clock, [{BOB}] * 20 + quiet())
    assert context_ids(out) == []  # Bob waits behind Alice's undecided turn
    wake = core.wake_at()
    assert wake is not None
    out = core.tick(wake)
    assert core.counters["transcripts_late"] == 1 and context_ids(out) == [BOB]
    failed = committed(core, "i2", None, clock)  # a failed transcription: not addressed
    assert not creates(failed) and core.counters["unanswered"] == 2


def test_addressed_mode_keeps_playing_over_talk_not_meant_for_it_and_stops_for_talk_that_is():
    core, speaker = addressed_room(min_interruption_ms=400)
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 20 + quiet())
    out = committed(core, "i1", "Ares, tell me a story", clock)
    core.on_provider(ev.ResponseCreated("r1", creates(out)[-1]["response"]["metadata"]), clock.now)
    core.on_provider(ev.AudioDelta("r1", "a1", bytes(48 * 5000)), clock.now)
    core.on_provider(ev.ResponseDone("r1", "completed"), clock.now)
    speaker.playing, speaker.played["a1"] = True, 400
    chat = play(core, clock, [{BOB}] * 30 + quiet())  # 600 ms of Bob talking to someone else
    assert any(isinstance(a, PausePlayback) for a in chat) and not any(isinstance(a, StopPlayback) for a in chat)
    decided = committed(core, "i2", "did you see the game", clock)
    assert any(isinstance(a, ResumePlayback) for a in decided) and "response.cancel" not in kinds(decided)
    talk = play(core, clock, [{CAROL}] * 30 + quiet())
    decided = committed(core, "i3", "Ares, stop, that's enough", clock)
    assert any(isinstance(a, PausePlayback) for a in talk)
    assert any(isinstance(a, StopPlayback) for a in decided) and len(creates(decided)) == 1


def test_speech_that_started_before_the_answer_never_interrupts_it():
    core, speaker = room(min_interruption_ms=0)
    clock = VirtualClock()
    out = play(core, clock, [{ALICE}] * 20 + [{BOB}] * 30)  # Alice's turn ends while Bob talks on
    core.on_provider(ev.ResponseCreated("r1", creates(out)[-1]["response"]["metadata"]), clock.now)
    core.on_provider(ev.AudioDelta("r1", "a1", bytes(48 * 2000)), clock.now)
    speaker.playing, speaker.played["a1"] = True, 100
    more = play(core, clock, [{BOB}] * 10)  # Bob was already talking when the answer started
    assert not any(isinstance(a, (PausePlayback, StopPlayback)) for a in more)


def test_a_commit_the_provider_never_confirms_does_not_shift_the_next_turns_words_onto_it():
    core, _ = addressed_room(transcript_wait_s=2.0)
    clock = VirtualClock()
    play(core, clock, [{ALICE}] * 20 + quiet())  # Alice's commit is refused: no item, no transcription
    play(core, clock, [{BOB}] * 20 + quiet())
    core.tick(core.wake_at())  # her turn is left unanswered; Bob's is committed
    out = committed(core, "item_bob", "Ares, start the audit", clock)
    assert len(creates(out)) == 1  # Bob's own words answer Bob's turn
    assert origin_of(answer(core, "r1", out, clock, tool=True)) == frozenset({BOB})
