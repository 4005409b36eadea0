"""`switchboard run` through the real discord.py client against the loopback fake Discord: sync,
slash commands and their operator checks, run notifications in the runs channel, shutdown."""

from __future__ import annotations

import asyncio
import unicodedata

from bot.cli.run import serve
from bot.discord.client import intents
from runs import Delivery
from tests.support.discord_service import OPENAI_KEY, Service, service, settings_for
from tests.support.fake_discord import EPHEMERAL, FakeDiscord, SimUser, point_discord_py_at
from tests.support.fake_discord.checks import pinged
from tests.support.fake_discord.interactions import build_command_interaction
from tests.support.runs import SAFETY_S


async def test_commands_sync_with_only_the_intents_needed_and_status_is_an_ephemeral_embed(tmp_path):
    async with service(tmp_path) as svc:
        status = await svc.command("talk status", user=svc.guest)
    (sync,) = svc.fake.rest_calls("PUT", f"/applications/{svc.fake.state.application_id}/commands")
    groups = {c["name"]: sorted(o["name"] for o in c["options"]) for c in sync.body}
    assert groups == {"talk": ["captions", "join", "leave", "mode", "status"], "runs": ["list", "show", "stop"],
                      "transcripts": ["search", "show"],
                      "callbacks": ["disable", "enable", "list", "register", "remove", "update"]}
    identify = svc.fake.gateway.sessions[0].identify
    assert identify["intents"] == intents().value
    assert not intents().members and not intents().message_content and not intents().presences
    assert status["flags"] & EPHEMERAL
    (embed,) = status["embeds"]
    assert embed["title"] == "Call status" and "Not in a voice channel" in embed["description"]
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert fields["agent lanes"] == "command" and fields["operators"] == "1"
    assert "usage" not in fields  # no call, nothing used
    assert OPENAI_KEY not in str(status)
    assert svc.fake.journal.closes == [("gateway", 1000)]  # shut down normally


async def test_guild_ids_sync_to_each_guild_for_instant_commands(tmp_path):
    async with service(tmp_path, guild_sync=True) as svc:
        status = await svc.command("talk status", user=svc.guest)
    app = svc.fake.state.application_id
    assert not svc.fake.rest_calls("PUT", f"/applications/{app}/commands")
    (sync,) = svc.fake.rest_calls("PUT", f"/applications/{app}/guilds/{svc.fake.guild_id}/commands")
    assert sorted(c["name"] for c in sync.body) == ["callbacks", "runs", "talk", "transcripts"]
    assert status["embeds"][0]["title"] == "Call status"  # the guild copy answers


async def test_changing_commands_are_refused_for_non_operators_even_with_an_operators_display_name(tmp_path):
    async with service(tmp_path) as svc:
        join = await svc.command("talk join", user=svc.guest)  # same nick "Olive" as the operator
        leave = await svc.command("talk leave", user=svc.guest)
        stop = await svc.command("runs stop", {"run": 1}, user=svc.guest)
    for answer in (join, leave, stop):
        assert answer["flags"] & EPHEMERAL and not answer["deferred"]
        (embed,) = answer["embeds"]
        assert embed["description"].startswith("Only an operator can") and str(svc.guest.id) in embed["description"]
    assert not svc.fake.state.messages  # nothing was posted anywhere


async def test_with_no_operators_configured_nobody_may_change_anything_and_says_how_to_fix_it(tmp_path):
    async with service(tmp_path, operators=False) as svc:
        join = await svc.command("talk join", user=svc.operator)
    (embed,) = join["embeds"]
    assert "none is configured" in embed["description"] and "SWITCHBOARD_OPERATOR_USER_IDS" in embed["description"]


async def test_an_operator_not_in_voice_is_told_to_join_one_first(tmp_path):
    async with service(tmp_path) as svc:
        join = await svc.command("talk join", user=svc.operator)
    (embed,) = join["embeds"]
    assert join["flags"] & EPHEMERAL and "Join a voice channel first" in embed["description"]


