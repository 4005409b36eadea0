"""The call core's lifecycle (an explicit state, misuse is an error or a tested no-op), its floor rules
for announcements, and its turn records handed out as actions instead of written."""

from __future__ import annotations

import pytest

from tests.support.call_core import LOUD, QUIET, make_core, sent, speak, turn_of, types
from voice.call import events as ev
from voice.call.core import AnnouncementResult, CallState, InvalidState, RecordTurn


def test_start_twice_and_reconnected_without_a_drop_are_errors():
    core, _ = make_core()
    assert core.state is CallState.OPEN
    with pytest.raises(InvalidState):
        core.core.start(1.0)
    with pytest.raises(InvalidState):
        core.on_reconnected(1.0)


def test_after_end_nothing_is_sent_and_end_is_idempotent():
    core, _ = make_core("server")  # server endpointing: every frame would be an append
    assert types(core.on_user_audio(LOUD, 0.9)) == ["input_audio_buffer.append"]
    core.end(1.0)
    assert core.state is CallState.ENDED
    assert core.on_user_audio(LOUD, 1.1) == []
    assert core.on_provider(ev.ResponseCreated("r1"), 1.2) == []
    assert core.on_provider(ev.SpeechStarted(), 1.2) == []
    assert core.tick(1.3) == [] and core.end(1.4) == [] and core.on_disconnect(1.5) == []
    assert core.on_reconnected(1.6) == []
    assert core.announce(9, "late", 1.7) == [AnnouncementResult(9, False)]


def test_audio_while_reconnecting_is_dropped_and_counted_not_sent():
    core, _ = make_core()
    core.on_disconnect(1.0)
    assert core.state is CallState.RECONNECTING
    assert core.on_user_audio(LOUD, 1.1) == []
    assert core.counters["audio_dropped_offline"] == 1
    assert types(core.on_reconnected(1.2))[0] == "session.update"
    assert core.state is CallState.OPEN
    assert types(core.on_user_audio(LOUD, 1.3)) == ["input_audio_buffer.append"]


def test_a_turn_cut_off_by_a_drop_is_kept_and_the_next_speakers_turn_is_theirs_alone():
    core, _ = make_core("local")
    alice, bob = 111111111111111111, 222222222222222222
    speak(core, [(LOUD, turn_of(alice)[0][1])] * 5)  # mid-turn ...
    core.on_disconnect(1.0)  # ... the input buffer is gone with the socket, her audio is not
    again = sent(core.on_reconnected(1.1))
    assert [e["type"] for e in again].count("input_audio_buffer.append") == 1  # her kept audio, appended again
    out = speak(core, turn_of(bob), start=2.0)  # she says nothing more: her turn ends and goes first
    creates = [e for e in sent(out) if e["type"] == "response.create"]
    assert len(creates) == 1  # Bob's turn waits until hers is answered
    core.on_provider(ev.ResponseCreated("r1", creates[0]["response"]["metadata"]), 3.0)
    runs = core.on_provider(ev.FunctionCall("r1", "i", "c", "t", "{}"), 3.1)
    assert runs[-1].origin.speakers == frozenset({alice})
    notice = sent(core.on_provider(ev.ResponseDone("r1", "completed"), 3.2))  # "the connection ... is back"
    core.on_provider(ev.ResponseCreated("r_notice", notice[-1]["response"]["metadata"]), 3.21)
    core.on_provider(ev.ResponseDone("r_notice", "completed"), 3.22)
    follow = core.on_tool_result("c", '"ok"', 3.3)
    core.on_provider(ev.ResponseCreated("r2", sent(follow)[-1]["response"]["metadata"]), 3.4)
    after = core.on_provider(ev.ResponseDone("r2", "completed"), 3.5)  # her answer is over: Bob's turn now
    creates = [e for e in sent(after) if e["type"] == "response.create"]
    assert [e["type"] for e in sent(after)][-2:] == ["input_audio_buffer.commit", "response.create"]
    core.on_provider(ev.ResponseCreated("r3", creates[0]["response"]["metadata"]), 3.6)
    runs = core.on_provider(ev.FunctionCall("r3", "i3", "c3", "t", "{}"), 3.7)
    assert runs[-1].origin.speakers == frozenset({bob})


