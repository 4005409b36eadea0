"""This host's processes as the kernel knows them: a pid plus its start time names one incarnation."""

from __future__ import annotations

import os
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


def this_process() -> str:
    """`host:pid:start` of this process (start `?` where /proc is unavailable): the head of every owner
    token it writes (`runs.procs.owner_token`, `listener.ledger.process_owner`)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start_time(pid) or '?'}"
