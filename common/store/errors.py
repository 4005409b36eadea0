"""What can go wrong with the database file, as one line that names it and says what to do.

Nothing here deletes, moves or recreates a file: a damaged store is the user's data, so the line
says how to move it aside and that nothing was deleted.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import stat
from pathlib import Path

from common.redact import redact, scrub_secrets

# SQLite's primary result codes (the low byte of an extended code)
_BUSY, _LOCKED = 5, 6
_PERM, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _AUTH, _NOTADB = 3, 8, 10, 11, 13, 14, 23, 26


class StoreError(RuntimeError):
    """The database cannot be opened or used; the message says which file and what to do."""


class MigrationError(StoreError):
    """A package's migration list is malformed, or the database is newer than this code."""


def _code(exc: BaseException) -> int:
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def is_busy(exc: BaseException) -> bool:
    """Whether the error only means another connection holds the lock (worth waiting and retrying)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    return _code(exc) in (_BUSY, _LOCKED) or "database is locked" in str(exc) or "database table is locked" in str(exc)


def _move_aside(path: Path, suffix: str) -> str:
    return (f"move it aside (mv {shlex.quote(str(path))} {shlex.quote(str(path) + suffix)}, and its -wal and -shm "
            f"files if any) and Switchboard starts a new, empty store there; or restore a backup. Nothing is "
            f"deleted for you")


def damaged(path: Path, detail: str) -> str:
    """The line for a file that is not a usable database (not SQLite, truncated, corrupt)."""
    detail = " ".join(detail.split())[:200]  # one line, whatever SQLite said
    return f"{path} is not a usable Switchboard database ({detail}): {_move_aside(path, '.damaged')}"


def store_problem(path: Path, exc: BaseException | None = None) -> str | None:
    """Why `path` cannot be the store (one line), or None when `exc` (if any) is not about the file
    itself. Without `exc`: what can be told before opening it (a directory or device in its place)."""
    if exc is None or isinstance(exc, OSError):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as error:
            return f"cannot read {path} ({error.strerror}): make SWITCHBOARD_HOME and its files yours and readable"
        if mode is not None and stat.S_ISDIR(mode):
            return f"{path} is a directory where the database file should be: {_move_aside(path, '.moved')}"
        if mode is not None and not stat.S_ISREG(mode):
            return f"{path} is not a regular file (a device, pipe or socket): {_move_aside(path, '.moved')}"
        if isinstance(exc, PermissionError):
            return (f"cannot open {path} (permission denied): make SWITCHBOARD_HOME and its files yours and "
                    f"writable (chmod 700 the directory, 600 the file)")
        if isinstance(exc, OSError):
            return f"cannot open {path} ({exc.strerror or exc}): check SWITCHBOARD_HOME and its permissions"
        return None
    code = _code(exc)
    detail = str(exc) or type(exc).__name__
    if code in (_CORRUPT, _NOTADB):
        return damaged(path, detail)
    if code == _FULL:
        return f"the disk holding {path} is full ({detail}): free some space and try again"
    if code in (_PERM, _READONLY, _CANTOPEN, _AUTH):
        return (f"cannot write {path} ({detail}): make SWITCHBOARD_HOME and its files yours and writable "
                f"(chmod 700 the directory, 600 the file)")
    if code == _IOERR:
        return f"{path}: the disk reported an I/O error ({detail}): check the disk, then try again"
    return None


def failure_line(exc: BaseException, url: str) -> str:
    """The first line of a driver's error, without the URL's password in any form (or any other credential)."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed port: the password may still be in the text
        password = url.split("://", 1)[-1].rsplit("@", 1)[0].partition(":")[2] if "@" in url else None
    text = str(exc).strip().splitlines()
    line = " ".join(text[0].split())[:200] if text else type(exc).__name__
    return redact(scrub_secrets(line, [password or "", unquote(password or "")]))
