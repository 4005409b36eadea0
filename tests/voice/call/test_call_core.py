"""The sans-I/O call core driven with fixed event lists; every event it sends is schema-checked."""

from __future__ import annotations

from tests.support.call_core import Driven, make_core, sent, types
from voice.call import events as ev
from voice.call.core import (
    LOST_TURN_NOTICE,
    RECONNECTED_NOTICE,
    AnnouncementResult,
    PlayAudio,
    RunTool,
    StopPlayback,
)


def created(core: Driven, rid: str, actions_before) -> list:
    """Echo the metadata of the last response.create in `actions_before` as the server would."""
    creates = [e for e in sent(actions_before) if e["type"] == "response.create"]
    metadata = creates[-1].get("response", {}).get("metadata", {}) if creates else {}
    return core.on_provider(ev.ResponseCreated(rid, metadata), 1.0)


def test_two_calls_in_one_response_get_one_follow_up_after_both_outputs():
    core, _ = make_core()
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    runs = core.on_provider(ev.FunctionCall("r1", "i1", "c1", "t", "{}"), 0.1)
    runs += core.on_provider(ev.FunctionCall("r1", "i2", "c2", "t", "{}"), 0.1)
    assert [a.call_id for a in runs if isinstance(a, RunTool)] == ["c1", "c2"]
    assert types(core.on_provider(ev.ResponseDone("r1", "completed"), 0.2)) == []
    assert types(core.on_tool_result("c1", '"a"')) == ["conversation.item.create"]
    assert types(core.on_tool_result("c2", '"b"')) == ["conversation.item.create", "response.create"]
    assert types(core.on_tool_result("c2", '"again"')) == []  # answered exactly once


def test_repeated_function_call_event_runs_the_tool_once():
    core, _ = make_core()
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    first = core.on_provider(ev.FunctionCall("r1", "i1", "c1", "t", "{}"), 0.1)
    again = core.on_provider(ev.FunctionCall("r1", "i1", "c1", "t", "{}"), 0.1)
    assert len([a for a in first if isinstance(a, RunTool)]) == 1 and again == []


def test_busy_provider_error_requeues_our_response_until_the_floor_is_free():
    core, _ = make_core()
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    core.on_provider(ev.FunctionCall("r1", "i1", "c1", "t", "{}"), 0.0)
    core.on_provider(ev.ResponseDone("r1", "completed"), 0.0)
    follow = core.on_tool_result("c1", '"x"')
    assert "response.create" in types(follow)
    core.on_provider(ev.ProviderError("conversation_already_has_active_response", "busy"), 0.1)
    core.on_provider(ev.ResponseCreated("r_auto"), 0.1)  # the server's own response won the race
    again = core.on_provider(ev.ResponseDone("r_auto", "completed"), 0.5)
    assert types(again) == ["response.create"]


def test_barge_in_truncates_at_what_was_heard_never_more_than_received():
    core, speaker = make_core()
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    core.on_provider(ev.AudioDelta("r1", "item1", bytes(48 * 100)), 0.0)  # 100 ms received
    speaker.playing, speaker.played["item1"] = True, 250  # a speaker claiming more than it got
    actions = core.on_provider(ev.SpeechStarted(), 0.3)
    assert isinstance(actions[0], StopPlayback)
    truncate = [e for e in sent(actions) if e["type"] == "conversation.item.truncate"][0]
    assert truncate["audio_end_ms"] == 100
    assert types(actions).count("response.cancel") == 1
    speaker.playing = False  # the transport obeyed StopPlayback
    assert core.on_provider(ev.AudioDelta("r1", "item1", bytes(960)), 0.31) == []  # stale
    assert types(core.on_provider(ev.SpeechStarted(), 0.4)) == []  # cancelled once only