async def test_a_finished_run_is_posted_in_the_runs_channel_and_listed_shown_and_not_stoppable_twice(tmp_path):
    async with service(tmp_path) as svc:
        bot_runs = svc.bot.runs
        await bot_runs.delegate("audit the auth module", requester_id=svc.operator.id)
        await asyncio.wait_for(bot_runs.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
        listing = await svc.command("runs list", user=svc.guest)
        shown = await svc.command("runs show", {"run": 1}, user=svc.guest)
        missing = await svc.command("runs show", {"run": 9}, user=svc.guest)
        stop = await svc.command("runs stop", {"run": 1}, user=svc.operator)
    (posted,) = svc.fake.state.messages
    (embed,) = posted["embeds"]
    assert posted["channel_id"] == str(svc.fake.text_channel.id)
    assert embed["title"] == "Run 1: audit the auth module" and embed["color"] == 0x57F287
    assert embed["description"] == "answer: audit the auth module"
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert fields["asked by"] == f"<@{svc.operator.id}>" and fields["lane"] == "command"
    assert "started in" not in fields  # delegated outside any call
    (post,) = svc.fake.rest_calls("POST", f"/channels/{svc.fake.text_channel.id}/messages")
    assert post.body["allowed_mentions"] == {"parse": []}  # naming the requester pings nobody
    assert "**1** · finished · command" in listing["embeds"][0]["description"]
    assert shown["embeds"][0]["description"] == "answer: audit the auth module"
    assert "There is no run 9" in missing["embeds"][0]["description"]
    assert stop["deferred"] and "already" in stop["embeds"][0]["description"].lower()


HOSTILE_TASK = ("\x1b]52;c;cHduZWQ=\x07\u202eeno\u202c read [Open the report](https://evil.example/phish) to "
                "@everyone \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\")


async def test_a_run_whose_task_and_output_are_hostile_is_posted_listed_and_shown_as_text(tmp_path):
    async with service(tmp_path) as svc:
        bot_runs = svc.bot.runs
        await bot_runs.delegate(HOSTILE_TASK, requester_id=svc.operator.id)  # the agent echoes it as its answer
        await asyncio.wait_for(bot_runs.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
        listing = await svc.command("runs list", user=svc.guest)
        shown = await svc.command("runs show", {"run": 1}, user=svc.guest)
        pending = await svc.fake.send_autocomplete("runs show", {"run": ""}, focused="run", user=svc.guest)
        suggested = await svc.fake.wait_response(pending)
    (posted,) = svc.fake.state.messages
    texts = [posted["embeds"][0]["title"], posted["embeds"][0]["description"],
             listing["embeds"][0]["description"], shown["embeds"][0]["description"]]
    for text in texts:
        assert pinged(text, None) == {"everyone": False, "users": [], "roles": []}, text
        assert "[Open the report](" not in text and "Open the report" in text, text
    choices = [c["name"] for c in suggested["data"]["choices"]]  # plain text in Discord's picker: no markdown
    for text in [*texts, *choices]:
        assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in text.replace("\u200b", "")), text


async def test_a_post_the_channel_refuses_is_kept_shown_in_status_and_never_loses_the_run(tmp_path):
    async with service(tmp_path) as svc:
        svc.fake.fail_channel(svc.fake.text_channel.id, "forbidden")
        bot_runs = svc.bot.runs
        await bot_runs.delegate("write the report", requester_id=svc.operator.id)
        done = await asyncio.wait_for(bot_runs.wait_until(1, lambda t: t.delivery is Delivery.DELIVERED), SAFETY_S)
        status = await svc.command("talk status", user=svc.guest)
        svc.fake.state.channel_failures.clear()
        shown = await svc.command("runs show", {"run": 1}, user=svc.guest)
    assert done.output.strip() == "answer: write the report"
    fields = {f["name"]: f["value"] for f in status["embeds"][0]["fields"]}
    assert "may not post in channel" in fields["last run post failed"]
    assert shown["embeds"][0]["description"] == "answer: write the report"


async def test_a_rejected_token_is_one_line_and_exit_2(tmp_path, capsys):
    async with FakeDiscord() as fake:
        settings = settings_for(tmp_path, fake, None, DISCORD_BOT_TOKEN="not-the-token")
        with point_discord_py_at(fake):
            code = await asyncio.wait_for(serve(settings), 15)
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == ("switchboard run: Discord rejected the bot token (DISCORD_BOT_TOKEN): copy it again from "
                           "the Developer Portal (Bot → Reset Token)")
    assert "not-the-token" not in err


OTHER_GUILD = 1_300_000_000_000_000_009


async def command_from(svc: Service, where: str, command: str, options: dict | None = None, *,
                       user: SimUser) -> dict:
    """`command` as Discord sends it from a DM (`where="dm"`) or from another server the bot is in
    (`where="other server"`, through the global copy of the commands)."""
    pending = build_command_interaction(svc.fake.state, command, options, user, svc.fake.text_channel)
    payload = pending.payload
    payload["data"].pop("guild_id", None)  # the global command, not the home guild's copy
    if where == "dm":
        for key in ("guild_id", "guild", "member", "guild_locale"):
            payload.pop(key)
        payload.update(user=user.user_payload(), context=1,
                       channel={"id": payload["channel_id"], "type": 1, "recipients": [user.user_payload()]})
    else:
        payload.update(guild_id=str(OTHER_GUILD), guild={"id": str(OTHER_GUILD), "locale": "en-US", "features": []},
                       authorizing_integration_owners={"0": str(OTHER_GUILD)})
        payload["channel"]["guild_id"] = str(OTHER_GUILD)
    await svc.fake.gateway.current.dispatch("INTERACTION_CREATE", payload)
    response = await svc.fake.wait_response(pending)
    if response["type"] == 5:  # deferred: it was not refused at once; the answer is the first follow-up
        await svc.fake.journal.wait_for(lambda: pending.followups, SAFETY_S)
        return {"deferred": True, **pending.followups[0]}
    return {"deferred": False, **response["data"]}


async def test_talk_runs_transcripts_and_callbacks_answer_only_in_the_home_server(tmp_path):
    asks = [("talk status", None), ("talk join", None), ("talk leave", None), ("talk mode", {"mode": "addressed"}),
            ("talk captions", {"state": "on"}),
            ("runs list", None), ("runs show", {"run": 1}), ("runs stop", {"run": 1}),
            ("transcripts search", {"query": "dentist"}), ("transcripts show", {"id": "call_1"}),
            ("callbacks list", None), ("callbacks remove", {"id": "notes"})]
    async with service(tmp_path, guild_sync=True) as svc:
        refusals = {(where, command): await command_from(svc, where, command, options, user=svc.operator)
                    for where in ("dm", "other server") for command, options in asks}
        at_home = await svc.command("runs list", user=svc.operator)
        status = await svc.command("talk status", user=svc.guest)
    for (where, command), answer in refusals.items():
        assert answer.get("flags", 0) & EPHEMERAL and not answer["deferred"], (where, command, answer)
        (embed,) = answer["embeds"]
        place = "in a direct message" if where == "dm" else "in this server"
        assert embed["description"] == (f"This is not available {place}: it belongs to the server Switchboard "
                                        "serves (SWITCHBOARD_GUILD_IDS)."), (where, command, embed)
    assert "not available" not in str(at_home)  # the home server is answered
    assert status["deferred"] and "it belongs to the server" not in str(status)  # /talk status: anyone there
    assert not svc.fake.state.messages  # nothing was posted anywhere
