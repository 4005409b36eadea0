"""A store that cannot be used — not a database, cut short, a directory in its place, from a newer
Switchboard, or damaged deep inside a table — is one line from every command, naming the file and
what to do, exit 2, never a traceback; nothing is deleted; and `doctor` marks it BAD and goes on."""

from __future__ import annotations

import os
import sqlite3
import wave
from pathlib import Path

import pytest

from bot.cli import doctor
from bot.cli.main import main
from bot.services import STORE_MIGRATIONS
from bot.settings import check_settings
from common.store import DB_FILENAME, Migration, open_store
from tests.support.store import damage

COMMANDS = {
    "runs": ["runs", "list"],
    "transcripts": ["transcripts", "search", "dentist"],
    "callbacks": ["callbacks", "list"],
    "listen": ["listen"],
    "run": ["run"],
    "talk": ["talk", "--input-wav", "{wav}", "--output-wav", "{out}", "--timeout", "5"],
}
KINDS = ("not a database", "truncated", "directory", "newer schema", "damaged inside")


async def damaged_home(home: Path, kind: str) -> None:
    if kind in ("not a database", "truncated", "directory"):
        damage(home, kind)
        return
    store = await open_store(home, STORE_MIGRATIONS)
    await store.execute("INSERT INTO runs (lane, task, state, owner, idempotency_key, created_at, updated_at) "
                        "VALUES ('command', 't', 'completed', 'o', 'k', 0, 0)")
    await store.close()
    db = sqlite3.connect(home / DB_FILENAME)
    if kind == "newer schema":
        db.execute("INSERT INTO schema_migrations (package, version, applied_at) VALUES ('runs', 99, 0)")
        db.commit()
        db.close()
        return
    # every table's and index's root page is overwritten but the schema's (page 1) and the migration
    # versions': the store opens, and the first query of a command finds the damage
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    roots = [r for (r,) in db.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1 AND tbl_name != "
                                      "'schema_migrations'")]
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(home / DB_FILENAME, "r+b") as f:
        for root in roots:
            f.seek((root - 1) * page_size)
            f.write(b"\xff" * page_size)


def environment(home: Path) -> dict[str, str]:
    return {"SWITCHBOARD_HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home.parent),
            "OPENAI_API_KEY": "sk-test-not-used", "DISCORD_BOT_TOKEN": "MTAx.not-used.token-value",
            "TRANSCRIPT_LISTENER_API_KEY": "sn-key-not-used", "SMARTNUMBERS_STREAM_URL": "ws://127.0.0.1:9/ws/hermes",
            "SMARTNUMBERS_ALLOWED_STREAM_HOSTS": "127.0.0.1", "SMARTNUMBERS_ALLOW_INSECURE_LOCAL": "true",
            "SWITCHBOARD_AGENT_LANES": "command", "SWITCHBOARD_AGENT_COMMAND": "no-such-agent {task}"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_says_what_is_wrong_with_a_damaged_store_in_one_line_and_exits_2(tmp_path, capsys, command,
                                                                                          kind):
    import asyncio

    home = tmp_path / "home"
    asyncio.run(damaged_home(home, kind))
    wav = tmp_path / "in.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000), w.writeframes(b"\0\0" * 2400)
    before = sorted((p.name, p.stat().st_size) for p in home.rglob("*"))
    argv = [a.format(wav=wav, out=tmp_path / "out.wav") for a in COMMANDS[command]]
    code = main(["--env-file", os.devnull, *argv], environment(home))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("switchboard")]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert str(home / DB_FILENAME) in lines[0]
    assert ("upgrade Switchboard" if kind == "newer schema" else "move it aside") in lines[0], lines[0]
    assert sorted((p.name, p.stat().st_size) for p in home.rglob("*") if not p.name.endswith(("-wal", "-shm"))) == \
        [entry for entry in before if not entry[0].endswith(("-wal", "-shm"))]  # nothing deleted or rewritten


@pytest.mark.parametrize("kind", KINDS)
def test_doctor_marks_a_damaged_store_bad_and_checks_everything_else(tmp_path, kind):
    import asyncio

    home = tmp_path / "home"
    asyncio.run(damaged_home(home, kind))
    report = check_settings(environment(home))
    checks = doctor.run_checks(report)
    (store,) = [c for c in checks if c.name == "store"]
    assert store.status == "bad" and str(home / DB_FILENAME) in store.detail, store
    assert ("upgrade Switchboard" if kind == "newer schema" else "move it aside") in store.detail
    assert doctor.exit_code(checks) == 1
    names = {c.name for c in checks}
    assert {"agent lane command", "settings"} <= names  # it went on checking the rest


def test_a_new_home_and_a_healthy_store_are_ok_for_doctor(tmp_path):
    import asyncio

    home = tmp_path / "home"
    (store,) = [c for c in doctor.run_checks(check_settings(environment(home))) if c.name == "store"]
    assert store.status == "ok" and not home.exists()  # doctor creates nothing

    async def create() -> None:
        store = await open_store(home, (Migration("x", 1, "CREATE TABLE x (id INTEGER);"),))
        await store.close()

    asyncio.run(create())
    (store,) = [c for c in doctor.run_checks(check_settings(environment(home))) if c.name == "store"]
    assert store.status == "ok", store