def test_announcement_cut_off_by_barge_in_is_retried_then_delivered():
    core, speaker = make_core()
    ask = core.announce(7, "build is green")
    assert types(ask) == ["response.create"]
    created(core, "r1", ask)
    core.on_provider(ev.AudioDelta("r1", "a1", bytes(4800)), 0.0)
    speaker.playing = True
    core.on_provider(ev.SpeechStarted(), 0.1)
    speaker.playing = False
    core.on_provider(ev.SpeechStopped(), 0.5)
    retry = core.on_provider(ev.ResponseDone("r1", "cancelled"), 0.6)
    assert retry == []  # the user's turn comes first; the server answers it
    assert types(core.on_user_audio(bytes(960), 1.0)) == ["input_audio_buffer.append"]
    core.on_provider(ev.ResponseCreated("r_user"), 0.7)
    retry = core.on_provider(ev.ResponseDone("r_user", "completed"), 0.9)
    assert types(retry) == ["response.create"]
    assert "build is green" in sent(retry)[0]["response"]["instructions"]
    created(core, "r2", retry)
    done = core.on_provider(ev.ResponseDone("r2", "completed"), 1.5)
    assert AnnouncementResult(7, True) in done


def test_an_announcement_in_flight_when_the_socket_drops_is_asked_again_on_the_new_one_and_delivered():
    core, _ = make_core()
    assert types(core.announce(7, "build is green", 0.0)) == ["response.create"]
    core.on_disconnect(0.1)  # before its response.created: the request went with the socket, not the announcement
    notice = core.on_reconnected(0.5)  # first the call hears that the line dropped ...
    assert RECONNECTED_NOTICE in sent(notice)[-1]["response"]["instructions"]
    created(core, "r2", notice)
    again = core.on_provider(ev.ResponseDone("r2", "completed"), 1.0)  # ... then the announcement, again
    assert types(again) == ["response.create"] and "build is green" in sent(again)[0]["response"]["instructions"]
    created(core, "r3", again)
    assert AnnouncementResult(7, True) in core.on_provider(ev.ResponseDone("r3", "completed"), 1.5)


def test_announcements_pending_at_the_end_are_reported_undelivered():
    core, speaker = make_core()
    speaker.playing = True  # the assistant is talking: the announcement must wait
    assert core.announce(3, "later") == []
    assert core.end() == [AnnouncementResult(3, False)]
    assert core.announce(4, "too late") == [AnnouncementResult(4, False)]


def test_reconnect_restores_a_computed_tool_output_and_asks_for_the_follow_up():
    core, _ = make_core()
    core.on_provider(ev.UserTranscript("u1", "audit the auth module"), 0.0)
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    core.on_provider(ev.FunctionCall("r1", "i1", "c9", "t", '{"x": 1}'), 0.0)
    core.on_provider(ev.ResponseDone("r1", "completed"), 0.0)
    follow = core.on_tool_result("c9", '"three gaps"')
    assert "response.create" in types(follow)
    core.on_disconnect()  # before the follow-up response was created
    restored = sent(core.on_reconnected())
    kinds = [(e["type"], e.get("item", {}).get("type")) for e in restored]
    assert kinds[0] == ("session.update", None)
    assert ("conversation.item.create", "message") in kinds
    assert ("conversation.item.create", "function_call") in kinds
    assert ("conversation.item.create", "function_call_output") in kinds
    assert kinds[-1] == ("response.create", None)


def test_local_turn_commits_only_after_the_silence_window():
    core, _ = make_core("local")
    import numpy as np

    loud = (np.sin(np.arange(480) / 3) * 8000).astype("<i2").tobytes()
    quiet = bytes(960)
    out = []
    for _ in range(10):
        out += core.on_user_audio(loud, 0.0)
    for i in range(24):
        out += core.on_user_audio(quiet, 0.2 + i * 0.02)
    assert "input_audio_buffer.commit" not in types(out)
    out = core.on_user_audio(quiet, 0.7)
    assert types(out)[-2:] == ["input_audio_buffer.commit", "response.create"]


