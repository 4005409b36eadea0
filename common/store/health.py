"""`check_store`: is the store in SWITCHBOARD_HOME usable? For `doctor`, which must say so and go on.

Read-only: the file is opened without creating anything beside it (`common.store.readonly`), checked
with `PRAGMA quick_check`, and its schema versions compared with what this Switchboard knows. Nothing
is created, migrated or repaired. A store this user cannot write is a problem too: every command that
records something would refuse it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from common.store.db import DB_FILENAME
from common.store.dialect import Migration, newer_than_known
from common.store.errors import damaged, store_problem
from common.store.readonly import read_only_problem, read_uri


def check_store(home: Path, migrations: Iterable[Migration] = (), *, filename: str = DB_FILENAME) -> str | None:
    """Why the store in `home` is not usable (one line, says what to do), or None when it is fine
    or does not exist yet (it is created on first use)."""
    from common.paths import home_problem

    home = Path(home).expanduser()
    path = home / filename
    if problem := home_problem(home):
        return problem
    if not path.exists() and not path.is_symlink():
        return None
    if problem := store_problem(path) or read_only_problem(home, path):
        return problem
    known: dict[str, int] = {}
    for m in migrations:
        known[m.package] = max(known.get(m.package, 0), m.version)
    try:
        with contextlib.closing(sqlite3.connect(read_uri(path), uri=True, timeout=5)) as db:
            found = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
            if found != ["ok"]:
                return damaged(path, f"integrity check: {'; '.join(found)}")
            has_versions = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations'").fetchone()
            versions = dict(db.execute("SELECT package, MAX(version) FROM schema_migrations GROUP BY package")
                            ) if has_versions else {}
    except sqlite3.Error as exc:
        return store_problem(path, exc) or f"cannot read {path}: {exc}; check SWITCHBOARD_HOME and its permissions"
    for package, version in sorted(versions.items()):
        if package in known and version > known[package]:
            return str(newer_than_known(path, package, version, known[package]))
    return None
