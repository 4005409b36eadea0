"""The real discord.py client against the loopback fake Discord (tests/support/fake_discord)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import discord
import pytest
import pytest_asyncio
from discord import app_commands
from discord.voice_state import ConnectionFlowState

from tests.support.fake_discord import EPHEMERAL, FakeDiscord, NotInvocable, SimUser, point_discord_py_at
from tests.support.fake_discord.bot_process import BotProcess
from tests.support.fake_discord.pointing import gateway_client, shut_down_like_ctrl_c
from tests.support.packets import dominant_frequency, opus_frames
from voice.media.discord_client import ListeningVoiceClient

# The voice tests share one bot process (`voice_rig_module`): one worker runs them all, in order. It is a bare
# discord.py client, no `switchboard run` with a fake Realtime, so it has a lane of its own.
pytestmark = pytest.mark.xdist_group("real_time_fake_discord_voice_rig")


def talk_client() -> tuple[discord.Client, list[tuple[int, str]]]:
    """A plain discord.py Client with `/talk status` in an app_commands.Group, synced in setup_hook."""
    client = discord.Client(intents=discord.Intents.default())
    tree = app_commands.CommandTree(client)
    talk = app_commands.Group(name="talk", description="Talk with the agent in voice")
    invoked: list[tuple[int, str]] = []

    @talk.command(name="status", description="Show what the call is doing")
    async def status(interaction: discord.Interaction) -> None:
        invoked.append((interaction.user.id, interaction.user.display_name))
        embed = discord.Embed(title="Call status", description="Idle: not in a voice channel.", color=0x5865F2)
        await interaction.response.send_message(embed=embed, ephemeral=True)

    tree.add_command(talk)

    async def setup_hook() -> None:
        await tree.sync()

    client.setup_hook = setup_hook  # type: ignore[method-assign]
    return client, invoked


async def test_slash_command_group_syncs_then_an_interaction_gets_an_ephemeral_embed():
    async with FakeDiscord() as fake:
        alice = fake.add_user("alice", nick="Ali")
        client, invoked = talk_client()
        with point_discord_py_at(fake):
            runner = asyncio.create_task(client.start(fake.token))
            try:
                await fake.wait_gateway_ready()
                pending = await fake.send_interaction("talk status", user=alice)
                response = await fake.wait_response(pending)
            finally:
                await shut_down_like_ctrl_c(client, runner)
        await fake.journal.wait_for(lambda: fake.journal.closes)
        fake.assert_clean()

    (sync,) = fake.rest_calls("PUT", f"/applications/{fake.state.application_id}/commands")
    (talk,) = sync.body
    assert (talk["name"], talk.get("type", 1)) == ("talk", 1)
    assert [(o["type"], o["name"], o["options"]) for o in talk["options"]] == [(1, "status", [])]
    identify = fake.gateway.sessions[0].identify
    assert identify["intents"] == discord.Intents.default().value
    assert fake.gateway.sessions[0]._zlib is not None  # discord.py asked for zlib-stream and decoded it
    assert fake.journal.closes == [("gateway", 1000)]
    assert invoked == [(alice.id, "Ali")]
    assert response["type"] == 4
    assert response["data"]["flags"] == EPHEMERAL
    (embed,) = response["data"]["embeds"]
    assert (embed["title"], embed["description"]) == ("Call status", "Idle: not in a voice channel.")
    callback = fake.rest_calls("POST", f"/interactions/{pending.id}/{pending.token}/callback")[0]
    assert "Authorization" not in callback.headers and callback.query == {"with_response": "1"}
    assert callback.status == 200


async def test_the_fake_only_sends_interactions_a_discord_client_could_send():
    async with FakeDiscord() as fake:
        alice = fake.add_user("alice")
        fake.state.register_commands(None, [{"name": "talk", "description": "d", "options": [
            {"type": 1, "name": "status", "description": "d"}]}])
        with pytest.raises(NotInvocable, match="not registered"):
            await fake.send_interaction("runs list", user=alice)
        with pytest.raises(NotInvocable, match="is a group"):
            await fake.send_interaction("talk", user=alice)
        with pytest.raises(NotInvocable, match="unknown options"):
            await fake.send_interaction("talk status", {"verbose": True}, user=alice)


async def test_a_wrong_token_is_a_login_failure():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        with point_discord_py_at(fake):
            with pytest.raises(discord.LoginFailure):
                await client.login("not-the-token")
        await client.close()
    (me,) = fake.rest_calls("GET", "/users/@me")
    assert me.status == 401 and me.headers["Authorization"] == "Bot not-the-token"


async def test_channel_message_failures_raise_discord_py_errors_with_discord_codes():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        fake.fail_channel(fake.text_channel.id, "forbidden")
        with point_discord_py_at(fake):
            await client.login(fake.token)
            try:
                forbidden = client.get_partial_messageable(fake.text_channel.id)
                with pytest.raises(discord.Forbidden) as denied:
                    await forbidden.send(embed=discord.Embed(title="Call ended"))
                gone = client.get_partial_messageable(fake.voice_channel.id + 999)
                with pytest.raises(discord.NotFound) as unknown:
                    await gone.send("hello")
                fake.state.channel_failures.clear()
                channel = client.get_partial_messageable(fake.text_channel.id)
                with pytest.raises(discord.HTTPException) as too_long:
                    await channel.send(embed=discord.Embed(description="x" * 4097))
                with pytest.raises(discord.HTTPException) as too_big:
                    await channel.send(embeds=[discord.Embed(description="x" * 4000)] * 2)
                with pytest.raises(discord.HTTPException) as empty:
                    await channel.send()
                sent = await channel.send(embed=discord.Embed(title="Call ended", description="3 min"))
            finally:
                await client.close()
        fake.assert_clean()
    assert (denied.value.status, denied.value.code) == (403, 50013)
    assert (unknown.value.status, unknown.value.code) == (404, 10003)
    assert (too_long.value.status, too_long.value.code) == (400, 50035)
    assert "embeds.0.description: Must be 4096 or fewer in length." in too_long.value.text
    assert "Embed size exceeds maximum size of 6000" in too_big.value.text
    assert empty.value.code == 50006
    assert sent.embeds[0].title == "Call ended" and sent.channel.id == fake.text_channel.id
    assert [m["embeds"][0]["title"] for m in fake.state.messages] == ["Call ended"]


async def test_close_while_the_client_is_polling_leaves_the_gateway_with_4000_not_1000():
    """A fact about discord.py 2.7.1 + aiohttp 3.14: `close()` from another task wakes the poll loop
    with CLOSING, and discord.py's poll loop closes first, with 4000 (session left resumable)."""
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        with point_discord_py_at(fake):
            runner = asyncio.create_task(client.start(fake.token))
            await fake.wait_gateway_ready()
            await client.close()
            await runner
        await fake.journal.wait_for(lambda: fake.journal.closes)
    assert fake.journal.closes == [("gateway", 4000)]