def test_turn_records_come_out_as_actions_for_the_shell_to_write():
    core, speaker = make_core()
    core.on_provider(ev.SpeechStarted(), 0.0)
    core.on_provider(ev.SpeechStopped(), 0.5)
    core.on_provider(ev.InputCommitted(), 0.55)
    core.on_provider(ev.ResponseCreated("r1"), 0.7)
    core.on_provider(ev.AudioDelta("r1", "a1", bytes(960)), 0.8)
    speaker.playing, speaker.played["a1"] = True, 20
    assert not [a for a in core.on_playback_started("a1", 0.9, speaker.position()) if isinstance(a, RecordTurn)]
    done = core.on_provider(ev.ResponseDone("r1", "completed"), 1.0)
    records = [a.record for a in done if isinstance(a, RecordTurn)]
    assert len(records) == 1 and records[0].latencies_ms()["first_audio_played"] == pytest.approx(400.0)
    assert not hasattr(core.core, "telemetry")  # the core holds no writer


def test_an_announcement_asked_for_while_the_user_speaks_waits_for_the_servers_slow_answer():
    core, speaker = make_core()
    core.on_provider(ev.SpeechStarted(), 0.0)
    assert core.announce(1, "run 3 finished", 0.1) == []
    core.on_provider(ev.SpeechStopped(), 0.5)
    core.on_provider(ev.InputCommitted(), 0.5)
    for t in (0.6, 1.5, 2.2, 3.0):  # the server takes 2.5 s to answer: still nothing of ours
        assert types(core.on_user_audio(QUIET, t)) == ["input_audio_buffer.append"]
        assert types(core.tick(t)) == []
    core.on_provider(ev.ResponseCreated("r_answer"), 3.0)
    core.on_provider(ev.AudioDelta("r_answer", "a1", bytes(4800)), 3.1)
    speaker.playing, speaker.played["a1"] = True, 40
    assert types(core.on_provider(ev.ResponseDone("r_answer", "completed"), 3.2)) == []  # still audible
    speaker.playing, speaker.played["a1"] = False, 100
    after = core.core.on_playback_idle(3.3, speaker.position())
    assert types(after) == ["response.create"] and "run 3 finished" in sent(after)[0]["response"]["instructions"]


def test_an_announcement_asked_for_during_a_local_turn_goes_after_that_turns_answer():
    core, speaker = make_core("local")
    speak(core, [(LOUD, None)] * 5)
    assert core.user_speaking and core.announce(2, "build is green", 0.2) == []
    out = speak(core, [(QUIET, None)] * 26, start=0.3)
    creates = [e for e in sent(out) if e["type"] == "response.create"]
    assert len(creates) == 1 and "instructions" not in creates[0].get("response", {})  # the turn's answer
    core.on_provider(ev.ResponseCreated("r1", creates[0]["response"]["metadata"]), 1.0)
    after = core.on_provider(ev.ResponseDone("r1", "completed"), 1.2)
    assert "build is green" in sent(after)[0]["response"]["instructions"]


def test_the_call_core_imports_nothing_that_does_io():
    """Sans-I/O: importing the core brings in no socket, file-writing, audio or event-loop module."""
    import subprocess
    import sys

    probe = ("import sys, voice.call.core; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('voice', 'websockets', 'sounddevice', 'aiosqlite', 'httpx', 'discord', 'asyncio', 'socket'))))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.split())
    assert not loaded & {"voice.call.telemetry", "voice.call.engine", "voice.call.transports.playback_queue", "voice.media.playback",
                         "websockets", "sounddevice", "aiosqlite", "httpx", "discord", "asyncio", "socket"}, loaded
    assert {"voice.call.core", "voice.call.floor", "voice.call.turns", "voice.call.turn_record"} <= loaded
