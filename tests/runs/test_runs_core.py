"""The pure parts of the runs service, driven with fixed inputs: state transitions, steering receipts,
Hermes wire mapping, output capping, the command template and profile detection, spoken text."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.agent_command import (
    TemplateError,
    build_argv,
    child_environment,
    detect_profile,
    names_model,
    resolve_profile,
)
from runs.capture import CappedOutput, cap_text
from runs.core import (
    Accepted,
    ApprovalAnswered,
    ApprovalRequested,
    AskApproval,
    Finished,
    InvalidTransition,
    Progress,
    Running,
    RunState,
    RunTicket,
    Settle,
    SteerReceipt,
    SteerState,
    StopOnLane,
    StopRequested,
    advance,
    receipt_on_finish,
    receipt_on_pending,
    receipt_on_stop,
)
from runs.hermes_wire import (
    DEFAULT_APPROVAL_CHOICES,
    HERMES_STOPPED,
    NotHermes,
    decode_event,
    event_observations,
    parse_capabilities,
    pending_notes,
    status_observation,
)
from runs.wording import announcement, approval_question, elapsed_words, voice_choices

T0 = 1000.0


def ticket(**changes) -> RunTicket:
    base = RunTicket(id=3, lane="hermes-api", task="audit the auth module", state=RunState.STARTING,
                     created_at=T0, updated_at=T0)
    return replace(base, **changes)


def step(t: RunTicket, obs, now: float = T0 + 1):
    return advance(t, obs, now, approval_timeout_s=120)


def running() -> RunTicket:
    return step(ticket(), Accepted("run_1")).ticket


# -- transitions -----------------------------------------------------------------------------------

def test_accepted_moves_a_starting_run_to_running_with_its_lane_id():
    result = step(ticket(), Accepted("run_abc"), now=T0 + 2)
    assert result.ticket.state is RunState.RUNNING
    assert result.ticket.external_id == "run_abc" and result.ticket.started_at == T0 + 2
    assert result.effects == ()


def test_a_second_acceptance_under_another_id_is_a_lane_bug():
    assert step(running(), Accepted("run_1")).ticket == running()
    with pytest.raises(InvalidTransition):
        step(running(), Accepted("run_2"))


def test_progress_before_acceptance_is_kept_other_reports_are_refused_and_repeats_change_nothing():
    queued = step(ticket(), Progress("queued at Hermes: it is busy")).ticket  # a lane waiting for room
    assert queued.state is RunState.STARTING and queued.progress == "queued at Hermes: it is busy"
    with pytest.raises(InvalidTransition):
        step(ticket(), Running())
    once = step(running(), Progress("using web_search")).ticket
    assert once.progress == "using web_search"
    assert step(once, Progress("using web_search"), now=T0 + 50).ticket is once


def test_a_stop_requested_while_starting_is_carried_out_once_the_lane_accepts():
    stopped = step(ticket(), StopRequested("changed my mind", by=42)).ticket
    assert stopped.state is RunState.STARTING and stopped.stop.by == 42
    result = step(stopped, Accepted("run_9"))
    assert result.effects == (StopOnLane(),)


def test_an_approval_request_waits_asks_once_and_resumes_on_answer():
    result = step(running(), ApprovalRequested("req_1", ("once", "always", "deny"), "delete build/"), now=T0 + 10)
    waiting = result.ticket
    assert waiting.state is RunState.WAITING_FOR_APPROVAL
    assert result.effects == (AskApproval(waiting.approval),)
    assert waiting.approval.deadline == T0 + 10 + 120
    # the same request seen again (status poll after the event) asks nothing new
    again = step(waiting, ApprovalRequested("req_1", ("once", "always", "deny"), "delete build/"))
    assert again.effects == () and again.ticket is waiting
    resumed = step(waiting, ApprovalAnswered("deny")).ticket
    assert resumed.state is RunState.RUNNING and resumed.approval is None
    # a poll that shows the run going again also clears a question answered elsewhere
    assert step(waiting, Running()).ticket.state is RunState.RUNNING


def test_finishing_settles_once_and_late_reports_are_ignored():
    result = step(running(), Finished(RunState.COMPLETED, output="three gaps"), now=T0 + 60)
    done = result.ticket
    assert done.state is RunState.COMPLETED and done.finished_at == T0 + 60
    assert result.effects == (Settle(),)
    late = step(done, Finished(RunState.FAILED, error="late"))
    assert late.ticket is done and late.effects == ()
    assert step(done, Progress("x")).ticket is done


def test_a_submission_failure_finishes_a_starting_run_as_failed():
    result = step(ticket(), Finished(RunState.FAILED, error="hermes-api could not start it"))
    assert result.ticket.state is RunState.FAILED and result.effects == (Settle(),)


def test_a_run_killed_after_a_user_stop_is_cancelled_not_failed():
    stopped = step(running(), StopRequested("wrong repo")).ticket
    killed = step(stopped, Finished(RunState.FAILED, error="killed (SIGTERM)", interrupted=True)).ticket
    assert killed.state is RunState.CANCELLED and killed.error == "stopped: wrong repo"
    # without a stop request, a kill is a failure
    crashed = step(running(), Finished(RunState.FAILED, error="killed (SIGKILL)", interrupted=True)).ticket
    assert crashed.state is RunState.FAILED


def test_a_run_stopped_for_its_timeout_is_failed_with_the_reason():
    timed = step(running(), StopRequested("it ran past its 30 minutes budget", kind="timeout")).ticket
    ended = step(timed, Finished(RunState.CANCELLED, interrupted=True)).ticket
    assert ended.state is RunState.FAILED and "budget" in ended.error
    # a timeout overrides an earlier user stop reason; a second user stop changes nothing
    user_first = step(step(running(), StopRequested("x")).ticket, StopRequested("budget", kind="timeout")).ticket
    assert user_first.stop.kind == "timeout"
    assert step(timed, StopRequested("again")).ticket.stop.kind == "timeout"


def test_finishing_into_a_non_terminal_state_is_refused():
    with pytest.raises(InvalidTransition):
        step(running(), Finished(RunState.RUNNING))


# -- steering receipts -----------------------------------------------------------------------------

def receipt(**changes) -> SteerReceipt:
    return replace(SteerReceipt(1, 3, "sb-1a2b3c4d", "focus on token refresh", SteerState.QUEUED, T0, T0), **changes)


def test_a_note_lands_only_after_being_seen_pending_and_then_gone():
    r = receipt()
    assert receipt_on_pending(r, "", T0) == r  # never listed: nothing proven
    seen = receipt_on_pending(r, "[sb-1a2b3c4d] focus on token refresh", T0 + 1)
    assert seen.state is SteerState.QUEUED and seen.seen_pending
    still = receipt_on_pending(seen, "[sb-1a2b3c4d] focus…\n[sb-ffff0000] other", T0 + 2)
    assert still.state is SteerState.QUEUED
    landed = receipt_on_pending(seen, "[sb-ffff0000] another note", T0 + 3)
    assert landed.state is SteerState.LANDED and landed.updated_at == T0 + 3


def test_a_note_with_identical_text_but_another_token_does_not_land_this_receipt():
    seen = receipt(seen_pending=True)
    assert receipt_on_pending(seen, "[sb-99999999] focus on token refresh\n[sb-1a2b3c4d] x", T0).state \
        is SteerState.QUEUED


def test_finish_settles_queued_notes_by_what_can_be_proven():
    seen = receipt(seen_pending=True)
    assert receipt_on_finish(seen, RunState.COMPLETED, None, T0).state is SteerState.LANDED
    assert receipt_on_finish(seen, RunState.COMPLETED, "[sb-1a2b3c4d] focus", T0).state is SteerState.UNCONFIRMED
    assert receipt_on_finish(receipt(), RunState.COMPLETED, None, T0).state is SteerState.UNCONFIRMED
    # a stopped or failed run drops its notes: their absence proves nothing
    assert receipt_on_finish(seen, RunState.CANCELLED, None, T0).state is SteerState.SUPERSEDED
    assert receipt_on_finish(seen, RunState.FAILED, None, T0).state is SteerState.UNCONFIRMED
    assert receipt_on_finish(seen, RunState.LOST, None, T0).state is SteerState.UNCONFIRMED
    landed = receipt(state=SteerState.LANDED)
    assert receipt_on_finish(landed, RunState.CANCELLED, None, T0) == landed


def test_a_stop_supersedes_only_queued_notes():
    assert receipt_on_stop(receipt(), T0).state is SteerState.SUPERSEDED
    landed = receipt(state=SteerState.LANDED)
    assert receipt_on_stop(landed, T0) == landed


# -- Hermes wire -----------------------------------------------------------------------------------

CAPS = {"object": "hermes.api_server.capabilities", "platform": "hermes-agent", "model": "hermes-agent",
        "features": {"run_submission": True, "run_status": True, "run_events_sse": True, "run_stop": True,
                     "run_approval_response": True}}


def test_capabilities_are_feature_detected_never_assumed():
    features = parse_capabilities(CAPS)
    assert features.events and features.stop and features.approval and not features.steer
    with pytest.raises(NotHermes):
        parse_capabilities({"object": "list", "data": []})
    with pytest.raises(NotHermes, match="run_submission"):
        parse_capabilities({**CAPS, "features": {"run_status": True}})


def test_run_events_decode_from_the_json_name_or_the_sse_field():
    assert decode_event("message", json.dumps({"event": "tool.started", "tool": "x"}))[0] == "tool.started"
    assert decode_event("run.failed", json.dumps({"error": "boom"}))[0] == "run.failed"
    assert decode_event("message", "not json") is None
    assert decode_event("message", json.dumps({"no": "name"})) is None


def test_run_events_map_to_observations():
    assert event_observations("tool.started", {"tool": "web_search", "preview": "auth"}) == \
        [Progress("using web_search: auth")]
    approval = event_observations("approval.request", {"request_id": "r1", "choices": ["once", "always", "deny"],
                                                       "command": "rm -rf build"})[0]
    assert approval == ApprovalRequested("r1", ("once", "always", "deny"), "rm -rf build")
    assert event_observations("run.completed", {"output": "ok"}) == [Finished(RunState.COMPLETED, output="ok")]
    # bare: nobody here asked (a gateway shutting down); a stop we asked for overrides it (core._finish)
    assert event_observations("run.cancelled", {}) == [Finished(RunState.CANCELLED, error=HERMES_STOPPED,
                                                                interrupted=True)]
    assert event_observations("run.steered", {"accepted": True}) == []
    assert event_observations("reasoning.delta", {"text": "…"}) == []


def test_run_statuses_map_to_observations():
    assert status_observation({"status": "running"}) == Running()
    assert status_observation({"status": "stopping"}) == Running()
    assert status_observation({"status": "failed", "error": "x"}) == Finished(RunState.FAILED, error="x")
    lost = status_observation({"status": "interrupted", "error": "The gateway restarted."})
    assert lost.state is RunState.LOST and "interrupted" in lost.error
    waiting = status_observation({"status": "waiting_for_approval",
                                  "approval": {"request_id": "r2", "description": "push to main"}})
    assert waiting == ApprovalRequested("r2", DEFAULT_APPROVAL_CHOICES, "push to main")
    # 0.19.0's status names no question: the one its stream put keeps its choices, else Hermes's default
    asked = ApprovalRequested(None, ("once", "deny"), "rm -rf build")
    assert status_observation({"status": "waiting_for_approval"}, asked) == asked
    bare = status_observation({"status": "waiting_for_approval"})
    assert bare.choices == DEFAULT_APPROVAL_CHOICES and "needs permission" in bare.description
    assert status_observation({"status": "something-new"}) is None
    assert pending_notes({"pending_steer": ["a", "b"]}) == "a\nb"
    assert pending_notes({"status": "running"}) == ""


# -- output capping --------------------------------------------------------------------------------

def test_output_under_the_cap_is_kept_whole():
    capture = CappedOutput(64)
    capture.feed(b"hello ")
    capture.feed(b"world")
    assert capture.text() == "hello world" and capture.cut == 0


def test_output_over_the_cap_keeps_head_and_tail_and_says_how_much_was_cut():
    capture = CappedOutput(400)
    data = b"".join(f"line {i:04d}\n".encode() for i in range(1000))
    capture.feed(data)
    text = capture.text()
    assert text.startswith("line 0000\n") and text.endswith("line 0999\n")
    assert capture.cut == len(data) - 400
    assert f"{capture.cut} bytes cut" in text


@settings(derandomize=True, max_examples=60, deadline=None)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=8),
       cap=st.integers(16, 1000))
def test_capping_does_not_depend_on_how_the_stream_was_chunked(data, cuts, cap):
    whole, pieces = CappedOutput(cap), CappedOutput(cap)
    whole.feed(data)
    edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for start, end in zip(edges, edges[1:], strict=False):
        pieces.feed(data[start:end])
    assert pieces.text() == whole.text() and pieces.cut == whole.cut == max(0, len(data) - cap)


def test_cap_text_reports_whether_it_cut():
    assert cap_text("short", 100) == ("short", False)
    text, cut = cap_text("x" * 5000, 1000)
    assert cut and "bytes cut" in text and len(text) < 1200


# -- command template and profile ------------------------------------------------------------------

def test_the_task_stays_one_argument_whatever_it_contains():
    task = 'fix it; rm -rf / && echo "$HOME" `id` --profile evil'
    argv = build_argv(("hermes", "-z", "{task}"), task, None)
    assert argv == ["hermes", "-z", task]
    assert build_argv(("agent", "--prompt={task}"), "a b", None) == ["agent", "--prompt=a b"]


def test_a_profile_is_passed_right_after_the_program():
    assert build_argv(("hermes", "-z", "{task}"), "t", "work") == ["hermes", "--profile", "work", "-z", "t"]


def test_a_template_without_a_task_placeholder_is_refused():
    with pytest.raises(TemplateError, match=r"\{task\}"):
        build_argv(("hermes", "-z"), "t", None)
    with pytest.raises(TemplateError, match="empty"):
        build_argv((), "t", None)


@pytest.mark.parametrize("text,named", [
    ("model:\n  default: gpt-5\n  provider: x\n", True),
    ("model: claude-sonnet\n", True),
    ("model:\n  default: ''\nother: 1\n", False),
    ("model:\n  provider: openrouter\nagent:\n  default: yes\n", False),
    ("model: {default: gpt-5, provider: x}\n", True),
    ("model: {}\n", False),
    ("# model: commented\nagent: 1\n", False),
    ("", False),
])
def test_names_model_reads_only_the_top_level_model_key(text, named):
    assert names_model(text) is named


def make_home(tmp_path: Path, root: str, profiles: dict[str, str]) -> Path:
    home = tmp_path / "hermes"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(root)
    for name, text in profiles.items():
        (home / "profiles" / name).mkdir(parents=True)
        (home / "profiles" / name / "config.yaml").write_text(text)
    return home


def test_the_single_profile_naming_a_model_is_picked_when_the_root_names_none(tmp_path):
    home = make_home(tmp_path, "agent: {}\n", {"work": "model:\n  default: gpt-5\n", "empty": "agent: 1\n"})
    assert detect_profile(home) == "work"
    assert resolve_profile(("hermes", "-z", "{task}"), None, home) == "work"
    assert resolve_profile(("/opt/hermes/bin/hermes", "-z", "{task}"), None, home) == "work"


def test_no_profile_flag_for_a_root_model_or_zero_or_several_candidates(tmp_path):
    assert detect_profile(make_home(tmp_path / "a", "model: gpt-5\n", {"work": "model: x\n"})) is None
    assert detect_profile(make_home(tmp_path / "b", "", {"a": "model: x\n", "b": "model: y\n"})) is None
    assert detect_profile(make_home(tmp_path / "c", "", {})) is None
    assert detect_profile(tmp_path / "missing") is None


def test_a_set_profile_wins_and_a_blank_one_opts_out(tmp_path):
    home = make_home(tmp_path, "", {"work": "model: x\n"})
    assert resolve_profile(("hermes", "-z", "{task}"), "", home) is None
    assert resolve_profile(("hermes", "-z", "{task}"), "  ", home) is None
    assert resolve_profile(("hermes", "-z", "{task}"), "other", home) == "other"
    assert resolve_profile(("my-agent", "{task}"), None, home) is None  # profiles are a hermes flag
    assert resolve_profile(("my-agent", "{task}"), "other", home) is None


def test_the_agent_inherits_neither_switchboards_own_variables_nor_any_key():
    env = child_environment({"PATH": "/bin", "SWITCHBOARD_DISCORD_TOKEN": "t", "SWITCHBOARD_HERMES_API_KEY": "k",
                             "OPENAI_API_KEY": "o"})
    assert env == {"PATH": "/bin"}


# -- spoken text -----------------------------------------------------------------------------------

def test_voice_never_offers_always_and_always_allows_deny():
    assert voice_choices(("once", "session", "always", "deny")) == ("once", "session", "deny")
    assert voice_choices(("once", "always")) == ("once", "deny")
    assert voice_choices(()) == ("once", "session", "deny")


def test_the_approval_question_names_the_run_the_action_and_the_default():
    waiting = step(running(), ApprovalRequested("r", ("once", "deny"), "push to main")).ticket
    question = approval_question(waiting, 120)
    assert "Run 3" in question and "push to main" in question and "approve once, or deny" in question
    assert "2 minutes means deny" in question and "session" not in question


def test_announcements_are_bounded_and_say_how_the_run_ended():
    done = step(running(), Finished(RunState.COMPLETED, output="word " * 500)).ticket
    spoken = announcement(done, 100)
    assert spoken.startswith("Run 3 (audit the auth module) finished: ") and spoken.endswith("…")
    assert len(spoken) < 200
    lost = replace(done, state=RunState.LOST, error="Switchboard restarted", output=None)
    assert announcement(lost, 100) == "Run 3 (audit the auth module) was lost: Switchboard restarted"
    assert elapsed_words(59) == "59 seconds" and elapsed_words(3660) == "1 hour 1 minute"