# -- voice: a subprocess bot (SSL_CERT_FILE trusts the fake's certificate), shared by these tests --

JOINED_MODE = "aead_xchacha20_poly1305_rtpsize"
DISCOVERY = "DiscordVoiceWebSocket.discover_ip.<locals>.get_ip_packet"
RECEIVER = "Receiver.on_packet"


@dataclass
class VoiceRig:
    fake: FakeDiscord
    bot: BotProcess
    alice: SimUser
    bob: SimUser

    async def join(self) -> dict:
        mark = self.bot.mark()
        await self.bot.send("join", channel_id=self.fake.voice_channel.id)
        return await self.bot.wait_event("joined", after=mark)

    async def leave(self) -> None:
        mark = self.bot.mark()
        await self.bot.send("leave")
        await self.bot.wait_event("left", after=mark)

    async def heard(self, user: SimUser, frames: int, after: int) -> bytes:
        """Wait until the bot's Receiver delivered `frames` more PCM frames attributed to `user`."""
        before = self.fake_frames_before.get(user.id, 0)
        await self.bot.wait_event("pcm", after=after, where=lambda e: e["user_id"] == user.id
                                  and e["frames"] >= before + frames)
        self.fake_frames_before[user.id] = before + frames
        return self.bot.pcm(user.id)[before * 3840:(before + frames) * 3840]

    fake_frames_before: dict[int, int] = field(default_factory=dict)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def voice_rig_module(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fake_discord_voice")
    async with FakeDiscord(voice=True, workdir=workdir) as fake:
        alice, bob = fake.add_user("alice", nick="Ali"), fake.add_user("bob")
        async with BotProcess(fake, workdir) as bot:
            await bot.wait_event("guild_available")
            yield VoiceRig(fake, bot, alice, bob)


@pytest_asyncio.fixture(loop_scope="module")
async def rig(voice_rig_module):
    """The shared rig, left as found: the bot out of voice, no simulated user in the channel."""
    yield voice_rig_module
    fake = voice_rig_module.fake
    if fake.voice.bot_session is not None and voice_rig_module.bot.returncode is None:
        await voice_rig_module.leave()
    for user_id in list(fake.speakers):
        await fake.leave_voice(fake.state.guild.members[user_id])
    fake.assert_clean()


def dominant(pcm: bytes) -> float:
    return dominant_frequency(pcm[5 * 3840:])[0]  # skip the decoder's first frames


@pytest.mark.asyncio(loop_scope="module")
async def test_bot_joins_voice_reaches_dave_with_a_member_and_hears_them_as_their_pcm(rig):
    fake, bot, alice = rig.fake, rig.bot, rig.alice
    await fake.join_voice(alice)  # already in the channel: alone, DAVE pending
    mark = bot.mark()
    joined = await rig.join()
    ready = await bot.wait_event("dave", after=mark, where=lambda e: e["can_encrypt"])
    await fake.speak(alice, opus_frames(440.0, 50))
    pcm = await rig.heard(alice, 50, after=mark)

    assert joined["mode"] == JOINED_MODE
    assert ready["epoch"] == 1 and ready["op"] == 22  # welcomed by Alice's commit, transition executed
    assert abs(dominant(pcm) - 440.0) < 5
    op4 = [f.data for f in fake.journal.frames_of("gateway", "in", 4)][-1]
    assert op4["channel_id"] == fake.voice_channel.id and op4["self_deaf"] is False
    key_package = fake.journal.frames_of("voice", "in", 26)[-1].data
    assert len(key_package) > 300  # a bare MLS KeyPackage, sent after SESSION_DESCRIPTION
    assert fake.voice.relay.members == [alice.id, fake.bot.id]


@pytest.mark.asyncio(loop_scope="module")
async def test_member_joining_later_is_heard_without_speaking_op_and_hears_the_bot(rig):
    fake, bot, alice, bob = rig.fake, rig.bot, rig.alice, rig.bob
    await fake.join_voice(alice)
    mark = bot.mark()
    await rig.join()
    await bot.wait_event("dave", after=mark, where=lambda e: e["can_encrypt"])
    await fake.join_voice(bob)  # op 27 to both members: Alice's commit wins, the bot's op 28 loses
    await fake.journal.wait_for(lambda: fake.voice.relay.losing_commits)
    await fake.speak(bob, opus_frames(330.0, 40), announce=False)  # no op 5: attributed by DAVE key
    bob_pcm = await rig.heard(bob, 40, after=mark)
    await bot.send("play", freq=660.0, frames=20)
    await bot.wait_event("played", after=mark)
    heard, plain = fake.hear_bot(alice)

    assert abs(dominant(bob_pcm) - 330.0) < 5
    assert plain == 0 and len(heard) == 20
    assert abs(dominant(b"".join(heard)) - 660.0) < 5
    mark = bot.mark()
    await bot.send("stats")
    stats = (await bot.wait_event("stats", after=mark))["receiver"]
    assert stats["identified_by_dave"] == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_bot_alone_in_the_channel_commits_the_group_when_someone_joins(rig):
    fake, bot, alice = rig.fake, rig.bot, rig.alice
    mark = bot.mark()
    await rig.join()  # nobody else: the bot stays DAVE-pending
    await fake.join_voice(alice)  # only the bot can commit: its op 28 (commit ‖ welcome) is split and relayed
    ready = await bot.wait_event("dave", after=mark, where=lambda e: e["can_encrypt"])
    await fake.speak(alice, opus_frames(550.0, 30))
    pcm = await rig.heard(alice, 30, after=mark)

    assert ready["epoch"] == 1 and fake.voice.relay.local[alice.id].ready
    assert abs(dominant(pcm) - 550.0) < 5


@pytest.mark.asyncio(loop_scope="module")
async def test_receiver_listens_only_after_ip_discovery_on_every_join(rig):
    """Regression: the receiver's socket listener was registered in __init__, so discord.py's reader
    thread ran during the handshake and could take the IP-discovery reply (the fake answers inside
    its receive callback, as fast as loopback allows); discord.py then never sent SELECT_PROTOCOL.
    The probe in bot_runner records every registration, so the order is checked on every join."""
    for _ in range(3):
        joined = await rig.join()
        log = [(e["action"], e["name"], tuple(e.get("others", ()))) for e in joined["listeners"]]
        assert log == [("add", DISCOVERY, ()), ("remove", DISCOVERY, ()), ("add", RECEIVER, ())]
        await rig.leave()


@pytest.mark.asyncio(loop_scope="module")
async def test_leaving_right_after_joining_never_waits_out_the_voice_timeout(rig):
    """Regression: Discord's VOICE_STATE_UPDATE for our leave (the fake sends it at once) consumed
    discord.py's `_expecting_disconnect`, so its voice poller took our own close(1000) for the
    server's and disconnected again; that op 4 cleared the event our leave was waiting on, and
    `disconnect()` hung for the whole connect timeout (about every second leave, alone in a channel)."""
    fake, bot = rig.fake, rig.bot
    timed_out = "Timed out waiting for voice disconnection confirmation"
    before = bot.log_path.read_text().count(timed_out)
    for _ in range(5):
        mark = bot.mark()
        await bot.send("join", channel_id=fake.voice_channel.id, timeout=10.0)  # generous: a loaded machine may need seconds to connect
        await bot.wait_event("joined", after=mark)
        await rig.leave()
    assert bot.log_path.read_text().count(timed_out) == before


@pytest.mark.asyncio(loop_scope="module")
async def test_after_a_voice_server_move_the_bot_re_handshakes_rejoins_dave_and_still_hears(rig):
    """Regression: after a move discord.py reuses the socket, and its reader thread (running for the
    receiver until then) can still be in select(); a discovery reply it takes before `discover_ip`
    registered was lost. The fake sends that reply first, so the old behaviour hangs every time."""
    fake, bot, alice = rig.fake, rig.bot, rig.alice
    await fake.join_voice(alice)
    mark = bot.mark()
    await rig.join()
    await bot.wait_event("dave", after=mark, where=lambda e: e["can_encrypt"])
    await fake.speak(alice, opus_frames(440.0, 20))
    await rig.heard(alice, 20, after=mark)

    mark = bot.mark()
    fake.voice.answer_discovery_early = True  # same socket: the reply can beat discord.py's listener
    try:
        await fake.move_voice_server()  # VOICE_SERVER_UPDATE while connected: close 4014, new handshake
        rejoined = await bot.wait_event("dave", after=mark, where=lambda e: e["can_encrypt"])
    finally:
        fake.voice.answer_discovery_early = False
    await fake.speak(alice, opus_frames(600.0, 30))
    pcm = await rig.heard(alice, 30, after=mark)

    assert ("voice", 4014) in fake.journal.closes
    flips = [e for e in bot.events[mark:] if e["event"] == "dave"]
    log = [(e["action"], e["name"], tuple(e.get("others", ()))) for f in flips for e in f["listeners"]]
    assert log == [("remove", RECEIVER, ()), ("add", DISCOVERY, ()), ("remove", DISCOVERY, ()),
                   ("add", RECEIVER, ())]
    assert rejoined["epoch"] >= 2
    assert abs(dominant(pcm) - 600.0) < 5


async def test_listening_voice_client_registers_its_receiver_only_while_connected():
    client = discord.Client(intents=discord.Intents.none())
    client._connection.loop = asyncio.get_running_loop()
    vc = ListeningVoiceClient(client, _Channel())  # type: ignore[arg-type]
    reader = vc._connection._socket_reader
    try:
        assert reader._callbacks == []  # nothing for the reader thread to run for during the handshake
        assert vc._connection.socket_listeners == []
        seen = []
        for state in (ConnectionFlowState.set_guild_voice_state, ConnectionFlowState.got_ip_discovery,
                      ConnectionFlowState.connected, ConnectionFlowState.got_voice_server_update,
                      ConnectionFlowState.websocket_connected, ConnectionFlowState.connected,
                      ConnectionFlowState.connected, ConnectionFlowState.disconnected):
            vc._connection.state = state
            seen.append(vc._connection.socket_listeners.count(vc.receiver.on_packet))
        assert seen == [0, 0, 1, 0, 0, 1, 1, 0]
        assert vc._connection.state is ConnectionFlowState.disconnected
    finally:
        reader.stop()


class _Guild:
    id = 1


class _Channel:
    id = 1_200_000_000_000_000_001
    guild = _Guild()


@pytest.mark.asyncio(loop_scope="module")
async def test_ctrl_c_in_voice_exits_cleanly_but_only_after_the_voice_timeout(rig):
    """`Client.run` on Ctrl-C cancels the gateway reader first, then `VoiceClient.disconnect()` waits
    for a VOICE_STATE_UPDATE nobody reads: exit is clean but takes the connect `timeout` (30 s by
    default). A bot should leave voice itself before closing. Runs last: it ends the shared bot."""
    fake, bot = rig.fake, rig.bot
    mark = bot.mark()
    await bot.send("join", channel_id=fake.voice_channel.id, timeout=1.0)
    await bot.wait_event("joined", after=mark)
    assert await bot.stop() == 0
    assert fake.journal.closes[-2:] == [("voice", 1000), ("gateway", 1000)]
    assert fake.state.guild.voice.get(fake.bot.id) is None  # op 4 with channel_id null went out first
    assert "Timed out waiting for voice disconnection confirmation" in bot.log_path.read_text()


# -- threads, message edits, the channel write limit ----------------------------------------------


async def test_a_public_thread_starts_under_a_text_channel_and_takes_posts_and_edits():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        created = asyncio.get_running_loop().create_future()

        @client.event
        async def on_thread_create(thread: discord.Thread) -> None:
            created.set_result(thread)

        async with gateway_client(fake, client) as guild:
            text = guild.get_channel(fake.text_channel.id)
            thread = await text.create_thread(name="Call captions", type=discord.ChannelType.public_thread,
                                              auto_archive_duration=60)
            cached = await asyncio.wait_for(created, 15)
            first = await thread.send("first", allowed_mentions=discord.AllowedMentions.none())
            edited = await first.edit(content="first\nsecond", suppress=True)
        fake.assert_clean()

    assert (thread.parent_id, thread.type, thread.owner_id) == (text.id, discord.ChannelType.public_thread, fake.bot.id)
    assert (thread.name, thread.auto_archive_duration, thread.archived) == ("Call captions", 60, False)
    assert cached.id == thread.id and cached.parent is text  # THREAD_CREATE put it in discord.py's cache
    assert edited.channel.id == thread.id and edited.content == "first\nsecond" and edited.edited_at is not None
    assert edited.flags.suppress_embeds
    (create,) = fake.rest_calls("POST", f"/channels/{text.id}/threads")
    assert create.status == 201 and create.body == {"name": "Call captions", "type": 11, "auto_archive_duration": 60,
                                                     "invitable": True, "rate_limit_per_user": None}
    (stored,) = fake.thread_messages(fake.threads[0])
    assert stored["content"] == "first\nsecond" and stored["position"] == 0 and fake.edits_of(stored) == 1
    assert fake.threads[0].message_count == 1


async def test_thread_bodies_channels_and_permissions_discord_refuses():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        text_id, voice_id = fake.text_channel.id, fake.voice_channel.id
        hidden = await fake.add_text_channel("hidden")

        async def start(channel_id: int, body: dict) -> discord.HTTPException | dict:
            route = discord.http.Route("POST", "/channels/{channel_id}/threads", channel_id=channel_id)
            try:
                return await client.http.request(route, json=body)
            except discord.HTTPException as exc:
                return exc

        ok = {"name": "captions", "type": 11, "auto_archive_duration": 60}
        with point_discord_py_at(fake):
            await client.login(fake.token)
            try:
                refused = {
                    "empty name": await start(text_id, {**ok, "name": " "}),
                    "long name": await start(text_id, {**ok, "name": "x" * 101}),
                    "archive": await start(text_id, {**ok, "auto_archive_duration": 30}),
                    "type": await start(text_id, {**ok, "type": 0}),
                    "voice": await start(voice_id, ok),
                    "unknown": await start(voice_id + 999, ok),
                }
                thread = await start(text_id, ok)
                refused["under a thread"] = await start(int(thread["id"]), ok)
                await fake.deny_bot(fake.text_channel, 1 << 35)  # Create Public Threads
                await fake.deny_bot(hidden, 1 << 10)  # View Channel
                refused["denied"] = await start(text_id, ok)
                refused["hidden"] = await start(hidden.id, ok)
                private = await start(text_id, {**ok, "type": 12})  # Create Private Threads is still allowed
            finally:
                await client.close()
        fake.assert_clean()

    codes = {why: (exc.status, exc.code) for why, exc in refused.items()}
    assert codes == {"empty name": (400, 50035), "long name": (400, 50035), "archive": (400, 50035),
                     "type": (400, 50035), "voice": (400, 50024), "unknown": (404, 10003),
                     "under a thread": (400, 50024), "denied": (403, 50013), "hidden": (403, 50001)}
    assert "name: Must be between 1 and 100 in length." in refused["long name"].text
    assert "auto_archive_duration" in refused["archive"].text
    assert [t.id for t in fake.threads] == [int(thread["id"]), int(private["id"])]
    assert private["type"] == 12 and private["thread_metadata"]["invitable"] is True


async def test_message_edits_and_thread_posts_discord_refuses():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        alice = fake.add_user("alice")
        with point_discord_py_at(fake):
            await client.login(fake.token)
            try:
                text = await client.fetch_channel(fake.text_channel.id)
                thread = await text.create_thread(name="t", type=discord.ChannelType.public_thread)
                mine = await thread.send("mine")
                theirs = fake.post_as(alice, fake.threads[0], "hers")
                elsewhere = await text.send("in the channel")

                async def edit(message_id: int, body: dict, channel_id: int = thread.id) -> discord.HTTPException:
                    route = discord.http.Route("PATCH", "/channels/{channel_id}/messages/{message_id}",
                                               channel_id=channel_id, message_id=message_id)
                    with pytest.raises(discord.HTTPException) as refused:
                        await client.http.request(route, json=body)
                    return refused.value

                refused = {
                    "unknown": await edit(mine.id + 1, {"content": "x"}),
                    "not mine": await edit(int(theirs["id"]), {"content": "x"}),
                    "other channel": await edit(elsewhere.id, {"content": "x"}),
                    "too long": await edit(mine.id, {"content": "x" * 2001}),
                    "emptied": await edit(mine.id, {"content": ""}),
                    "mentions": await edit(mine.id, {"content": "x", "allowed_mentions": {"parse": ["everyone", "x"]}}),
                }
                await fake.deny_bot(fake.text_channel, 1 << 38)  # Send Messages in Threads
                with pytest.raises(discord.Forbidden) as no_posts:
                    await thread.send("after the denial")
            finally:
                await client.close()
        fake.assert_clean()

    codes = {why: (exc.status, exc.code) for why, exc in refused.items()}
    assert codes == {"unknown": (404, 10008), "not mine": (403, 50005), "other channel": (404, 10008),
                     "too long": (400, 50035), "emptied": (400, 50006), "mentions": (400, 50035)}
    assert no_posts.value.code == 50013
    assert [m["content"] for m in fake.thread_messages(thread.id)] == ["mine", "hers"]
    assert fake.state.message_edits == {}


async def test_the_sixth_write_in_a_channel_within_the_window_is_a_429_discord_py_waits_out():
    """Creates and edits share the channel's write limit; the 429 carries Discord's body and headers, with
    `Via` (without it discord.py would take it for Cloudflare's ban page and raise)."""
    now = [100.0]
    async with FakeDiscord(clock=lambda: now[0], write_window_s=0.3) as fake:
        client = discord.Client(intents=discord.Intents.default())
        with point_discord_py_at(fake):
            await client.login(fake.token)
            try:
                channel = client.get_partial_messageable(fake.text_channel.id)
                first = await channel.send("1")
                await channel.send("2")
                await channel.send("3")
                await first.edit(content="1, edited")
                await first.edit(content="1, edited twice")
                sixth = asyncio.create_task(channel.send("6"))
                await fake.journal.wait_for(lambda: fake.state.rate_limited, 15)
                now[0] += 0.3  # the window passes on the fake's clock while discord.py sleeps retry_after
                sent = await asyncio.wait_for(sixth, 15)
            finally:
                await client.close()
        fake.assert_clean()

    limited = next(c for c in fake.journal.rest if c.status == 429)
    assert limited.method == "POST" and limited.body["content"] == "6"
    assert limited.response == {"message": "The channel you are writing has hit the write rate limit",
                                "retry_after": 0.3, "global": False, "code": 20028}
    headers = limited.response_headers
    assert headers["Via"] and headers["X-RateLimit-Scope"] == "shared" and headers["X-RateLimit-Remaining"] == "0"
    assert (headers["Retry-After"], headers["X-RateLimit-Reset-After"], headers["X-RateLimit-Limit"]) == ("1", "0.300", "5")
    assert fake.state.rate_limited[0] == fake.text_channel.id
    assert sent.content == "6" and fake.rest_calls("POST", f"/channels/{fake.text_channel.id}/messages")[-1].status == 200
    assert [m["content"] for m in fake.state.messages] == ["1, edited twice", "2", "3", "6"]


async def test_the_fake_records_who_a_message_would_ping():
    async with FakeDiscord() as fake:
        client = discord.Client(intents=discord.Intents.default())
        alice = fake.add_user("alice")
        with point_discord_py_at(fake):
            await client.login(fake.token)
            try:
                channel = client.get_partial_messageable(fake.text_channel.id)
                loud = await channel.send(f"@everyone look, <@{alice.id}>")  # no allowed_mentions: all parsed
                await channel.send(f"@everyone look, <@{alice.id}>", allowed_mentions=discord.AllowedMentions.none())
                await channel.send(f"\\@everyone <@\u200b{alice.id}> @\u200bhere <#{fake.text_channel.id}>")
                await loud.edit(content="<@&42>", allowed_mentions=discord.AllowedMentions(roles=False))
            finally:
                await client.close()
        fake.assert_clean()
    assert fake.state.pinged == [{"message_id": str(loud.id), "everyone": True, "users": [str(alice.id)],
                                  "roles": []}]
