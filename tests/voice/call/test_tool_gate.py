"""The catalogue's gate: mutating tools are denied by default, refused on unknown attribution, and
otherwise decided by an async authoriser that sees the whole call. Every decision is recorded."""

from __future__ import annotations

import json

from voice.call.attribution import UNKNOWN, Attribution, CallInfo
from voice.call.builtin_tools import talk_status_tool
from voice.call.tools import AllowKnownSpeakers, Tool, ToolCatalogue, ToolRefused

ALICE, BOB = 111111111111111111, 222222222222222222
CALL = CallInfo("c0ffee", guild_id=1234567890123456789, channel_id=9876543210987654321)


def said(alice_or_bob: int, turn: int = 1) -> Attribution:
    return Attribution("resp_1", turn, frozenset({alice_or_bob}))


def deploy_tool(ran: list) -> Tool:
    return Tool("deploy", "d", {}, lambda call: ran.append(call) or "deployed", mutating=True)


class OnlyAlice:
    def __init__(self) -> None:
        self.seen = []

    async def authorize(self, tool, call) -> None:
        self.seen.append((tool.name, call.call, call.speakers, call.origin.turn_id))
        if call.speakers != frozenset({ALICE}):
            raise ToolRefused("only an operator can start work")


async def test_a_catalogue_without_an_authoriser_denies_mutating_tools_but_runs_read_only_ones():
    ran: list = []
    catalogue = ToolCatalogue(tools=[deploy_tool(ran), Tool("look", "d", {}, lambda call: "seen")])
    denied = await catalogue.run("c1", "deploy", "{}", origin=said(ALICE))
    looked = await catalogue.run("c2", "look", "{}", origin=UNKNOWN)
    assert not denied.ok and "no one allowed" in json.loads(denied.output)["error"] and ran == []
    assert looked.ok and looked.output == "seen"


async def test_unknown_attribution_is_refused_before_the_authoriser_is_asked():
    ran: list = []
    gate = OnlyAlice()
    catalogue = ToolCatalogue(gate, [deploy_tool(ran)])
    for origin in (UNKNOWN, Attribution("r", 3, None), Attribution("r", 3, frozenset())):
        outcome = await catalogue.run("c1", "deploy", "{}", origin=origin, call=CALL)
        assert not outcome.ok and "can't tell who asked" in outcome.output
    allowing = ToolCatalogue(AllowKnownSpeakers(), [deploy_tool(ran)])
    assert not (await allowing.run("c2", "deploy", "{}", origin=UNKNOWN)).ok
    assert gate.seen == [] and ran == []


async def test_the_authoriser_sees_the_call_and_speakers_and_every_decision_is_recorded():
    ran: list = []
    gate = OnlyAlice()
    decisions = []
    catalogue = ToolCatalogue(gate, [deploy_tool(ran)])
    refused = await catalogue.run("c1", "deploy", '{"as": "alice"}', origin=said(BOB), call=CALL,
                                  on_decision=decisions.append)
    allowed = await catalogue.run("c2", "deploy", "{}", origin=said(ALICE, 2), call=CALL,
                                  on_decision=decisions.append)
    assert "only an operator" in refused.output and allowed.output == "deployed"
    assert gate.seen == [("deploy", CALL, frozenset({BOB}), 1), ("deploy", CALL, frozenset({ALICE}), 2)]
    assert [(d.allowed, d.call_id) for d in decisions] == [(False, "c1"), (True, "c2")]
    assert str(BOB) in decisions[0].describe() and "refused" in decisions[0].describe()
    assert ran[0].speakers == frozenset({ALICE}) and ran[0].call is CALL


async def test_a_broken_authoriser_refuses():
    class Broken:
        async def authorize(self, tool, call):
            raise KeyError("operators")

    ran: list = []
    outcome = await ToolCatalogue(Broken(), [deploy_tool(ran)]).run("c", "deploy", "{}", origin=said(ALICE))
    assert not outcome.ok and "could not be authorised" in outcome.output and ran == []


def test_extending_a_catalogue_leaves_the_original_untouched():
    base = ToolCatalogue(AllowKnownSpeakers(), [Tool("look", "d", {}, lambda c: 1)])
    one = base.extended(talk_status_tool(lambda: {"voice": "marin"}))
    two = base.extended(talk_status_tool(lambda: {"voice": "cedar"}))
    assert base.names() == ["look"] and one.names() == two.names() == ["look", "talk_status"]
    assert one.get("talk_status") is not two.get("talk_status")
    assert one.authorizer is base.authorizer
