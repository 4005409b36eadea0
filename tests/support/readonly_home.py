"""A home the command under test can read but not write, and that command run as a separate process.

As root (this suite's usual user), permission bits do not bind: the home is given to `nobody` and the
command runs as root without the capabilities that override them (`setpriv --bounding-set`), so it
meets the bits as any other user would. As any other user, the bits are simply taken away."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

NOBODY = 65534
_DROP = "-dac_override,-dac_read_search,-fowner"
ROOT_USER = os.geteuid() == 0


def _require() -> None:
    if ROOT_USER and shutil.which("setpriv") is None:
        pytest.fail("these tests run as root and need setpriv (util-linux) to drop root's file capabilities")


def unwritable(home: Path) -> None:
    """Neither the home nor its files can be written by the command."""
    _require()
    for path in (home, *home.iterdir()):
        if ROOT_USER:  # owned by another user, readable by all
            os.chown(path, NOBODY, NOBODY)
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        else:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)


def read_only_file(path: Path) -> None:
    """The home stays writable, but the database file cannot be written by the command."""
    _require()
    if ROOT_USER:
        os.chown(path, NOBODY, NOBODY)
        os.chmod(path, 0o644)
    else:
        os.chmod(path, 0o444)


def restore(home: Path) -> None:
    """Make `home` removable again by the test."""
    for path in (home, *home.iterdir()):
        if ROOT_USER:
            os.chown(path, 0, 0)
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def switchboard_process(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`switchboard ARGV` in its own process, as a user the home's permission bits bind."""
    prefix = ["setpriv", "--bounding-set", _DROP] if ROOT_USER else []
    return subprocess.run([*prefix, sys.executable, "-m", "bot", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
