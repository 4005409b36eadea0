"""A throwaway PostgreSQL for the tests: one server per test run, a database per test.

`SWITCHBOARD_TEST_DATABASE_URL` (a server whose user may CREATE DATABASE) is used when set. Otherwise
the first test that needs PostgreSQL starts one from Debian's binaries (/usr/lib/postgresql/*/bin):
its data directory and unix socket in a temporary directory, no TCP port, fsync off, run as the
`postgres` user when the tests run as root (PostgreSQL refuses root). xdist workers share it: the
first takes a file lock, starts it and writes its URL; the others read it; the last worker to finish
stops it (a count kept under the same lock). Each test gets a schema of its own in one shared
database (`options=-csearch_path=…` in its URL; CREATE DATABASE takes ~0.5 s here, CREATE SCHEMA
milliseconds); the store's locks are per schema, so tests on other workers never wait for each other.

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

from runs.procs import same_process

TEST_URL_VARIABLE = "SWITCHBOARD_TEST_DATABASE_URL"
DATABASE = "switchboard_tests"
SKIPPED = "PostgreSQL half NOT RUN: no PostgreSQL binaries under /usr/lib/postgresql/*/bin and no " \
          f"{TEST_URL_VARIABLE} (install Debian's postgresql package, or `make setup` as root; or " \
          "SWITCHBOARD_TEST_POSTGRES=off was set)"


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def available() -> bool:
    """Whether the PostgreSQL half can run here (SWITCHBOARD_TEST_POSTGRES=off skips it on purpose)."""
    if os.environ.get("SWITCHBOARD_TEST_POSTGRES", "").lower() == "off":
        return False
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


def _prepare_database(url: str) -> str:
    """The shared test database on the server at `url` (made anew), with unaccent; its URL."""
    admin(url, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)", f"CREATE DATABASE {DATABASE}")
    tests = _database_url(url, DATABASE)
    admin(tests, "CREATE EXTENSION IF NOT EXISTS unaccent")
    return tests


def in_schema(url: str, schema: str) -> str:
    """`url` with `schema` first on its search path (unaccent stays reachable in public)."""
    parts = urlsplit(url)
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("options="))
    options = quote(f"-csearch_path={schema},public", safe="")
    return urlunsplit(parts._replace(query=f"{query}&options={options}" if query else f"options={options}"))


def _database_url(url: str, database: str) -> str:
    """`url` (a postgresql:// URL) naming `database` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def sweep_abandoned(keep: Path) -> None:
    """Stop the servers of earlier runs whose workers are all gone (a run killed before its last worker
    could stop its server), and forget them."""
    for state_file in Path(tempfile.gettempdir()).glob("switchboard-pg-*.json"):
        if state_file == keep:
            continue
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if "pids" not in state or any(same_process(f"{pid}:?") for pid in state["pids"]):
            continue  # in use (or written by a version that did not say by whom: never touched)
        if state.get("own"):
            PostgresServer(state_file.with_suffix("")).remove()
        for leftover in (state_file, state_file.with_suffix(".lock")):
            with contextlib.suppress(OSError):
                leftover.unlink()


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
                    state["url"] = _prepare_database(given)
            elif not state.get("url"):
                sweep_abandoned(self.state)
                server = PostgresServer(self.dir).start()
                state["url"], state["own"] = _prepare_database(server.url), True
            state["users"] += 1
            state["pids"] = [*state.get("pids", []), os.getpid()]
            self.url = state["url"]
            self._joined = True
        return self.url

    def leave(self) -> None:
        """This worker is done; the last one stops a server it started."""
        if not self._joined:
            return
        with self._locked() as state:
            state["users"] -= 1
            state["pids"] = [pid for pid in state.get("pids", []) if pid != os.getpid()]
            if state["users"] <= 0 and state.get("own"):
                PostgresServer(self.dir).remove()
                state.clear()
                state["users"] = 0
        if not self.state.exists() or json.loads(self.state.read_text()).get("users", 0) <= 0:
            with contextlib.suppress(OSError):
                self.state.unlink()

    def new_database(self) -> str:
        """A fresh, empty store place for one test (a schema of its own); its URL."""
        url = self.join()
        schema = f"t_{uuid.uuid4().hex[:16]}"
        admin(url, f"CREATE SCHEMA {schema}")
        return in_schema(url, schema)


def store_env(home: Path, database_url: str | None) -> dict[str, str]:
    """The settings variables that put a command's store in `home` (SQLite) or at `database_url`."""
    return {"SWITCHBOARD_HOME": str(home), **({"SWITCHBOARD_DATABASE_URL": database_url} if database_url else {})}
