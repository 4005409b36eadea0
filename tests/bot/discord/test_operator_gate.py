"""The operator gate: a mutating tool runs only for a turn spoken by exactly one operator.

The pure gate is checked case by case; then the whole voice path: real speech into the room
transport as named Discord users, the engine in local endpointing against the fake GA server, a
delegation the model makes in the follow-up after a read-only tool, the runs service on a SQLite
file and a real agent process.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from bot.discord.gate import OperatorGate
from bot.tools.runs import run_tools
from common.store import open_store
from runs import RunsConfig, RunService
from runs.repository import MIGRATIONS
from tests.support.fake_realtime import AudioReply, FakeRealtime, ToolCallReply
from tests.support.runs import FAKE_AGENT, SAFETY_S
from tests.support.speech import speech_frames
from voice.call.attribution import UNKNOWN, Attribution, CallInfo
from voice.call.core import CallOptions
from voice.call.engine import CallEngine
from voice.call.identity import Identity
from voice.call.providers import OpenAIRealtime
from voice.call.tools import Tool, ToolCall, ToolCatalogue, ToolRefused
from voice.media.channel import RoomTransport

OLIVE, GUS, MAY = 301234567890123456, 402345678901234567, 503456789012345678
KEY = "sk-gate-test-NEVER-SHOWN"


def call_by(speakers: frozenset[int] | None, name: str = "delegate_task") -> ToolCall:
    origin = UNKNOWN if speakers is None else Attribution("resp_1", 1, speakers)
    return ToolCall("c1", name, {"task": "anything"}, "{}", origin, CallInfo("call-1", 1, 2))


TOOL = Tool("delegate_task", "d", {"type": "object"}, lambda call: None, mutating=True)


@pytest.mark.parametrize("operators, speakers, allowed", [
    ({OLIVE}, frozenset({OLIVE}), True),
    ({OLIVE, MAY}, frozenset({MAY}), True),
    ({OLIVE}, frozenset({GUS}), False),  # not an operator
    ({OLIVE}, frozenset({OLIVE, GUS}), False),  # an operator and someone else at once
    ({OLIVE, MAY}, frozenset({OLIVE, MAY}), False),  # two operators at once: still not one person
    (set(), frozenset({OLIVE}), False),  # nobody configured: nobody
    ({OLIVE}, None, False),  # unknown origin (an announcement, the provider's own response)
])
async def test_the_gate_allows_exactly_one_operator_speaking_alone(operators, speakers, allowed):
    gate = OperatorGate(operators)
    if allowed:
        assert await gate.authorize(TOOL, call_by(speakers)) is None
    else:
        with pytest.raises(ToolRefused):
            await gate.authorize(TOOL, call_by(speakers))


async def test_model_arguments_naming_an_operator_authorise_nothing():
    call = ToolCall("c1", "delegate_task", {"task": "x", "user_id": OLIVE, "speaker": "Olive"},
                    json.dumps({"user_id": OLIVE}), Attribution("r", 1, frozenset({GUS})), CallInfo("c"))
    with pytest.raises(ToolRefused, match="only an operator"):
        await OperatorGate({OLIVE}).authorize(TOOL, call)


# -- the whole voice path ----------------------------------------------------------------------------

def script_read_then_delegate(ctx):
    """Every turn: check_work first (read-only, anyone), then delegate_task in the follow-up, then speak."""
    n = ctx.response_count % 3
    if n == 0:
        return ToolCallReply("check_work", {})
    if n == 1:
        return ToolCallReply("delegate_task", {"task": "audit the auth module"})
    return AudioReply("Okay.", audio_ms=200)


async def talk_in_the_room(tmp_path, speakers: list[tuple[int, str]], operators: set[int]):
    """Each (user id, display name) says the same sentence at once; returns (tool outputs, tickets)."""
    async with FakeRealtime(script_read_then_delegate) as fake:
        store = await open_store(tmp_path / "home", MIGRATIONS)
        runs = RunService(store, RunsConfig(lanes=("command",), command=(sys.executable, FAKE_AGENT, "answer",
                                                                         "{task}")))
        await runs.start()
        names = dict(speakers)
        transport = RoomTransport(names=names.get, loop=asyncio.get_running_loop())
        engine = CallEngine(OpenAIRealtime(KEY, "gpt-realtime-2.1-mini", "marin", url=fake.url), transport,
                            ToolCatalogue(OperatorGate(operators), run_tools(runs)), Identity("test"),
                            options=CallOptions(endpointing="local"), call=CallInfo("g1", 1, 2))
        call = asyncio.create_task(engine.run())
        try:
            for frame in speech_frames("audit the auth module and report back"):
                for user_id, _ in speakers:  # Discord delivers each speaker's frames separately
                    transport.on_speech(user_id, user_id % 1000, frame)
                await asyncio.sleep(0)
            turns = len(speakers)  # one turn per speaker, never one mixed turn
            await fake.wait_for(lambda: fake.response_count >= 3 * turns, timeout=SAFETY_S)
            await fake.wait_for(lambda: len(outputs_of(fake)) >= 2 * turns, timeout=SAFETY_S)
        finally:
            engine.stop()
            transport.close()
            try:
                await asyncio.wait_for(call, 10)
                # every agent process started has exited and been read to the end before the service closes
                tickets = [await asyncio.wait_for(runs.wait_until(t.id, lambda t: t.terminal), SAFETY_S)
                           for t in await runs.tickets()]
            finally:
                await runs.close()
                await store.close()
        fake.assert_clean()
        return outputs_of(fake), tickets, fake


def outputs_of(fake: FakeRealtime) -> list[dict]:
    return [json.loads(e["item"]["output"]) for e in fake.received
            if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"]


async def test_an_operator_delegates_in_the_follow_up_after_a_read_only_tool(tmp_path):
    outputs, tickets, fake = await talk_in_the_room(tmp_path, [(OLIVE, "Olive")], {OLIVE})
    assert "summary" in outputs[0]  # check_work answered
    assert outputs[1]["summary"].startswith("run 1 is starting on command")
    assert [(t.id, t.requester_id, t.task) for t in tickets] == [(1, OLIVE, "audit the auth module")]
    context = [e["item"]["content"][0]["text"] for e in fake.received if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "message" and e["item"]["role"] == "system"]
    assert any(f"user id {OLIVE}" in text for text in context)  # the model is told who spoke, by id


async def test_a_non_operator_with_an_operators_display_name_is_refused_out_loud(tmp_path):
    outputs, tickets, _ = await talk_in_the_room(tmp_path, [(GUS, "Olive")], {OLIVE})
    assert "summary" in outputs[0]  # reading is open to everyone
    assert "only an operator can start work" in outputs[1]["error"]
    assert tickets == []


async def test_an_operator_and_a_guest_speaking_at_once_are_two_turns_and_only_the_operators_runs(tmp_path):
    outputs, tickets, fake = await talk_in_the_room(tmp_path, [(OLIVE, "Olive"), (GUS, "Gus")], {OLIVE})
    delegations = [outputs[1], outputs[3]]
    assert sum("summary" in o and o["summary"].startswith("run 1 is starting") for o in delegations) == 1
    assert sum("only an operator can start work" in o.get("error", "") for o in delegations) == 1
    assert [(t.id, t.requester_id) for t in tickets] == [(1, OLIVE)]
    context = [e["item"]["content"][0]["text"] for e in fake.received if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "message" and e["item"]["role"] == "system"]
    assert len(context) == 2 and all(text.count("user id") == 1 for text in context)  # one speaker per turn


async def test_a_blank_operator_list_lets_nobody_delegate(tmp_path):
    outputs, tickets, _ = await talk_in_the_room(tmp_path, [(OLIVE, "Olive")], set())
    assert "none is configured" in outputs[1]["error"]
    assert tickets == []
