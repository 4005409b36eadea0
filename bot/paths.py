"""Checks on paths a command will write, made before anything is created (one line each)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path


def output_problem(path: Path, label: str) -> str | None:
    """Why `path` cannot be written as a new or replaced file (one line), or None."""
    parent = path.parent
    if path.is_symlink() and not path.exists():
        return f"{label} {path}: is a symlink to a missing file ({os.readlink(path)}); give a real file name"
    if path.is_dir():
        return f"{label} {path}: is a directory; give a file name, e.g. {path / 'answer.wav'}"
    if not parent.exists():
        return f"{label} {path}: the directory {parent} does not exist; create it first (mkdir -p {shlex.quote(str(parent))})"
    if not parent.is_dir():
        return f"{label} {path}: {parent} is not a directory"
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        return f"{label} {path}: permission denied; pick a directory you can write to"
    return None


def home_problem(home: Path) -> str | None:
    """Why SWITCHBOARD_HOME cannot hold the store (one line), or None. Nothing is created."""
    home = Path(home).expanduser()
    if home.exists() and not home.is_dir():
        return f"SWITCHBOARD_HOME {home}: is not a directory; point it at a directory (default ~/.switchboard)"
    probe = home
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"SWITCHBOARD_HOME {home}: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"SWITCHBOARD_HOME {home}: permission denied at {probe}; pick a directory you can write to"
    return None
