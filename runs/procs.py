"""Process identity on this host: who owns a run's watcher, and is a recorded pid still that process."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if unknown / gone.

    A pid alone can be reused; pid + start time names one process incarnation.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after its last ')'
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


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
    return f"{socket.gethostname()}:{process_token(os.getpid())}:{secrets.token_hex(4)}"


def owner_alive(owner: str, *, me: str) -> bool:
    """Whether a run's recorded watcher is still a live service instance.

    Another host's owner counts as gone (one SQLite file is never shared across hosts; a container
    restarted under a new hostname must still reconcile its runs). Another instance inside this very
    process is gone too: one process runs one service, so it was an earlier, closed one.
    """
    if owner == me:
        return True
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname():
        return False
    if parts[1] == str(os.getpid()):
        return False
    return same_process(f"{parts[1]}:{parts[2]}")
