"""A throwaway PostgreSQL for the tests: one server per test run, a database per test.

`SWITCHBOARD_TEST_DATABASE_URL` (a server whose user may CREATE DATABASE) is used when set. Otherwise
the first test that needs PostgreSQL starts one from Debian's binaries (/usr/lib/postgresql/*/bin):
its data directory and unix socket in a temporary directory, no TCP port, fsync off, run as the
`postgres` user when the tests run as root (PostgreSQL refuses root). xdist workers share it: the
first takes a file lock, starts it and writes its URL; the others read it; the last worker to finish
stops it (a count kept under the same lock). Each test gets its own database, `CREATE DATABASE …
TEMPLATE` of one kept empty but prepared (unaccent), so it starts in milliseconds.

Without the binaries (and without the setting) the PostgreSQL half of the suite is skipped, and the
run says so once at its end (`pytest_terminal_summary` in tests/conftest.py).

`PostgresServer` is also what a test uses to own a server of its own (to restart it mid-stream).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

TEST_URL_VARIABLE = "SWITCHBOARD_TEST_DATABASE_URL"
TEMPLATE = "switchboard_template"
SKIPPED = "PostgreSQL half NOT RUN: no PostgreSQL binaries under /usr/lib/postgresql/*/bin and no " \
          f"{TEST_URL_VARIABLE} (install Debian's postgresql package, or `make setup` as root)"


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def available() -> bool:
    return bool(os.environ.get(TEST_URL_VARIABLE)) or binaries() is not None


class PostgresServer:
    """One PostgreSQL server in `root` (data and socket), started and stopped with pg_ctl."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.bin = binaries()
        if self.bin is None:
            raise RuntimeError(SKIPPED)
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={quote(str(self.root), safe='')}&port=5432"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.root / "log"), "-o",
                  f"-k {self.root} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
                  f"-c full_page_writes=off -c max_connections=300", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop("fast")
        self.start()

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def admin(url: str, *statements: str) -> None:
    """Run statements in autocommit on `url` (CREATE DATABASE cannot run in a transaction)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _prepare_template(url: str) -> None:
    admin(url, f"CREATE DATABASE {TEMPLATE}")
    admin(_database_url(url, TEMPLATE), "CREATE EXTENSION IF NOT EXISTS unaccent")


def _database_url(url: str, database: str) -> str:
    """`url` (a postgresql:// URL) naming `database` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


class SharedServer:
    """The run's one server, shared by xdist workers through files under the temp dir named by the run."""

    def __init__(self, run_id: str) -> None:
        self.dir = Path(tempfile.gettempdir()) / f"switchboard-pg-{run_id}"
        self.lock = Path(tempfile.gettempdir()) / f"switchboard-pg-{run_id}.lock"
        self.state = self.dir.with_suffix(".json")
        self.url: str | None = None
        self._joined = False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict]:
        with open(self.lock, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            state = json.loads(self.state.read_text()) if self.state.exists() else {"users": 0}
            yield state
            self.state.write_text(json.dumps(state))

    def join(self) -> str:
        """The server's admin URL, starting it (and its template database) when this is the first user."""
        if self.url is not None:
            return self.url
        with self._locked() as state:
            if given := os.environ.get(TEST_URL_VARIABLE):
                if not state.get("url"):
                    admin(given, f"DROP DATABASE IF EXISTS {TEMPLATE}")
                    _prepare_template(given)
                    state["url"] = given
            elif not state.get("url"):
                server = PostgresServer(self.dir).start()
                _prepare_template(server.url)
                state["url"], state["own"] = server.url, True
            state["users"] += 1
            self.url = state["url"]
            self._joined = True
        return self.url

    def leave(self) -> None:
        """This worker is done; the last one stops a server it started."""
        if not self._joined:
            return
        with self._locked() as state:
            state["users"] -= 1
            if state["users"] <= 0 and state.get("own"):
                PostgresServer(self.dir).remove()
                state.clear()
                state["users"] = 0

    def new_database(self) -> str:
        """A fresh database for one test (a copy of the template); its URL."""
        url = self.join()
        name = f"t_{uuid.uuid4().hex[:16]}"
        admin(url, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return _database_url(url, name)
