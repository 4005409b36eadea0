"""The fake Discord's sharding and hand-off behaviours, checked with the real discord.py clients
(`AutoShardedClient`, `Client(shard_id=, shard_count=)`) and, for the identify rate, a bare websocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import discord
import pytest
from discord.errors import ConnectionClosed

from tests.support.fake_discord import FakeDiscord, point_discord_py_at
from tests.support.fake_discord.bot_process import BotProcess
from tests.support.fake_discord.pointing import shut_down_like_ctrl_c
from tests.support.fake_discord.shards import Sharding, parse_shard, shard_of


async def guilds_on_every_shard(fake: FakeDiscord, num_shards: int) -> None:
    """Add a guild on each shard the first guild is not on."""
    for shard_id in range(num_shards):
        if shard_id != shard_of(fake.guild_id, num_shards):
            await fake.add_guild(f"guild {len(fake.guilds)}", shard=(shard_id, num_shards))


class Recorder:
    """Collects what a client's events saw; `wait` resolves once a predicate over them holds."""

    def __init__(self) -> None:
        self.available: set[int] = set()
        self.hooks: list[tuple[int | None, bool]] = []
        self.messages: list[discord.Message] = []
        self.answers: list[object] = []
        self._changed = asyncio.Event()

    def note(self) -> None:
        self._changed.set()

    async def wait(self, predicate, timeout: float = 15.0) -> None:
        async def poll() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(poll(), timeout)


def instrument(client: discord.Client, seen: Recorder, hook=None) -> discord.Client:
    """Record guilds, DMs and identify hooks; answer every interaction (recording 'ok' or the error code)."""
    @client.event
    async def on_guild_available(guild: discord.Guild) -> None:
        seen.available.add(guild.id)
        seen.note()

    @client.event
    async def on_message(message: discord.Message) -> None:
        seen.messages.append(message)
        seen.note()

    @client.event
    async def on_interaction(interaction: discord.Interaction) -> None:
        try:
            await interaction.response.send_message("answered", ephemeral=True)
            seen.answers.append("ok")
        except discord.HTTPException as exc:
            seen.answers.append((exc.status, exc.code, exc.text))
        seen.note()

    async def before_identify_hook(shard_id: int | None, *, initial: bool = False) -> None:
        seen.hooks.append((shard_id, initial))  # no 5 s sleep: the fake's identify window is off or virtual
        if hook is not None:
            await hook(shard_id, initial)

    client.before_identify_hook = before_identify_hook  # type: ignore[method-assign]
    return client


@contextlib.asynccontextmanager
async def running(fake: FakeDiscord, *clients: discord.Client) -> AsyncIterator[None]:
    with point_discord_py_at(fake):
        runners = [asyncio.create_task(c.start(fake.token)) for c in clients]
        try:
            yield
        finally:
            for client, runner in zip(clients, runners, strict=True):
                await shut_down_like_ctrl_c(client, runner)


def delivered(fake: FakeDiscord, event: str) -> dict[int, set[int]]:
    """For each gateway session's shard id: the guild ids of the `event` dispatches it sent."""
    out: dict[int, set[int]] = {}
    for session in fake.gateway.sessions:
        for e in session.sent_events if session.session_id else []:
            if e["t"] == event:
                out.setdefault(session.shard[0], set()).add(int(e["d"].get("guild_id") or e["d"]["id"]))
    return out


async def test_auto_sharded_client_takes_the_recommended_shards_and_each_gets_only_its_guilds():
    async with FakeDiscord(sharding=Sharding(recommended_shards=2, max_concurrency=2)) as fake:
        await guilds_on_every_shard(fake, 2)
        alice = fake.add_user("alice")
        fake.state.register_commands(None, [{"name": "ping", "description": "d"}])
        seen = Recorder()
        client = instrument(discord.AutoShardedClient(intents=discord.Intents.default()), seen)
        async with running(fake, client):
            await seen.wait(lambda: seen.available == {g.id for g in fake.guilds})
            limits = await client.fetch_session_start_limits()
            on_shard_1 = next(g for g in fake.guilds if shard_of(g.id, 2) == 1)
            pending = await fake.send_interaction("ping", user=alice, channel=on_shard_1.text_channel)
            await seen.wait(lambda: seen.answers)
        fake.assert_clean()

    assert client.shard_count == 2 and fake.rest_calls("GET", "/gateway/bot")
    # discord.py computes each guild's shard itself: the fake delivered every guild on exactly that shard
    assert delivered(fake, "GUILD_CREATE") == {s: {g.id for g in client.guilds if g.shard_id == s} for s in (0, 1)}
    readies = {s.shard: s.sent_events[0]["d"] for s in fake.gateway.sessions if s.session_id}
    assert sorted(readies) == [(0, 2), (1, 2)]
    assert all(ready["shard"] == list(shard) for shard, ready in readies.items())
    assert seen.hooks == [(0, True), (1, False)]
    assert [(r.shard, r.bucket, r.outcome) for r in fake.sharding.identifies] == [((0, 2), 0, "ready"),
                                                                                  ((1, 2), 1, "ready")]
    assert (limits.total, limits.remaining, limits.max_concurrency) == (1000, 998, 2)
    assert 0 < limits.reset_after <= 86_400_000
    assert delivered(fake, "INTERACTION_CREATE") == {1: {on_shard_1.id}} and seen.answers == ["ok"]
    assert pending.response["data"]["content"] == "answered"


