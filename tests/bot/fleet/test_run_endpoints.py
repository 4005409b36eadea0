"""`switchboard run` (in this process, real discord.py on the fake Discord) and `switchboard listen` (on
the fake Smartnumbers stream) with SWITCHBOARD_HTTP_ADDR: 503 while run cannot reach the gateway, 200
once connected (listen: once listening), 503 again from the moment either starts to shut down (asked
from a drain step, which runs while the process is still up), and one line and exit 2 for an address
it cannot have."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from bot.cli.listen import serve as listen
from bot.cli.run import serve
from bot.fleet.readiness import Readiness
from bot.settings import check_settings
from tests.support.cli import switchboard
from tests.support.discord_service import OPENAI_KEY, service, settings_for
from tests.support.fake_discord import FakeDiscord, point_discord_py
from tests.support.fake_smartnumbers import FakeSmartnumbers
from tests.support.health import loopback_address, metric_values, probe
from tests.support.runs import SAFETY_S

LISTENER_KEY = "sn-key-NEVER-SHOWN"


def answers_while_draining(readiness: Readiness, base: str) -> dict[str, tuple[int, str]]:
    """What the endpoints answer once the shutdown has begun (filled by a drain step)."""
    seen: dict[str, tuple[int, str]] = {}

    async def look() -> None:
        for path in ("/readyz", "/healthz", "/metrics"):
            seen[path] = await probe(base, path)

    readiness.on_drain(look)
    return seen


@contextlib.asynccontextmanager
async def silent_gateway():
    """A gateway that accepts the connection and never says HELLO: the bot stays starting."""
    dialled = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        dialled.set()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/", dialled
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_readyz_is_503_while_the_gateway_is_not_connected_and_draining_at_shutdown(tmp_path):
    address, base = loopback_address()
    readiness = Readiness("starting: not connected to Discord yet")
    seen = answers_while_draining(readiness, base)
    async with FakeDiscord() as fake, silent_gateway() as (gateway, dialled):
        stopping = asyncio.Event()
        with point_discord_py(fake.api_base, gateway):
            task = asyncio.create_task(serve(settings_for(tmp_path, fake, None, SWITCHBOARD_HTTP_ADDR=address),
                                             stopping, readiness=readiness))
            try:
                await asyncio.wait_for(dialled.wait(), SAFETY_S)  # logged in; the gateway never answers
                assert await probe(base, "/healthz") == (200, "ok\n")
                assert await probe(base, "/readyz") == (503, "starting: not connected to Discord yet\n")
                values = metric_values(await probe(base, "/metrics"))
                assert (values["switchboard_ready"], values["switchboard_shards_held"],
                        values["switchboard_voice_calls"]) == (0, 0, 0)
            finally:
                stopping.set()
                code = await asyncio.wait_for(task, SAFETY_S)
    assert code == 0
    assert seen["/readyz"] == (503, "draining: shutting down\n") and seen["/healthz"][0] == 200
    assert metric_values(seen["/metrics"])["switchboard_ready"] == 0
    with pytest.raises(ConnectionRefusedError):  # closed with the process
        await asyncio.open_connection("127.0.0.1", int(address.rsplit(":", 1)[1]))


async def test_readyz_is_200_once_connected_and_503_from_the_start_of_the_shutdown(tmp_path):
    address, base = loopback_address()
    readiness = Readiness()
    seen = answers_while_draining(readiness, base)
    async with service(tmp_path, readiness=readiness, SWITCHBOARD_HTTP_ADDR=address) as svc:
        await asyncio.wait_for(svc.bot.connected.wait(), SAFETY_S)
        assert await probe(base, "/readyz") == (200, "ready\n")
        values = metric_values(await probe(base, "/metrics"))
        assert (values["switchboard_ready"], values["switchboard_shards_held"]) == (1, 1)
        assert values["switchboard_runs{state=running}"] == 0 and values["switchboard_voice_calls"] == 0
        answers = [await probe(base, path) for path in ("/healthz", "/readyz", "/metrics", "/nope")]
    assert seen["/readyz"] == (503, "draining: shutting down\n")
    values = metric_values(seen["/metrics"])
    assert values["switchboard_ready"] == 0 and values["switchboard_shards_held"] == 1  # draining, still connected
    for _, text in answers + list(seen.values()):  # no answer carries a secret
        assert OPENAI_KEY not in text and svc.fake.token not in text


async def test_a_port_in_use_stops_run_with_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"DISCORD_BOT_TOKEN": "token-never-used", "OPENAI_API_KEY": OPENAI_KEY,
               "SWITCHBOARD_HOME": str(tmp_path / "home"), "SWITCHBOARD_HTTP_ADDR": f"127.0.0.1:{port}"}
        code, out, err = await asyncio.to_thread(switchboard, ["--env-file", "/dev/null", "run"], env)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        f"switchboard run: cannot serve health and metrics on 127.0.0.1:{port} (SWITCHBOARD_HTTP_ADDR): the port is "
        "in use; choose another port, or stop what listens there")
    assert "Traceback" not in err and OPENAI_KEY not in err


async def test_a_malformed_address_stops_run_with_the_settings_line_and_exit_2(tmp_path):
    env = {"DISCORD_BOT_TOKEN": "token-never-used", "OPENAI_API_KEY": OPENAI_KEY,
           "SWITCHBOARD_HOME": str(tmp_path / "home"), "SWITCHBOARD_HTTP_ADDR": "9464"}
    code, out, err = await asyncio.to_thread(switchboard, ["--env-file", "/dev/null", "run"], env)
    assert code == 2
    assert "SWITCHBOARD_HTTP_ADDR='9464': is not host:port; use e.g. 127.0.0.1:9464" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


async def test_listen_is_ready_once_listening_shows_runs_and_the_listener_lag_and_drains_at_stop(tmp_path):
    address, base = loopback_address()
    readiness = Readiness()
    seen = answers_while_draining(readiness, base)
    async with FakeSmartnumbers(key=LISTENER_KEY) as stream:
        report = check_settings({
            "SWITCHBOARD_HOME": str(tmp_path / "home"), "TRANSCRIPT_LISTENER_API_KEY": LISTENER_KEY,
            "SMARTNUMBERS_STREAM_URL": stream.url, "SMARTNUMBERS_ALLOWED_STREAM_HOSTS": "127.0.0.1",
            "SMARTNUMBERS_ALLOW_INSECURE_LOCAL": "true", "SWITCHBOARD_HTTP_ADDR": address})
        assert report.problems == ()
        stopping = asyncio.Event()
        task = asyncio.create_task(listen(report.settings, stopping, readiness=readiness))
        try:
            await stream.wait_connection(1)  # listening: ready was said before the stream connected
            assert await probe(base, "/readyz") == (200, "ready\n")
            values = metric_values(await probe(base, "/metrics"))
            assert (values["switchboard_voice_calls"], values["switchboard_shards_held"]) == (0, 0)
            assert values["switchboard_listener_lag_seconds"] == 0
            assert values["switchboard_runs{state=completed}"] == 0
        finally:
            stopping.set()
            code = await asyncio.wait_for(task, SAFETY_S)
    assert code == 0 and seen["/readyz"] == (503, "draining: shutting down\n")
    assert all(LISTENER_KEY not in text for _, text in seen.values())
