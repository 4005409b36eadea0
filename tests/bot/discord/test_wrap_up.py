"""A call's wrap-up through the real Discord client (in-process, on the fake Discord) and a real store: the
recap is posted in the channel `/talk join` was used in — with the text model's summary, without it when
the model fails or hangs at shutdown (never lost) — and the debrief learns the operator's fact once."""

from __future__ import annotations

import asyncio

import pytest

from bot.discord.client import SwitchboardBot
from tests.support.discord_service import service
from tests.support.fake_text_model import FakeTextModel
from tests.support.runs import SAFETY_S

SAID = "the release goes out on the fifth of march"
FACT = "The release goes out on the fifth of March."


def answer(body: dict) -> dict:
    if body["response_format"]["json_schema"]["name"] == "call_summary":
        return {"summary": "They set the release date.", "decisions": ["Release on 5 March"]}
    return {"facts": [{"fact": FACT, "assertion_turn": 1, "quote": SAID, "confirmation_turn": None,
                       "confirmation_quote": None, "confidence": "high"}]}


async def ended_call(bot: SwitchboardBot, channel_id: int, operator: int) -> int:
    records = bot.services.calls
    call_id = await records.start(guild_id=1, voice_channel_id=2, text_channel_id=channel_id, started_by=operator,
                                  mode="everyone", captions=False, at=1_750_000_000.0)
    await records.add_turn(call_id, "user", operator, "Olive", SAID, 1_750_000_010.0)
    await records.add_turn(call_id, "assistant", None, "Ares", "Noted.", 1_750_000_012.0)
    await records.end(call_id, "/talk leave", 1_750_000_600.0)
    return call_id


def recaps(fake) -> list[dict]:
    return [m["embeds"][0] for m in fake.state.messages if m["embeds"] and m["embeds"][0]["title"] == "Call recap"]


@pytest.mark.asyncio
async def test_the_recap_carries_the_summary_and_the_debrief_learns_the_operators_fact_once(tmp_path):
    async with FakeTextModel(key="tk", model="gpt-test") as text:
        text.answer = answer
        async with service(tmp_path, SWITCHBOARD_TEXT_URL=text.url, SWITCHBOARD_TEXT_API_KEY="tk",
                           SWITCHBOARD_TEXT_MODEL="gpt-test") as svc:
            call_id = await ended_call(svc.bot, svc.fake.text_channel.id, svc.operator.id)
            await asyncio.wait_for(svc.bot.wrap_up(call_id, None), SAFETY_S)
            await asyncio.wait_for(svc.bot.wrap_up(call_id, None), SAFETY_S)  # again: a second recap, no new fact
            facts = await svc.bot.archive.db.fetchall("SELECT fact, call_id FROM listener_facts")
        text.assert_clean()
    first, second = recaps(svc.fake)
    assert "They set the release date." in first["description"] and first == second
    fields = {f["name"]: f["value"] for f in first["fields"]}
    assert "Release on 5 March" in fields["decided"] and "10 min" in fields["duration"]
    assert [tuple(f) for f in facts] == [(FACT, call_id)]
    assert len(text.requests) == 3  # summary, debrief, summary: the second debrief asks nothing


@pytest.mark.asyncio
async def test_without_an_answering_model_the_recap_is_posted_without_a_summary(tmp_path):
    async with FakeTextModel(key="tk", model="gpt-test") as text:
        text.fail_next(503)
        async with service(tmp_path, SWITCHBOARD_TEXT_URL=text.url, SWITCHBOARD_TEXT_API_KEY="tk",
                           SWITCHBOARD_TEXT_MODEL="gpt-test") as svc:
            call_id = await ended_call(svc.bot, svc.fake.text_channel.id, svc.operator.id)
            captions = svc.fake.state.new_thread(svc.fake.text_channel, "Captions", 11, 60)
            await asyncio.wait_for(svc.bot.wrap_up.post_recap(await svc.bot.services.calls.get(call_id),
                                                              thread_id=captions.id), SAFETY_S)
    in_channel, in_thread = recaps(svc.fake)  # where /talk join was used, and the call's captions thread
    assert in_channel == in_thread and [m["channel_id"] for m in svc.fake.state.messages] == \
        [str(svc.fake.text_channel.id), str(captions.id)]
    assert "Summary unavailable (the text model could not be reached)" in in_channel["description"]


@pytest.mark.asyncio
async def test_a_recap_waiting_for_a_hung_model_is_posted_without_it_when_the_service_stops(tmp_path):
    async with FakeTextModel(key="tk", model="gpt-test") as text:
        text.hang_next()
        async with service(tmp_path, SWITCHBOARD_TEXT_URL=text.url, SWITCHBOARD_TEXT_API_KEY="tk",
                           SWITCHBOARD_TEXT_MODEL="gpt-test") as svc:
            call_id = await ended_call(svc.bot, svc.fake.text_channel.id, svc.operator.id)
            wrapping = asyncio.create_task(svc.bot.wrap_up(call_id, None))
            await asyncio.wait_for(text.hanging.wait(), SAFETY_S)  # the summary request will never be answered
            svc.bot.wrap_up.hurry()  # as the shutdown does first
            await asyncio.wait_for(wrapping, SAFETY_S)
    (recap,) = recaps(svc.fake)
    assert "Summary unavailable (Switchboard was shutting down)" in recap["description"]
    assert len(text.requests) == 1  # and no debrief on the way out
