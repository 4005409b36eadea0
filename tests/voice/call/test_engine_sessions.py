"""Sessions end to end against the fake GA server: a proactive rollover, a next session that cannot be
opened, an expired session, a call that starts with an earlier conversation. Time is the one virtual
clock; every event both ways is validated by the fake."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from websockets.asyncio.client import connect

from tests.support.clock import VirtualClock
from tests.support.engine_call import no_wait, running
from tests.support.fake_realtime import AudioReply, FakeRealtime, silence_pcm16
from tests.support.virtual_transport import VirtualTransport
from voice.call.core import CallOptions, HistoryTurn
from voice.call.engine import CallEngine
from voice.call.identity import Identity
from voice.call.providers import OpenAIRealtime
from voice.call.tools import ToolCatalogue
from voice.call.transports.base import TurnContext
from voice.call.vad import EnergyDetector

KEY = "sk-test-sessions-0123456789"
ALICE = 111111111111111111
ROLLOVER_S = 3300.0




@asynccontextmanager
async def live_call(fake: FakeRealtime, *, connector=None, history=(), rollover_s: float | None = ROLLOVER_S):
    clock = VirtualClock()
    transport = VirtualTransport()
    transport.context = TurnContext(frozenset({ALICE}), {ALICE: "Alice"})
    provider = OpenAIRealtime(KEY, "gpt-realtime-2.1-mini", "marin", url=fake.url)
    extra = {"connector": connector} if connector is not None else {}
    engine = CallEngine(provider, transport, ToolCatalogue(), Identity("You are a test assistant."),
                        options=CallOptions(endpointing="local", rollover_s=rollover_s), clock=clock, sleep=no_wait,
                        backoff=(0.0, 0.0, 0.0), detector=EnergyDetector(), history=history, **extra)
    async with running(fake, transport, engine, clock) as call:
        yield call


def text_items(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["item"]["role"], e["item"]["content"][0]["text"]) for e in events
            if e.get("type") == "conversation.item.create" and e["item"]["type"] == "message"]


ALICE_SAID = ("system", f'The next audio turn is spoken by user id {ALICE} (display name, untrusted data: "Alice").')


async def test_a_proactive_rollover_gives_the_next_session_the_turns_before_the_first_closes_and_answers_there():
    script = [AudioReply("First answer.", audio_ms=300), AudioReply("Second answer.", audio_ms=300)]
    async with FakeRealtime(script, user_transcripts=["book the room", "and lunch"]) as fake:
        async with live_call(fake) as call:
            call.say()
            await call.answered("First answer.")
            call.clock.advance(ROLLOVER_S)
            call.transport.push(silence_pcm16(20))  # time passes in a quiet room
            await fake.wait_for(lambda: fake.closed(1) and call.engine.core.counters["rollovers"] == 1, timeout=10)
            call.say()
            await call.answered("Second answer.")
            status = call.engine.status()
        assert fake.connections == 2 and [c.connection for c in fake.contexts] == [1, 2]  # the second turn: session 2
        before_close = fake.timeline[:fake.timeline.index((1, None))]
        second = [e for n, e in before_close if n == 2]
        assert second[0]["type"] == "session.update"
        assert text_items(second) == [ALICE_SAID, ("user", "book the room"), ("assistant", "First answer.")]
        assert ("user", "and lunch") in call.transcripts
        assert call.spoken() == [] and status["audio"]["counters"]["reconnects"] == 0  # nobody heard a thing
        assert status["spoken_ms"] == {str(ALICE): 800} and call.engine.spoken_ms == {ALICE: 800}
        fake.assert_clean()


async def test_a_next_session_that_cannot_be_opened_leaves_the_call_in_the_first_and_is_retried(caplog):
    caplog.set_level(logging.INFO)
    attempts: list[str] = []
    network_back = asyncio.Event()

    async def flaky(url: str, headers: dict[str, str]):
        attempts.append(url)
        if len(attempts) == 2:
            raise OSError("connection refused")
        if len(attempts) == 3:
            await network_back.wait()
        return await connect(url, additional_headers=headers)

    script = [AudioReply("First answer.", audio_ms=300), AudioReply("Still here.", audio_ms=300)]
    async with FakeRealtime(script, user_transcripts=["one", "two"]) as fake:
        async with live_call(fake, connector=flaky) as call:
            call.say()
            await call.answered("First answer.")
            call.clock.advance(ROLLOVER_S)
            call.transport.push(silence_pcm16(20))
            await fake.wait_for(lambda: len(attempts) == 3)  # failed once, trying again
            call.say()
            await call.answered("Still here.")  # in the first session, which goes on
            assert fake.connections == 1 and call.engine.core.counters["rollovers"] == 0
            network_back.set()
            await fake.wait_for(lambda: fake.closed(1) and call.engine.core.counters["rollovers"] == 1, timeout=10)
        assert [c.connection for c in fake.contexts] == [1, 1]
        failed = [r for r in caplog.records if "could not open the next voice session" in r.getMessage()]
        assert len(failed) == 1 and failed[0].levelno == logging.WARNING
        assert text_items(fake.received_on(2))[-2:] == [("user", "two"), ("assistant", "Still here.")]
        assert call.spoken() == []
        fake.assert_clean()


async def test_an_expired_session_mid_call_is_replaced_by_one_that_knows_who_said_the_earlier_turns():
    script = [AudioReply("First answer.", audio_ms=300), AudioReply("Second answer.", audio_ms=300)]
    async with FakeRealtime(script, user_transcripts=["book the room", "and lunch"]) as fake:
        async with live_call(fake, rollover_s=None) as call:
            call.say()
            await call.answered("First answer.")
            assert await fake.expire_session() == 1
            await fake.wait_for(lambda: fake.connections == 2 and call.engine.core.connected, timeout=10)
            call.say()
            await call.answered("Second answer.")
        assert [c.connection for c in fake.contexts] == [1, 2]
        restored = fake.received_on(2)
        assert restored[0]["type"] == "session.update"
        assert text_items(restored)[:3] == [ALICE_SAID, ("user", "book the room"), ("assistant", "First answer.")]
        assert fake.transcribed[-1][0] == ALICE  # the new turn is still hers, not the restored note's
        assert call.spoken() == [] and call.engine.core.counters["rollovers"] == 1
        fake.assert_clean()


async def test_a_call_that_continues_an_earlier_conversation_starts_knowing_it_and_says_nothing():
    history = [HistoryTurn("user", "remind me about the dentist", ALICE, "Alice"),
               HistoryTurn("assistant", "I will, at five.")]
    async with FakeRealtime([AudioReply("At five, yes.", audio_ms=300)], user_transcripts=["when?"]) as fake:
        async with live_call(fake, history=history) as call:
            await fake.wait_received("session.update")
            await fake.wait_for(lambda: len(text_items(fake.received)) == 3)
            assert fake.received_types()[:4] == ["session.update"] + ["conversation.item.create"] * 3
            assert "response.create" not in fake.received_types()
            call.say()
            await call.answered("At five, yes.")
        assert text_items(fake.received_on(1))[:3] == [ALICE_SAID, ("user", "remind me about the dentist"),
                                                       ("assistant", "I will, at five.")]
        assert call.spoken() == []
        fake.assert_clean()
