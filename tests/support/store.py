"""A damaged store for the tests that show nothing is ever deleted or repaired behind the user's back."""

from __future__ import annotations

import os

from common.store import DB_FILENAME


def damage(home, kind: str) -> bytes | None:
    """Put a damaged store in `home`; returns the file's bytes (to show nothing was changed)."""
    import shutil
    import sqlite3

    path = home / DB_FILENAME
    home.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "keep.txt").write_text("mine")
        return None
    if kind == "fifo":
        os.mkfifo(path)
        return None
    if kind == "not a database":
        path.write_bytes(b"these are my notes, not a database\n" * 50)
        return path.read_bytes()
    good = home.parent / f"good-{kind.replace(' ', '-')}.db"
    db = sqlite3.connect(good)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    db.executemany("INSERT INTO notes (text) VALUES (?)", [("x" * 300,)] * 500)
    db.commit()
    db.close()
    if kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    else:
        shutil.copy(good, path)
    return path.read_bytes()
