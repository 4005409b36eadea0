"""Checks on paths a command will write, made before anything is created (one line each)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

# File systems that show kernel state as files: nothing written there is kept (and SQLite cannot work).
_KERNEL_FILE_SYSTEMS = frozenset({
    "proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "pstore",
    "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc", "autofs", "nsfs", "rpc_pipefs",
})
_MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL = re.compile(r"\\([0-7]{3})")


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
    # an existing device or pipe (/dev/null, a FIFO) is written as it is; a file is kept by its file system
    kept_by = path if path.is_file() else None if path.exists() else parent
    if kept_by is not None and (kind := kernel_file_system(kept_by)):
        return f"{label} {path}: {parent} is a {kind} file system (kernel state, not storage); pick a file on disk"
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        return f"{label} {path}: permission denied; pick a directory you can write to"
    return None


def home_problem(home: Path, *, writing: bool = True) -> str | None:
    """Why SWITCHBOARD_HOME cannot hold the store (one line), or None. Nothing is created. With
    `writing=False` (a command that only reads an existing store) the home need not be writable."""
    home = Path(home).expanduser()
    if home.exists() and not home.is_dir():
        return f"SWITCHBOARD_HOME {home}: is not a directory; point it at a directory (default ~/.switchboard)"
    probe = home
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"SWITCHBOARD_HOME {home}: {probe} is not a directory"
    if kind := kernel_file_system(probe):
        return (f"SWITCHBOARD_HOME {home}: {probe} is a {kind} file system (kernel state, not storage); point it "
                "at a directory on disk (default ~/.switchboard)")
    if not os.access(probe, (os.W_OK if writing else os.R_OK) | os.X_OK):
        return f"SWITCHBOARD_HOME {home}: permission denied at {probe}; pick a directory you can write to"
    return None


def kernel_file_system(path: Path) -> str | None:
    """The type of the kernel file system (proc, sysfs, …) the existing `path` is on, or None: a file
    system that can keep files, or one this machine does not say (no /proc/self/mountinfo)."""
    try:
        mounts = _MOUNTINFO.read_text(errors="replace").splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:  # "id parent major:minor root MOUNT-POINT options [optional…] - TYPE source …"
        fields = line.split()
        if "-" not in fields[5:]:
            continue
        mount = _OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4])  # \040 is a space
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):  # the innermost (and, stacked, the last) mount holds it
            best, kind = mount, fields[fields.index("-", 5) + 1]
    return kind if kind in _KERNEL_FILE_SYSTEMS else None