def test_audio_is_only_played_for_live_responses():
    core, _ = make_core()
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    actions = core.on_provider(ev.AudioDelta("r1", "i1", b"\x01\x00" * 480), 0.1)
    assert actions == [PlayAudio("i1", b"\x01\x00" * 480)]


def test_a_rejected_response_request_does_not_jam_the_floor():
    core, _ = make_core()
    first = sent(core.announce(5, "deploy finished"))
    assert first[0]["event_id"].startswith("sb_")
    retry = sent(core.on_provider(ev.ProviderError("invalid_value", "bad", first[0]["event_id"]), 0.1))
    assert [e["type"] for e in retry] == ["response.create"]  # retried once
    final = core.on_provider(ev.ProviderError("invalid_value", "bad", retry[0]["event_id"]), 0.2)
    assert AnnouncementResult(5, False) in final
    core.on_provider(ev.ResponseCreated("r1"), 0.3)
    core.on_provider(ev.FunctionCall("r1", "i1", "c1", "t", "{}"), 0.3)
    core.on_provider(ev.ResponseDone("r1", "completed"), 0.3)
    assert "response.create" in types(core.on_tool_result("c1", '"ok"'))


def test_announcement_hold_after_server_vad_expires_if_the_server_never_answers():
    core, _ = make_core()
    core.on_provider(ev.SpeechStarted(), 0.0)
    core.on_provider(ev.SpeechStopped(), 0.5)
    assert core.announce(1, "hello") == []  # the server's own answer goes first
    assert types(core.on_user_audio(bytes(960), 2.1)) == ["input_audio_buffer.append"]
    assert types(core.on_user_audio(bytes(960), 5.6)) == ["input_audio_buffer.append", "response.create"]


def announced(actions) -> list[str]:
    """The instructions of every spoken announcement (a response with no tools) the core asked for."""
    return [e["response"]["instructions"] for e in sent(actions)
            if e["type"] == "response.create" and e.get("response", {}).get("tool_choice") == "none"]


def test_a_session_that_hits_its_maximum_duration_rolls_over_silently_with_the_recent_turns():
    core, _ = make_core()
    core.on_provider(ev.UserTranscript("u1", "audit the auth module"), 0.0)
    core.on_provider(ev.ResponseCreated("r1"), 0.0)
    core.on_provider(ev.ResponseDone("r1", "completed"), 0.1)
    expiry = core.on_provider(ev.ProviderError("session_expired", "Your session hit the maximum duration of 60 "
                                               "minutes."), 3600.0)
    assert not announced(expiry) and core.core.last_error is None  # not a failure, and nothing said
    core.on_disconnect(3600.0)
    restored = core.on_reconnected(3600.3)
    kinds = [(e["type"], e.get("item", {}).get("type")) for e in sent(restored)]
    assert kinds[0] == ("session.update", None) and ("conversation.item.create", "message") in kinds
    assert announced(restored) == []  # no "the connection dropped", no apology
    assert core.core.counters["rollovers"] == 1


def test_a_rollover_that_cut_an_answer_short_asks_for_the_turn_again_and_a_plain_drop_still_says_so():
    core, _ = make_core()
    core.on_provider(ev.UserTranscript("u1", "audit the auth module"), 0.0)
    core.on_provider(ev.ResponseCreated("r1"), 0.0)  # streaming when the session ends
    core.on_provider(ev.ProviderError("session_expired", "Your session hit the maximum duration."), 3600.0)
    core.on_disconnect(3600.0)
    [said] = announced(core.on_reconnected(3600.3))
    assert said.count(LOST_TURN_NOTICE) == 1
    core.on_disconnect(3700.0)  # no expiry this time: a dropped connection is still announced
    [said] = announced(core.on_reconnected(3700.3))
    assert RECONNECTED_NOTICE in said and LOST_TURN_NOTICE not in said
