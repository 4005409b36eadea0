"""`doctor` probes each configured agent lane the way `delegate_task` will."""

from __future__ import annotations

import asyncio
import shlex
import sys

import discord

from bot.cli import doctor
from bot.settings import check_settings
from tests.support.fake_hermes import FakeHermes
from tests.support.runs import FAKE_AGENT, KEY, free_port


def rows(variables: dict[str, str]) -> dict[str, doctor.Check]:
    report = check_settings(variables)
    assert not report.problems, report.problems
    return {check.name: check for check in doctor.agent_lanes(report.settings)}


async def test_a_running_api_server_and_a_real_command_are_both_ok_in_the_configured_order():
    async with FakeHermes(key=KEY) as fake:
        found = await asyncio.to_thread(rows, {
            "SWITCHBOARD_AGENT_LANES": "command,hermes-api", "SWITCHBOARD_HERMES_API_URL": fake.url,
            "SWITCHBOARD_HERMES_API_KEY": KEY,
            "SWITCHBOARD_AGENT_COMMAND": shlex.join([sys.executable, FAKE_AGENT, "answer", "{task}"])})
    assert list(found) == ["agent lane command", "agent lane hermes-api"]
    api = found["agent lane hermes-api"]  # the fake speaks 0.19.0, which offers no steering
    assert api.status == "ok" and api.detail == "available (this Hermes offers no steering: runs can be " \
                                                "stopped, not steered)"
    assert found["agent lane command"].status == "ok" and "not steered" in found["agent lane command"].detail


async def test_a_wrong_key_and_a_missing_program_are_warnings_that_say_what_to_do():
    async with FakeHermes(key=KEY) as fake:
        fake.expect_violation()
        found = await asyncio.to_thread(rows, {
            "SWITCHBOARD_HERMES_API_URL": fake.url, "SWITCHBOARD_HERMES_API_KEY": "not-the-key",
            "SWITCHBOARD_AGENT_COMMAND": "no-such-agent-cli -z {task}"})
    api, command, summary = found["agent lane hermes-api"], found["agent lane command"], found["background runs"]
    assert api.status == "warn" and "rejected" in api.detail and "not-the-key" not in api.detail
    assert command.status == "warn" and "`no-such-agent-cli` was not found on PATH" in command.detail
    assert summary.status == "warn" and "delegate_task will refuse" in summary.detail


def test_only_the_configured_lanes_are_probed():
    found = rows({"SWITCHBOARD_AGENT_LANES": "hermes-api",
                  "SWITCHBOARD_HERMES_API_URL": f"http://127.0.0.1:{free_port()}"})
    assert list(found) == ["agent lane hermes-api", "background runs"]
    assert "not running" in found["agent lane hermes-api"].detail


def discord_rows(variables: dict[str, str]) -> dict[str, doctor.Check]:
    report = check_settings(variables)
    assert not report.problems, report.problems
    return {check.name: check for check in doctor._discord(report.settings)}


def test_the_invite_url_comes_from_the_token_with_exactly_the_permissions_needed():
    import base64

    token = base64.b64encode(b"1577111991095394304").decode().rstrip("=") + ".GxYz12.s3cr3t-part-never-shown"
    rows = discord_rows({"DISCORD_BOT_TOKEN": token})
    assert rows["discord"].status == "ok" and "s3cr3t" not in rows["discord"].detail
    needed = discord.Permissions(view_channel=True, send_messages=True, embed_links=True, connect=True, speak=True,
                                 create_public_threads=True, send_messages_in_threads=True,  # live captions
                                 read_message_history=True)  # replies under call cards (else error 160002)
    assert ("https://discord.com/oauth2/authorize?client_id=1577111991095394304&scope=bot%20applications.commands"
            f"&permissions={needed.value}") in rows["discord"].detail and needed.value == 309240876032
    assert rows["runs channel"].status == "warn"
    assert discord_rows({})["discord"].status == "warn"
    assert discord_rows({"DISCORD_BOT_TOKEN": "not-a-token"})["discord"].status == "warn"


