"""Read a SQLite store without writing anything next to it: for the commands that only read (doctor,
`runs list/show`, `transcripts`, `callbacks list/show`), which must work on a home they cannot write.

A WAL database opened read-only the usual way (`mode=ro`) still creates its `-wal` and `-shm` files
when they are missing and leaves them behind, owned by whoever ran the command. So:

- `-wal` present: a process may be writing right now. Open `mode=ro`, which uses the sidecars that
  are there (and sees that process's commits) and creates nothing.
- `-wal` absent: no connection is open (the last one to close checkpoints and deletes it), so the
  file alone holds every commit. Open it `immutable=1`: no sidecar, no lock. (A writer that starts
  during such a read and checkpoints before it ends could make it fail: one line, try again. A
  command's few short reads make that unlikely; it cannot damage anything, since nothing is written.)

Nothing is migrated: a store older than this code is opened the usual way when the home is writable
(the caller decides), and is otherwise one line saying how to upgrade it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path

from common.store.base import Store
from common.store.dialect import Migration, newer_than_known
from common.store.errors import StoreError


def read_uri(path: Path) -> str:
    """The URI that opens `path` for reading without creating its sidecars (see the module docstring)."""
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    return uri if path.with_name(path.name + "-wal").exists() else uri + "&immutable=1"


@contextlib.contextmanager
def reading(path: Path, *, timeout: float = 5.0) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection that only reads `path` and writes nothing beside it; closed on exit."""
    db = sqlite3.connect(read_uri(path), uri=True, timeout=timeout)
    try:
        yield db
    finally:
        db.close()


def can_write(home: Path, path: Path) -> bool:
    """Whether this process may write the store: the file and the directory (for its sidecars)."""
    return os.access(path, os.R_OK | os.W_OK) and os.access(home, os.W_OK | os.X_OK)


def read_only_problem(home: Path, path: Path) -> str | None:
    """The line `doctor` prints for a store this process can read but not write, or None."""
    if not path.exists() or os.access(path, os.R_OK | os.W_OK):
        return None
    return (f"{path} is read-only for this user: switchboard run, listen and talk would refuse it (the reading "
            f"commands still work); make SWITCHBOARD_HOME and its files yours and writable (chmod 700 the "
            f"directory, 600 the file), or run as their owner")


def known_versions(migrations: Iterable[Migration]) -> dict[str, int]:
    known: dict[str, int] = {}
    for m in migrations:
        known[m.package] = max(known.get(m.package, 0), m.version)
    return known


def schema_gap(path: Path, found: Mapping[str, int], migrations: Iterable[Migration]) -> list[str]:
    """The packages whose migrations `path` still lacks; raises MigrationError for a newer schema."""
    behind = []
    for package, version in sorted(known_versions(migrations).items()):
        current = found.get(package, 0)
        if current > version:
            raise newer_than_known(path, package, current, version)
        if current < version:
            behind.append(package)
    return behind


async def open_read_only(path: Path, migrations: Iterable[Migration], make: Callable[[str], Awaitable[Store]]
                         ) -> Store | None:
    """The store at `path` opened for reading only (`make(uri)` builds it over one connection), or None
    when its schema is behind this code and this process can write it (the caller then opens it the
    usual way, which upgrades it). Raises StoreError when it is behind and cannot be upgraded here, or
    MigrationError when it is newer than this code."""
    store = await make(read_uri(path))
    try:
        try:
            found = await store.versions()
        except sqlite3.OperationalError:
            found = {}  # no schema_migrations table yet: a file no Switchboard has finished creating
        if behind := schema_gap(path, found, migrations):
            await store.close()
            if can_write(path.parent, path):
                return None
            raise StoreError(f"{path} was written by an older Switchboard ({', '.join(behind)} not upgraded yet) "
                             f"and this user cannot write it to upgrade it: run switchboard run or listen once as "
                             f"its owner, then try again; nothing was changed")
    except BaseException:
        await store.close()
        raise
    store.read_only = True
    return store
