"""Process identity on this host: who owns a run's watcher, and is a recorded pid still that process."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable

from common.process import process_start_time, this_process
from common.store import process_session


def process_token(pid: int) -> str:
    """`pid:start` for a process of this host (start is `?` where /proc is unavailable)."""
    return f"{pid}:{process_start_time(pid) or '?'}"


def same_process(token: str) -> bool:
    """Whether the process named by `process_token` still runs (and is not a reused pid)."""
    pid_text, _, start = token.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    if start and start != "?":
        return process_start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_token() -> str:
    """This service instance, as recorded on the runs it watches: `host:pid:start:nonce`."""
    return f"{this_process()}:{secrets.token_hex(4)}"


def elsewhere(owners: Iterable[str]) -> bool:
    """Whether any of these owners names a process of another host."""
    return any(owner.split(":", 1)[0] != socket.gethostname() for owner in owners)


def owner_alive(owner: str, *, me: str, sessions: frozenset[str] | None = None) -> bool:
    """Whether a run's recorded watcher is still a live service instance.

    Another host's owner is alive while its process holds a session on the shared server (`sessions`:
    `common.store.Store.sessions()`, PostgreSQL); without one to ask (SQLite: one file is never shared
    across hosts; a container restarted under a new hostname must still reconcile its runs) it counts
    as gone. Another instance inside this very process is gone too: one process runs one service, so
    it was an earlier, closed one.
    """
    if owner == me:
        return True
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname():
        return sessions is not None and process_session(owner) in sessions
    if parts[1] == str(os.getpid()):
        return False
    return same_process(f"{parts[1]}:{parts[2]}")
