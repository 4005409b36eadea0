"""The two store engines a bench compares: SQLite in a temp dir, and a PostgreSQL database.

PostgreSQL is `SWITCHBOARD_BENCH_DATABASE_URL` when set (a server whose user may CREATE DATABASE), else
a throwaway server from Debian's binaries (the tests' `PostgresServer`), restarted here with durable
settings (fsync, synchronous_commit and full_page_writes on, as a production server has them): the
tests' fsync=off would flatter its writes against SQLite's synchronous=FULL. Without either, the
PostgreSQL half is skipped and said so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.postgres import PostgresServer, _database_url, admin, binaries

URL_VARIABLE = "SWITCHBOARD_BENCH_DATABASE_URL"


@contextlib.contextmanager
def postgres_admin_url() -> Iterator[str | None]:
    """An admin URL of a PostgreSQL server for the run, or None (then the PostgreSQL half is skipped)."""
    if given := os.environ.get(URL_VARIABLE):
        yield given
        return
    if binaries() is None:
        yield None
        return
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="switchboard-bench-pg-")))
    server.start()
    try:
        subprocess.run([*server._as, str(server.bin / "pg_ctl"), "-D", str(server.data), "-w", "-m", "fast", "-l",
                        str(server.root / "log"), "-o", f"-k {server.root} -c listen_addresses='' -c fsync=on "
                        "-c synchronous_commit=on -c full_page_writes=on -c max_connections=100", "restart"],
                       check=True, capture_output=True, timeout=120)
        yield server.url
    finally:
        server.remove()


def new_database(admin_url: str) -> str:
    """A fresh, empty database on the server; its URL."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin(admin_url, f"CREATE DATABASE {name}")
    return _database_url(admin_url, name)


def server_version(admin_url: str) -> str:
    import psycopg

    with psycopg.connect(admin_url) as conn:
        return conn.execute("SHOW server_version").fetchone()[0].split()[0]


def load() -> str:
    """The machine's load average, for the printed figures (other work on a shared machine shows here)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} CPUs"
