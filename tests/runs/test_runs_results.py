"""The typed results of the runs service, and the JSON each becomes for the model: the exact objects
(keys, their order, values) the voice tools answered with when the service returned dicts."""

from __future__ import annotations

import json

from runs import (
    Answered,
    Delegated,
    NoteQueued,
    Refused,
    RunningAgents,
    RunsOverview,
    RunState,
    RunStatus,
    RunTicket,
    SteerReceipt,
    SteerState,
    StopOutcome,
    Stopped,
)

RUNNING = RunTicket(3, "hermes-api", "audit the auth module", RunState.RUNNING, created_at=1000.0,
                    updated_at=1010.0, external_id="run_abc", progress="using terminal: ls")
FAILED = RunTicket(2, "command", "summarise the logs", RunState.FAILED, created_at=1000.0, updated_at=1030.0,
                   finished_at=1030.0, error="exit 1: boom", announced=False)
LONG_TASK = ("check every endpoint of the billing service for missing authorisation and write down each one you "
             "find with its route")
COMMAND = RunTicket(4, "command", LONG_TASK, RunState.RUNNING, created_at=1060.0, updated_at=1060.0,
                    external_id="4242:4242")
NOTE = SteerReceipt(1, 3, "sb-0a1b2c3d", "please look at " + "the very long note " * 10, SteerState.QUEUED,
                    1080.0, 1080.0)
AT = 1090.0
QUEUED_MEANING = "queued: the lane accepted it; nothing shows yet that the agent has read it"


def same_json(result, expected: dict) -> bool:
    """Equal as the model reads it: the serialised text, so key order counts too."""
    return json.dumps(result.as_tool_output()) == json.dumps(expected)


def test_a_refusal_is_an_error_object_with_can_stop_only_when_stopping_is_the_way_out():
    assert same_json(Refused("say what the background agent should do"),
                     {"error": "say what the background agent should do"})
    assert same_json(Refused("run 4 is a one-shot command", can_stop=True),
                     {"error": "run 4 is a one-shot command", "can_stop": True})


def test_a_delegation_names_run_lane_state_and_summary_and_lists_skipped_lanes_only_when_any_were():
    started = Delegated(1, "command", RunState.STARTING, "run 1 is starting on command; I'll say when it lands.")
    assert same_json(started, {"run": 1, "lane": "command", "state": "starting",
                               "summary": "run 1 is starting on command; I'll say when it lands."})
    fell_through = Delegated(2, "command", RunState.STARTING, "hermes-api is not running, so run 2 is starting",
                             skipped=("hermes-api is not running: set API_SERVER_ENABLED=true",))
    assert same_json(fell_through, {"run": 2, "lane": "command", "state": "starting",
                                    "summary": "hermes-api is not running, so run 2 is starting",
                                    "skipped": ["hermes-api is not running: set API_SERVER_ENABLED=true"]})
    known = Delegated(5, "hermes-api", RunState.RUNNING, "run 5 was already started on hermes-api", already=True)
    assert same_json(known, {"run": 5, "lane": "hermes-api", "state": "running",
                             "summary": "run 5 was already started on hermes-api"})


def test_an_answered_question_names_the_run_and_the_choice():
    assert same_json(Answered(3, "session", "told run 3: approve for this session"),
                     {"run": 3, "choice": "session", "summary": "told run 3: approve for this session"})


def test_a_queued_note_is_read_back_bounded_with_its_receipt_state():
    queued = NoteQueued(NOTE, "note queued for run 3: accepted, not yet shown to be read")
    assert queued.run == 3
    assert same_json(queued, {
        "run": 3,
        "note": "please look at the very long note the very long note the very long note the very long note "
                "the very long note the very …",
        "state": "queued", "summary": "note queued for run 3: accepted, not yet shown to be read"})