async def test_auto_sharded_client_with_its_own_shard_ids_runs_only_those_shards():
    async with FakeDiscord() as fake:
        await guilds_on_every_shard(fake, 3)
        seen = Recorder()
        client = instrument(discord.AutoShardedClient(intents=discord.Intents.default(), shard_ids=[1, 2],
                                                      shard_count=3), seen)
        mine = {g.id for g in fake.guilds if shard_of(g.id, 3) in (1, 2)}
        async with running(fake, client):
            await seen.wait(lambda: seen.available == mine)
        fake.assert_clean()

    assert not fake.rest_calls("GET", "/gateway/bot")  # a given shard_count dials the gateway directly
    assert {g.id for g in client.guilds} == mine and len(mine) == 2
    assert seen.hooks == [(1, True), (2, False)]
    assert [r.shard for r in fake.sharding.identifies] == [(1, 3), (2, 3)]


async def test_two_sessions_on_one_shard_both_see_an_interaction_and_the_second_answer_gets_40060():
    async with FakeDiscord() as fake:
        alice = fake.add_user("alice")
        fake.state.register_commands(None, [{"name": "ping", "description": "d"}])
        seen = Recorder()  # shared: both clients answer into one list
        old, new = (instrument(discord.Client(intents=discord.Intents.default()), seen) for _ in range(2))
        async with running(fake, old, new):
            await fake.journal.wait_for(lambda: len(fake.journal.dispatched("GUILD_CREATE")) == 2)
            pending = await fake.send_interaction("ping", user=alice)
            await seen.wait(lambda: len(seen.answers) == 2)
            await fake.add_text_channel("both")  # any guild event reaches both sessions too
        fake.assert_clean()

    assert sorted(seen.answers, key=str) == sorted(
        ["ok", (400, 40060, "Interaction has already been acknowledged.")], key=str)
    callbacks = fake.rest_calls("POST", f"/interactions/{pending.id}/{pending.token}/callback")
    assert sorted(c.status for c in callbacks) == [200, 400]
    sessions = [s for s in fake.gateway.sessions if s.session_id]
    assert len(sessions) == 2 and sessions[0].session_id != sessions[1].session_id
    # not enforced by default, but recorded: the second IDENTIFY came within 5 s in bucket 0
    assert [(r.bucket, r.too_soon) for r in fake.sharding.bucket_violations()] == [(0, True)]
    for session in sessions:
        assert [e["t"] for e in session.sent_events if e["t"] in ("INTERACTION_CREATE", "CHANNEL_CREATE")] == [
            "INTERACTION_CREATE", "CHANNEL_CREATE"]


