"""The suite's home folder: a throwaway one, so no test writes into the user's.

A command run without SWITCHBOARD_HOME keeps its store in `~/.switchboard`; libpulse writes
`~/.config/pulse`, and other libraries their caches under `~/.cache`. `tests/conftest.py` points HOME
and the XDG folders at a fresh temporary folder before any worker starts (workers and the processes
tests start inherit it) and removes it at the end. A test that starts a process with an environment of
its own gives it a HOME of its own (`tmp_path`), as the suite's tests do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

MARK = "SWITCHBOARD_TEST_HOME"  # the folder `remove_home` removes at the end of the run
XDG = {"XDG_CONFIG_HOME": ".config", "XDG_CACHE_HOME": ".cache", "XDG_DATA_HOME": ".local/share",
       "XDG_STATE_HOME": ".local/state"}


def isolate_home() -> Path:
    """Point HOME and the XDG base folders at a new empty temporary folder (in this process's
    environment, which every worker and child inherits); returns it."""
    home = Path(tempfile.mkdtemp(prefix="switchboard-test-home-"))
    os.environ["HOME"] = str(home)
    for name, sub in XDG.items():
        os.environ[name] = str(home / sub)
    os.environ[MARK] = str(home)
    return home


def remove_home() -> None:
    home = os.environ.get(MARK)
    if home and Path(home).name.startswith("switchboard-test-home-"):
        shutil.rmtree(home, ignore_errors=True)