def test_each_stop_outcome_keeps_its_state_word_and_superseded_notes_are_counted_in_a_sentence():
    assert same_json(Stopped(2, StopOutcome.ALREADY_ENDED, RunState.CANCELLED, "run 2 already stopped"),
                     {"run": 2, "state": "cancelled", "summary": "run 2 already stopped"})
    assert same_json(Stopped(1, StopOutcome.ON_ACCEPT, RunState.STARTING,
                             "run 1 will be stopped as soon as hermes-api accepts it"),
                     {"run": 1, "state": "starting",
                      "summary": "run 1 will be stopped as soon as hermes-api accepts it"})
    assert same_json(Stopped(3, StopOutcome.STOPPING, RunState.RUNNING, "stopping run 3 (hermes-api says stopping)"),
                     {"run": 3, "state": "stopping", "summary": "stopping run 3 (hermes-api says stopping)"})
    assert same_json(Stopped(3, StopOutcome.STOPPING, RunState.RUNNING, "stopping run 3 (hermes-api says stopping)",
                             superseded=2),
                     {"run": 3, "state": "stopping", "summary": "stopping run 3 (hermes-api says stopping)",
                      "notes": "2 queued note(s) superseded: the run was stopped before reading them"})


def test_one_run_in_detail_is_its_view_then_its_summary():
    going = RunStatus(RUNNING, AT, can_steer=True, receipts=(NOTE,), output_chars=1500)
    assert same_json(going, {
        "run": 3, "lane": "hermes-api", "state": "running", "task": "audit the auth module", "elapsed": "1 minute",
        "control": "steer or stop", "last_progress": "using terminal: ls",
        "notes": [{"note": "please look at the very long note the very long note the very long note the very long "
                           "note the very long note the very …", "state": "queued", "meaning": QUEUED_MEANING}],
        "summary": "run 3 is running on hermes-api, 1 minute in; last: using terminal: ls"})
    long_output = RunTicket(1, "command", "x", RunState.COMPLETED, created_at=1000.0, updated_at=1005.0,
                            finished_at=1005.0, output="word " * 400, announced=True)
    assert same_json(RunStatus(long_output, AT, output_chars=50), {
        "run": 1, "lane": "command", "state": "completed", "task": "x", "elapsed": "5 seconds",
        "output": "word word word word word word word word word word …",
        "output_note": "shortened; `switchboard runs show 1` has the rest",
        "summary": "run 1 finished after 5 seconds"})
    assert same_json(RunStatus(FAILED, AT), {
        "run": 2, "lane": "command", "state": "failed", "task": "summarise the logs", "elapsed": "30 seconds",
        "error": "exit 1: boom", "heard": "not announced in a call yet",
        "summary": "run 2 failed after 30 seconds: exit 1: boom"})


def test_the_overview_lists_active_then_finished_runs_and_says_so_when_there_are_none():
    assert same_json(RunsOverview((), ()), {"runs": [], "summary": "no background runs yet"})
    overview = RunsOverview((RunStatus(RUNNING, AT, can_steer=True),), (RunStatus(FAILED, AT),))
    assert same_json(overview, {
        "runs": [{"run": 3, "lane": "hermes-api", "state": "running", "task": "audit the auth module",
                  "elapsed": "1 minute", "control": "steer or stop", "last_progress": "using terminal: ls"},
                 {"run": 2, "lane": "command", "state": "failed", "task": "summarise the logs",
                  "elapsed": "30 seconds", "error": "exit 1: boom", "heard": "not announced in a call yet"}],
        "summary": "run 3 is running on hermes-api, 1 minute in; last: using terminal: ls; "
                   "recently: run 2 failed after 30 seconds: exit 1: boom"})
    assert RunsOverview((), (RunStatus(FAILED, AT),)).summary == (
        "nothing is running; recently: run 2 failed after 30 seconds: exit 1: boom")


def test_running_agents_are_listed_steerable_or_stop_only_with_their_task_bounded():
    assert same_json(RunningAgents(()), {"agents": [], "summary": "no background agents are running"})
    agents = RunningAgents((RunStatus(RUNNING, AT, can_steer=True), RunStatus(COMMAND, AT)))
    assert same_json(agents, {
        "agents": [{"run": 3, "lane": "hermes-api", "state": "running", "task": "audit the auth module",
                    "elapsed": "1 minute", "control": "steer or stop"},
                   {"run": 4, "lane": "command", "state": "running",
                    "task": "check every endpoint of the billing service for missing authorisation and write "
                            "down each one you …",
                    "elapsed": "30 seconds", "control": "stop only"}],
        "summary": "run 3 on hermes-api (steer or stop); run 4 on command (stop only)"})