# Two voice bots in subprocesses: the test shares the fake Discord voice rig's lane (tests/test_fake_discord.py).
@pytest.mark.xdist_group("real_time_fake_discord_voice_rig")
async def test_a_second_session_joining_voice_moves_the_voice_state_and_closes_the_first_with_4014(tmp_path):
    """The hand-off: a new process (gateway session) joins the call's channel; Discord moves the bot's one
    voice state to it and closes the older voice connection with 4014. discord.py's old VoiceClient takes
    that for a move, waits its connect timeout for a VOICE_SERVER_UPDATE that only the new session gets,
    then disconnects with op 4 (channel null), which takes the voice state away from the new session too:
    an old process must drop its voice client without that op 4."""
    async with FakeDiscord(voice=True, workdir=tmp_path) as fake:
        bot = fake.bot.id
        for name in ("old", "new"):
            (tmp_path / name).mkdir()
        async with BotProcess(fake, tmp_path / "old") as old:
            await old.wait_event("guild_available")
            async with BotProcess(fake, tmp_path / "new") as new:
                await new.wait_event("guild_available")
                old_session, new_session = [s for s in fake.gateway.sessions if s.session_id]
                await old.send("join", channel_id=fake.voice_channel.id, timeout=5.0)
                await old.wait_event("joined")
                moved = old.mark()
                await new.send("join", channel_id=fake.voice_channel.id)
                await new.wait_event("joined")
                holder = fake.state.guild.voice_sessions[bot]
                await old.wait_event("voice_log", after=moved, where=lambda e: "by force" in e["message"])
                closes = list(fake.journal.closed_by_fake)
                # after its 5 s connect timeout the old client gives up and sends op 4 with no channel
                await old.wait_event("voice_log", after=moved, timeout=30,
                                     where=lambda e: "Reconnect was unsuccessful" in e["message"])
                await fake.journal.wait_for(lambda: fake.state.guild.voice.get(bot) is None)
                await new.wait_event("voice_log", where=lambda e: "externally disconnected" in e["message"])
        fake.assert_clean()

    assert holder == new_session.session_id
    assert closes == [("voice", 4014)]  # the old connection, closed by the fake
    heard = [e["d"]["session_id"] for e in old_session.sent_events if e["t"] == "VOICE_STATE_UPDATE"]
    assert heard[:2] == [old_session.session_id, new_session.session_id]  # the old session heard the move
    assert sum(e["t"] == "VOICE_SERVER_UPDATE" for e in old_session.sent_events) == 1  # only for its own join
    assert sum(e["t"] == "VOICE_SERVER_UPDATE" for e in new_session.sent_events) == 1


async def test_one_shard_per_client_gets_its_guilds_and_dms_reach_shard_0_only():
    async with FakeDiscord() as fake:
        await guilds_on_every_shard(fake, 3)
        alice = fake.add_user("alice")
        seen = [Recorder() for _ in range(3)]
        clients = [instrument(discord.Client(intents=discord.Intents.default(), shard_id=i, shard_count=3), seen[i])
                   for i in range(3)]
        async with running(fake, *clients):
            for i in range(3):
                await seen[i].wait(lambda i=i: seen[i].available == {g.id for g in fake.guilds
                                                                      if shard_of(g.id, 3) == i})
            await fake.send_dm(alice, "hello bot")
            await seen[0].wait(lambda: seen[0].messages)
            await fake.add_text_channel("late")  # a guild event on the first guild's shard only
        fake.assert_clean()

    for i, client in enumerate(clients):
        assert {g.id for g in client.guilds} == {g.id for g in fake.guilds if shard_of(g.id, 3) == i}
        assert seen[i].hooks == [(i, True)]
    assert [(r.shard, r.outcome) for r in fake.sharding.identifies] == [((i, 3), "ready") for i in range(3)]
    (dm,) = seen[0].messages
    assert isinstance(dm.channel, discord.DMChannel) and dm.content == "hello bot" and dm.author.id == alice.id
    assert [len(s.messages) for s in seen[1:]] == [0, 0]
    first = shard_of(fake.guild_id, 3)
    assert delivered(fake, "CHANNEL_CREATE") == {first: {fake.guild_id}}


async def test_invalid_shard_is_4010_and_too_many_guilds_without_sharding_is_4011():
    assert [parse_shard(v) for v in (None, [0, 1], [2, 3])] == [(0, 1), (0, 1), (2, 3)]
    for bad in ([0], [1, 1], [-1, 2], [0, 0], ["0", 1], [True, 2], (0, 1), [0, 1, 2]):
        assert parse_shard(bad) is None, bad
    async with FakeDiscord(sharding=Sharding(max_guilds_per_shard=1)) as fake:
        await guilds_on_every_shard(fake, 2)  # two guilds: one too many for one session, one per shard is fine
        codes = []
        for options in ({}, {"shard_id": 2, "shard_count": 2}):
            client = discord.Client(intents=discord.Intents.default(), **options)
            with point_discord_py_at(fake), pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(client.start(fake.token), 15)
            await client.close()
            codes.append(closed.value.code)
        seen = Recorder()
        sharded = instrument(discord.Client(intents=discord.Intents.default(), shard_id=1, shard_count=2), seen)
        async with running(fake, sharded):
            await seen.wait(lambda: len(seen.available) == 1)
        fake.assert_clean()

    assert codes == [4011, 4010]
    assert [r.outcome for r in fake.sharding.identifies] == ["sharding_required", "invalid_shard", "ready"]
    assert fake.sharding.remaining == 999  # refused IDENTIFYs start no session


