"""The suite leaves the user's files alone: it runs with a throwaway HOME and XDG folders
(`tests/support/home.py`), so a command run without SWITCHBOARD_HOME, libpulse and library caches
write there, never into `~/.switchboard`, `~/.config` or `~/.cache`.

The proof runs this file's own tests in a fresh pytest whose HOME is an empty folder, and checks the
folder is still empty afterwards."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import sys
from pathlib import Path

from bot.settings import check_settings
from tests.support.cli import switchboard
from tests.support.home import MARK, XDG
from tests.support.paths import ROOT
from tests.support.store import recorded_home


def test_the_suite_runs_with_a_throwaway_home_and_xdg_folders():
    home = Path(os.environ["HOME"])
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir) and home.name.startswith("switchboard-test-home-")
    assert all(Path(os.environ[name]).is_relative_to(home) for name in XDG)


def test_a_command_without_switchboard_home_writes_only_into_the_suites_home(tmp_path, monkeypatch):
    """What a test that forgets SWITCHBOARD_HOME does: its store lands in `~/.switchboard`, and doctor
    probes the terminal's audio (libpulse writes `~/.config/pulse`)."""
    monkeypatch.chdir(tmp_path)
    default = check_settings({}).settings.home
    assert default == Path(os.environ["HOME"]) / ".switchboard"
    asyncio.run(recorded_home(default))
    code, out, _ = switchboard(["--env-file", os.devnull, "doctor"], {})
    assert code in (0, 1) and "store" in out


def test_the_suite_writes_nothing_into_an_empty_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {name: value for name, value in os.environ.items()
           if name not in XDG and name != MARK and not name.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(ROOT)}::test_the_suite_runs_with_a_throwaway_home_and_xdg_folders",
         f"{Path(__file__).relative_to(ROOT)}::test_a_command_without_switchboard_home_writes_only_into_the_suites_home"],
        cwd=ROOT, env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.split()[0] == "..", result.stdout  # both ran and passed
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
