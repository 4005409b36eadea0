"""A bad SWITCHBOARD_DATABASE_URL — an unreachable host, a wrong password, an unknown database, another
scheme, a malformed URL — is one line naming the variable and exit 2 for every command (doctor: its
BAD row, exit 1), against a real server that checks passwords; the password is never printed, and no
log line carries it."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import wave
from pathlib import Path

import pytest

from bot.cli.main import configure_logging
from bot.services import STORE_MIGRATIONS
from common.store import open_store
from tests.support.cli import switchboard
from tests.support.postgres_password import PASSWORD, PasswordServer, free_port

WRONG = "Wrong-" + PASSWORD


@pytest.fixture(scope="module")
def server():
    from tests.support.postgres import SKIPPED, available, binaries

    if binaries() is None or not available():  # a server of its own needs the binaries
        pytest.skip(SKIPPED)
    # under the system temp dir, which the postgres user can reach (pytest's own is root's alone)
    own = PasswordServer(Path(tempfile.mkdtemp(prefix="switchboard-pg-password-"))).start()
    try:
        yield own
    finally:
        own.remove()


CASES = {
    "unreachable host": lambda s: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/postgres",
    "wrong password": lambda s: f"postgresql://postgres:{WRONG}@127.0.0.1:{s.port}/postgres",
    "unknown database": lambda s: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{s.port}/no_such_db",
    "another scheme": lambda s: f"mysql://root:{PASSWORD}@127.0.0.1:{s.port}/switchboard",
    "malformed port": lambda s: f"postgresql://postgres:{PASSWORD}@127.0.0.1:port/postgres",
    "malformed host": lambda s: f"postgresql://postgres:{PASSWORD}@[::1/postgres",
    "unknown option": lambda s: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{s.port}/postgres?colour=blue",
}
EXPECTED = {"unreachable host": "Connection refused", "wrong password": "password authentication failed",
            "unknown database": '"no_such_db" does not exist', "another scheme": "its scheme is mysql",
            "malformed port": "not a well-formed URL", "malformed host": "not a well-formed URL",
            "unknown option": "not a well-formed URL"}


def commands(tmp_path) -> list[list[str]]:
    wav = tmp_path / "in.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16_000)
        w.writeframes(b"\0\0" * 1600)
    return [["runs", "list"], ["runs", "stop", "1"], ["transcripts", "search", "hello"], ["callbacks", "list"],
            ["listen"], ["run"], ["talk", "--input-wav", str(wav), "--output-wav", str(tmp_path / "out.wav")]]


@pytest.mark.parametrize("case", list(CASES))
async def test_every_command_says_one_line_naming_the_setting_and_exits_2(case, server, tmp_path):
    url = CASES[case](server)
    env = {"SWITCHBOARD_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "SWITCHBOARD_DATABASE_URL": url,
           "TRANSCRIPT_LISTENER_API_KEY": "listener-key", "OPENAI_API_KEY": "sk-test-key-for-talk-0001",
           "DISCORD_BOT_TOKEN": "MTIzNDU2Nzg5MDEyMzQ1Njc4.GAbcde.abcdefghijklmnopqrstuvwxyz0123456789AB",
           "SWITCHBOARD_AGENT_LANES": "command"}
    for argv in commands(tmp_path):
        code, out, err = await asyncio.to_thread(switchboard, argv, env)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, (argv, code, out, err)
        assert "SWITCHBOARD_DATABASE_URL" in lines[0] and EXPECTED[case] in lines[0], (argv, lines)
        assert PASSWORD not in out + err and "Traceback" not in err, (argv, err)
    code, out, err = await asyncio.to_thread(switchboard, ["doctor"], env)
    bad = [line for line in out.splitlines() if line.startswith("BAD") and "SWITCHBOARD_DATABASE_URL" in line]
    # the settings row or the store row says why (a malformed setting also leaves the store "not checked")
    assert code == 1 and [line for line in bad if EXPECTED[case] in line], out
    assert PASSWORD not in out + err


@pytest.mark.parametrize("case", list(CASES))
async def test_store_copy_names_its_target_and_never_prints_the_password(case, server, tmp_path):
    from tests.support.store import recorded_home

    await recorded_home(tmp_path / "home")
    url = CASES[case](server)
    code, out, err = await asyncio.to_thread(switchboard, ["store", "copy", "--to", url],
                                             {"SWITCHBOARD_HOME": str(tmp_path / "home")})
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "--to" in lines[0], err
    assert PASSWORD not in err and "Traceback" not in err


async def test_the_right_url_opens_the_store_and_doctor_says_which(server, tmp_path):
    env = {"SWITCHBOARD_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "SWITCHBOARD_DATABASE_URL": server.url,
           "SWITCHBOARD_AGENT_LANES": "command"}
    await (await open_store(tmp_path, STORE_MIGRATIONS, database_url=server.url)).close()  # as the first run does
    code, out, err = await asyncio.to_thread(switchboard, ["runs", "list"], env)
    assert code == 0 and "no runs" in out + err, (out, err)
    code, out, _ = await asyncio.to_thread(switchboard, ["doctor"], env)
    row = next(line for line in out.splitlines() if line.split()[1:2] == ["store"])
    assert row.startswith("ok") and f"PostgreSQL {server.version}" in row and f"127.0.0.1:{server.port}/postgres" in row
    assert "migrations applied: listener" in row and PASSWORD not in out


def test_a_library_logging_a_database_url_logs_no_password(capsys):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for handler in handlers:
        root.removeHandler(handler)
    try:
        configure_logging(verbose=False)
        logging.getLogger("a.library").warning("error connecting in 'pool-1': %s",
                                                  f"postgresql://sb:{PASSWORD}@db.example:5432/sb")
        logging.getLogger("psycopg").warning(f"conninfo: host=db.example password={PASSWORD} dbname=sb")
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "error connecting in 'pool-1': postgresql://***@db.example:5432/sb" in err
    assert PASSWORD not in err
