"""The six voice tools over the runs service, run through the real tool catalogue."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bot.tools.runs import origin_of, run_tools, speaker_of
from tests.support.runs import agent_command, harness
from voice.call.attribution import Attribution, CallInfo
from voice.call.tools import AllowKnownSpeakers, ToolCall, ToolCatalogue, ToolRefused

ALICE = 111111111111111111
ALICE_SPOKE = Attribution("resp_1", 1, frozenset({ALICE}))


class OnlyReadOnly:
    async def authorize(self, tool, call):
        raise ToolRefused("only operators may do that")


def catalogue_for(service, authorizer=None) -> ToolCatalogue:
    return ToolCatalogue(authorizer or AllowKnownSpeakers(), run_tools(service))


async def test_the_catalogue_gets_exactly_the_six_tools_with_their_mutating_flags(tmp_path):
    async with harness(tmp_path, lanes=("command",)) as h:
        tools = {t.name: t for t in run_tools(h.service)}
    assert {name: t.mutating for name, t in tools.items()} == {
        "delegate_task": True, "check_work": False, "list_agents": False,
        "steer_agent": True, "stop_work": True, "resolve_approval": True}
    assert tools["resolve_approval"].parameters["properties"]["choice"]["enum"] == ["once", "session", "deny"]
    assert tools["delegate_task"].parameters["required"] == ["task"]
    for tool in tools.values():
        assert tool.parameters["type"] == "object" and tool.parameters["additionalProperties"] is False


def test_the_requester_is_the_single_speaker_or_unknown():
    call = ToolCall("c", "delegate_task", {}, "{}", ALICE_SPOKE)
    assert speaker_of(call) == ALICE
    assert speaker_of(ToolCall("c", "delegate_task", {}, "{}", Attribution("r", 1, frozenset({1, 2})))) is None
    assert speaker_of(ToolCall("c", "delegate_task", {}, "{}")) is None
    assert speaker_of(SimpleNamespace(speakers=frozenset({ALICE}))) == ALICE
    assert speaker_of(SimpleNamespace(speakers=frozenset({1, 2}))) is None
    assert speaker_of(SimpleNamespace(speakers=frozenset())) is None
    assert speaker_of(SimpleNamespace(speakers=None)) is None
    assert speaker_of(SimpleNamespace(arguments={})) is None  # a ToolCall without attribution yet


async def test_delegate_through_the_catalogue_answers_with_a_receipt_and_records_the_requester(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        catalogue = catalogue_for(h.service)
        outcome = await catalogue.run("c1", "delegate_task", json.dumps({"task": "summarise the logs"}),
                                      origin=ALICE_SPOKE)
        assert outcome.ok
        receipt = json.loads(outcome.output)
        assert receipt["run"] == 1 and receipt["summary"].startswith("run 1 is starting on command")
        done = await h.delivered(1)
        assert done.requester_id == ALICE
        check = json.loads((await catalogue.run("c2", "check_work", json.dumps({"run": 1}))).output)
        assert check["state"] == "completed" and check["output"] == "answer: summarise the logs"
        agents = json.loads((await catalogue.run("c3", "list_agents", "{}")).output)
        assert agents["summary"] == "no background agents are running"


async def test_a_run_delegated_in_a_call_records_that_calls_id_and_one_outside_a_call_none(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        catalogue = catalogue_for(h.service)
        in_call = await catalogue.run("c1", "delegate_task", json.dumps({"task": "summarise the logs"}),
                                      origin=ALICE_SPOKE, call=CallInfo("call-42", 1234, 5678))
        no_call = await catalogue.run("c2", "delegate_task", json.dumps({"task": "say hi"}), origin=ALICE_SPOKE)
        assert in_call.ok and no_call.ok
        assert (await h.delivered(1)).origin == "call-42" and (await h.delivered(2)).origin is None
        assert [t.id for t in await h.service.tickets_of("call-42")] == [1]
        assert await h.service.tickets_of("unknown") == []
    assert origin_of(ToolCall("c", "delegate_task", {}, "{}")) is None  # the default NO_CALL
    assert origin_of(ToolCall("c", "delegate_task", {}, "{}", call=CallInfo("  "))) is None
    assert origin_of(SimpleNamespace(arguments={})) is None


async def test_an_unknown_run_number_is_an_answer_not_a_crash(tmp_path):
    async with harness(tmp_path, lanes=("command",)) as h:
        catalogue = catalogue_for(h.service)
        for name, args in (("check_work", {"run": 7}), ("stop_work", {"run": 7}),
                           ("steer_agent", {"run": "seven", "note": "x"}),
                           ("resolve_approval", {"run": 7, "choice": "once"})):
            outcome = await catalogue.run("c", name, json.dumps(args), origin=ALICE_SPOKE)
            assert outcome.ok and "there is no run" in json.loads(outcome.output)["error"], name


async def test_mutating_tools_go_through_the_authoriser_and_read_only_ones_do_not(tmp_path):
    async with harness(tmp_path, lanes=("command",)) as h:
        catalogue = catalogue_for(h.service, OnlyReadOnly())
        refused = await catalogue.run("c1", "delegate_task", json.dumps({"task": "x"}), origin=ALICE_SPOKE)
        assert not refused.ok and "only operators" in refused.output
        assert await h.service.tickets() == []
        allowed = await catalogue.run("c2", "check_work", "{}")
        assert allowed.ok and json.loads(allowed.output)["summary"] == "no background runs yet"


async def test_a_refusal_and_a_result_reach_the_model_as_the_same_json_objects_as_before(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=("no-such-agent-binary-xyz", "{task}")) as h:
        catalogue = catalogue_for(h.service)
        refused = await catalogue.run("c1", "delegate_task", json.dumps({"task": "x"}), origin=ALICE_SPOKE)
        answer = json.loads(refused.output)
        assert refused.ok and list(answer) == ["error"]
        assert answer["error"].startswith("no agent lane is available, so nothing was started. command: ")
    async with harness(tmp_path / "second", lanes=("command",), command=agent_command("answer")) as h:
        catalogue = catalogue_for(h.service)
        await catalogue.run("c2", "delegate_task", json.dumps({"task": "say hi"}), origin=ALICE_SPOKE)
        await h.delivered(1)
        stopped = await catalogue.run("c3", "stop_work", json.dumps({"run": 1}), origin=ALICE_SPOKE)
        assert json.loads(stopped.output) == {"run": 1, "state": "completed", "summary": "run 1 already finished"}
        declined = await catalogue.run("c4", "resolve_approval", json.dumps({"run": 1, "choice": "once"}),
                                       origin=ALICE_SPOKE)
        assert json.loads(declined.output) == {
            "error": "run 1 is not waiting for an answer (it is finished)"}