async def test_doctor_shows_the_last_failed_run_post_from_the_store(tmp_path):
    from common.store import open_store
    from runs.repository import MIGRATIONS, RunRepository

    store = await open_store(tmp_path, MIGRATIONS)
    repo = RunRepository(store)
    ticket = await repo.create(lane="command", task="t", requester_id=None, owner="o", idempotency_key="k", now=1.0)
    await repo.log(ticket.id, "post_failed", "channel 1234567890123456789: the bot may not post there", 2.0)
    await store.close()
    token = "MTU3NzExMTk5MTA5NTM5NDMwNA.GxYz12.abc"
    rows = discord_rows({"DISCORD_BOT_TOKEN": token, "SWITCHBOARD_HOME": str(tmp_path),
                         "SWITCHBOARD_RUNS_CHANNEL_ID": "1234567890123456789"})
    assert rows["runs channel"].status == "warn" and "may not post there" in rows["runs channel"].detail


async def test_doctor_counts_the_calls_the_next_start_would_rejoin(tmp_path):
    from common.store import open_store
    from voice.call.records import MIGRATIONS, CallRecords

    token = "MTU3NzExMTk5MTA5NTM5NDMwNA.GxYz12.abc"
    variables = {"DISCORD_BOT_TOKEN": token, "SWITCHBOARD_HOME": str(tmp_path)}
    assert "calls" not in discord_rows(variables)  # no store yet
    store = await open_store(tmp_path, MIGRATIONS)
    records = CallRecords(store)
    assert "calls" not in discord_rows(variables)  # no call yet
    ids = [await records.start(guild_id=1, voice_channel_id=2, text_channel_id=None, started_by=None,
                               mode="everyone", captions=False, at=1.0) for _ in range(4)]
    await records.mark_resume(ids[1])
    await records.end(ids[2], "/talk leave", 2.0)
    await store.close()
    calls = discord_rows(variables)["calls"]
    assert calls.status == "ok" and calls.detail.startswith("3 voice calls not ended (2 left by a crash, "
                                                            "1 stopped for a restart)")


def test_the_listener_row_says_off_bad_or_ok_and_never_shows_the_key():
    def row(variables):
        report = check_settings(variables)
        assert not report.problems, report.problems
        return doctor._listener(report.settings)

    assert row({}).status == "warn" and "TRANSCRIPT_LISTENER_API_KEY is not set" in row({}).detail
    leaky = check_settings({"TRANSCRIPT_LISTENER_API_KEY": "sn-secret", "SMARTNUMBERS_STREAM_URL": "ws://203.0.113.5/ws"})
    assert leaky.problems == ("SMARTNUMBERS_STREAM_URL='ws://203.0.113.5/ws': stream URL refused: only wss:// is "
                              "accepted (ws:// needs SMARTNUMBERS_ALLOW_INSECURE_LOCAL=true and a loopback host)",)
    [listener] = [c for c in doctor.run_checks(leaky) if c.name == "listener"]
    assert listener.status == "bad" and listener.detail == "not checked: fix SMARTNUMBERS_STREAM_URL first (above)"
    fine = row({"TRANSCRIPT_LISTENER_API_KEY": "sn-secret", "SWITCHBOARD_ACTIVATION_NAMES": "Aries"})
    assert fine.status == "ok" and "sn-secret" not in fine.detail and "Aries" in fine.detail


def test_the_recaps_row_says_whether_a_call_gets_its_summary_and_debrief_and_never_shows_the_key():
    def recaps(variables: dict[str, str]) -> doctor.Check | None:
        return next((c for c in doctor.run_checks(check_settings(variables)) if c.name == "recaps"), None)

    token = "MTU3NzExMTk5MTA5NTM5NDMwNA.GxYz12.abc"
    without = recaps({"DISCORD_BOT_TOKEN": token})
    assert without.status == "warn" and "without a summary" in without.detail
    key = "sk-text-NEVER-SHOWN-0123456789"
    shown = recaps({"DISCORD_BOT_TOKEN": token, "SWITCHBOARD_TEXT_API_KEY": key})
    assert shown.status == "ok" and key not in shown.detail and "SWITCHBOARD_TEXT_API_KEY" in shown.detail
    bad = recaps({"DISCORD_BOT_TOKEN": token, "SWITCHBOARD_TEXT_API_KEY": key,
                  "SWITCHBOARD_TEXT_URL": "http://example.com/v1"})
    assert bad.status == "bad" and "SWITCHBOARD_TEXT_URL" in bad.detail
    assert recaps({}) is None  # no Discord bot, no recaps
