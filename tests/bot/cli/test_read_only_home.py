"""The commands that only read work on a home they cannot write, and leave nothing there; `doctor`
calls a store this user cannot write BAD (every command that records something would refuse it).

Each command runs as its own process, as a user the home's permission bits bind (see
`tests/support/readonly_home.py`)."""

from __future__ import annotations

import asyncio
import json
import os

from bot.services import STORE_MIGRATIONS
from common.store import DB_FILENAME, open_store
from tests.support.cli import switchboard
from tests.support.filled_home import CALLBACK, FACT, TASK, fill
from tests.support.readonly_home import read_only_file, restore, switchboard_process, unwritable

READERS = [
    (["runs", "list"], TASK),
    (["runs", "show", "1"], TASK),
    (["transcripts", "search", "Jose", "48213"], "depot"),
    (["transcripts", "show", "conv-0000"], FACT),
    (["callbacks", "list"], CALLBACK),
]


async def filled(home) -> None:
    store = await open_store(home, STORE_MIGRATIONS)
    try:
        await fill(store)
    finally:
        await store.close()


def environment(tmp_path, home) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "SWITCHBOARD_HOME": str(home),
            "SWITCHBOARD_AGENT_LANES": "command"}


async def test_reading_commands_work_on_a_home_they_cannot_write_and_create_nothing_there(tmp_path):
    home = tmp_path / "home"
    await filled(home)
    assert sorted(os.listdir(home)) == [DB_FILENAME]  # the writer's sidecars went with its last connection
    unwritable(home)
    try:
        env = environment(tmp_path, home)
        for argv, expected in READERS:
            done = switchboard_process(argv, env)
            assert done.returncode == 0, (argv, done.stderr)
            assert expected in done.stdout, (argv, done.stdout)
            assert sorted(os.listdir(home)) == [DB_FILENAME], argv
        done = switchboard_process(["runs", "list", "--json"], env)
        assert json.loads(done.stdout)[0]["task"] == TASK
        # doctor reads it too, says the home cannot be written (every recording command refuses it), writes nothing
        done = switchboard_process(["doctor"], env)
        store_rows = [line for line in done.stdout.splitlines() if line.split()[1:2] == ["store"]]
        assert done.returncode == 1 and store_rows and store_rows[0].startswith("BAD"), done.stdout
        assert "permission denied" in store_rows[0]
        assert sorted(os.listdir(home)) == [DB_FILENAME]
        # and a command that records refuses it with one line, exit 2
        done = switchboard_process(["runs", "stop", "1"], env)
        assert done.returncode == 2 and "permission denied" in done.stderr and "Traceback" not in done.stderr
    finally:
        restore(home)


async def test_doctor_calls_a_store_file_this_user_cannot_write_bad(tmp_path):
    home = tmp_path / "home"
    await filled(home)
    read_only_file(home / DB_FILENAME)
    try:
        env = environment(tmp_path, home)
        done = switchboard_process(["doctor"], env)
        store_rows = [line for line in done.stdout.splitlines() if line.split()[1:2] == ["store"]]
        assert done.returncode == 1, done.stdout
        assert store_rows[0].startswith("BAD") and "read-only for this user" in store_rows[0], store_rows
        assert sorted(os.listdir(home)) == [DB_FILENAME]
        for argv, expected in READERS[::2]:  # the reading commands still read it (all of them: the test above)
            done = switchboard_process(argv, env)
            assert done.returncode == 0 and expected in done.stdout, (argv, done.stderr)
        assert sorted(os.listdir(home)) == [DB_FILENAME]
        done = switchboard_process(["runs", "stop", "1"], env)  # as every recording command does
        assert done.returncode == 2 and "cannot" in done.stderr and "Traceback" not in done.stderr
    finally:
        restore(home)


async def test_doctor_and_reading_commands_leave_no_sidecars_in_a_writable_home(tmp_path):
    home = tmp_path / "home"
    await filled(home)
    env = environment(tmp_path, home)
    for argv in (["doctor"], *(argv for argv, _ in READERS)):
        code, out, err = await asyncio.to_thread(switchboard, argv, env)
        assert "Traceback" not in err, err
        assert sorted(os.listdir(home)) == [DB_FILENAME], argv


async def test_a_reading_command_sees_what_a_running_writer_has_committed(tmp_path):
    home = tmp_path / "home"
    store = await open_store(home, STORE_MIGRATIONS)
    try:
        await fill(store)  # committed to the -wal, not yet checkpointed into the file
        before = sorted(os.listdir(home))
        code, out, err = await asyncio.to_thread(switchboard, ["transcripts", "show", "conv-0002"],
                                                 environment(tmp_path, home))
        assert code == 0 and "depot" in out, err
        assert sorted(os.listdir(home)) == before
    finally:
        await store.close()


async def test_an_older_store_is_upgraded_when_the_home_is_writable_and_refused_in_one_line_when_not(tmp_path):
    from runs.repository import MIGRATIONS as RUNS_MIGRATIONS

    home = tmp_path / "home"
    await (await open_store(home, RUNS_MIGRATIONS[:1])).close()  # as an older Switchboard left it
    unwritable(home)
    try:
        done = switchboard_process(["runs", "list"], environment(tmp_path, home))
        assert done.returncode == 2 and "written by an older Switchboard" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and sorted(os.listdir(home)) == [DB_FILENAME]
    finally:
        restore(home)
    code, out, err = await asyncio.to_thread(switchboard, ["runs", "list"], environment(tmp_path, home))
    assert code == 0, err  # writable: opened the usual way, which upgrades it
    store = await open_store(home, STORE_MIGRATIONS)
    try:
        assert await store.versions() == {m.package: m.version for m in STORE_MIGRATIONS}
    finally:
        await store.close()