async def test_identify_rate_one_per_bucket_per_5_s_answers_op_9_and_resume_is_free():
    now = [100.0]
    sharding = Sharding(recommended_shards=4, max_concurrency=2, enforce_identify_rate=True, clock=lambda: now[0])
    async with FakeDiscord(sharding=sharding, clock=lambda: now[0]) as fake, aiohttp.ClientSession() as http:
        async def identify(shard: list[int]) -> int:
            async with http.ws_connect(fake.gateway.url + "?v=10&encoding=json") as ws:
                assert json.loads((await ws.receive()).data)["op"] == 10
                await ws.send_json({"op": 2, "d": {"token": fake.token, "intents": 0, "shard": shard, "properties": {
                    "os": "linux", "browser": "raw", "device": "raw"}}})
                return json.loads((await ws.receive()).data)["op"]

        first = [await identify([s, 4]) for s in (0, 1, 2, 3)]  # buckets 0 1 0 1, all within 5 s
        now[0] += 4.9
        early = await identify([2, 4])
        now[0] += 0.1
        later = [await identify([s, 4]) for s in (2, 3)]
        body = fake.sharding.gateway_bot(fake.gateway.url)

        async def wait_out_the_window(shard_id: int | None, initial: bool) -> None:
            if not initial:
                now[0] += 5.0  # what a bot that respects the bucket does (on the virtual clock)

        seen = Recorder()
        client = instrument(discord.Client(intents=discord.Intents.default()), seen, wait_out_the_window)
        async with running(fake, client):  # shard [0, 1]: bucket 0 was used at 105 s
            await seen.wait(lambda: seen.available)
            await fake.request_gateway_reconnect()
            await fake.journal.wait_for(lambda: fake.journal.dispatched("RESUMED"))
            remaining = fake.sharding.remaining
        identifies = list(fake.sharding.identifies)

    assert first == [0, 0, 9, 9] and early == 9 and later == [0, 0]  # op 0: READY, op 9: Invalid Session
    assert [(r.shard[0], r.bucket, r.too_soon, r.outcome) for r in identifies[:7]] == [
        (0, 0, False, "ready"), (1, 1, False, "ready"), (2, 0, True, "invalid_session"),
        (3, 1, True, "invalid_session"), (2, 0, True, "invalid_session"), (2, 0, False, "ready"),
        (3, 1, False, "ready")]
    assert body["shards"] == 4 and body["session_start_limit"]["remaining"] == 996
    assert not [r for r in identifies if r.too_soon and r.outcome == "ready"]  # refused, not admitted
    # discord.py's first IDENTIFY came too soon for bucket 0: op 9; it identified again after its hook
    assert [(r.shard, r.outcome) for r in identifies[7:]] == [((0, 1), "invalid_session"), ((0, 1), "ready")]
    assert seen.hooks == [(None, True), (None, False)]
    assert remaining == 995  # four raw sessions and discord.py's; its RESUME took nothing


def test_session_start_limit_resets_after_a_day():
    now = [0.0]
    sharding = Sharding(total=2, remaining=1, clock=lambda: now[0])
    assert sharding.admit(None, [])[0] == "ready"
    assert sharding.admit(None, [])[0] == "limit_spent"
    assert sharding.gateway_bot("ws://x/")["session_start_limit"]["reset_after"] == 86_400_000
    now[0] += 86_400.0
    assert sharding.gateway_bot("ws://x/")["session_start_limit"] == {
        "total": 2, "remaining": 2, "reset_after": 86_400_000, "max_concurrency": 1}


async def test_an_identify_past_the_daily_limit_ends_every_session():
    async with FakeDiscord(sharding=Sharding(total=1000, remaining=1)) as fake, aiohttp.ClientSession() as http:
        url = fake.gateway.url + "?v=10&encoding=json"
        identify = {"op": 2, "d": {"token": fake.token, "intents": 0, "properties": {
            "os": "linux", "browser": "raw", "device": "raw"}}}
        async with http.ws_connect(url) as first, http.ws_connect(url) as second:
            await first.receive()  # HELLO
            await first.send_json(identify)
            ready = json.loads((await first.receive()).data)
            await second.receive()
            await second.send_json(identify)
            ended = [(await asyncio.wait_for(ws.receive(), 15)).data for ws in (second, first)]
    assert ready["t"] == "READY"
    assert ended == [4004, 4004]
    assert fake.journal.violations == ["IDENTIFY past session_start_limit.remaining: Discord would end every "
                                       "session and reset the bot token"]
    assert [r.outcome for r in fake.sharding.identifies] == ["ready", "limit_spent"]
