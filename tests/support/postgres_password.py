"""A PostgreSQL server of a test's own that checks passwords (scram-sha-256) over TCP on loopback: the
shared test server trusts its socket, so a wrong password could not be told from a right one there."""

from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path

from tests.support.postgres import PostgresServer

PASSWORD = "pg-Secret-7Kq2w"  # the superuser's; never printed by any command


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PasswordServer(PostgresServer):
    """`postgres` with PASSWORD, reached at 127.0.0.1:`port` only with it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def start(self) -> PasswordServer:
        self.root.mkdir(parents=True, exist_ok=True)
        secret = self.root / "pwfile"
        secret.write_text(PASSWORD + "\n")
        if self._as:
            user = pwd.getpwnam("postgres")
            for path in (self.root, secret):
                os.chown(path, user.pw_uid, user.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "scram-sha-256",
                      f"--pwfile={secret}", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.root / "log"), "-o",
                  f"-k {self.root} -c listen_addresses=127.0.0.1 -p {self.port} -c fsync=off", "start")
        return self

    @property
    def version(self) -> str:
        """The server's version as doctor shows it, e.g. 15.18."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            return conn.execute("SHOW server_version").fetchone()[0].split()[0]
