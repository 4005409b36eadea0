"""What the help and the exit codes promise, checked against what the commands do; and what doctor says
a call starts with (issue 29's newcomer's list)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

import pytest

from bot.cli import doctor
from bot.cli.main import build_parser
from bot.settings import check_settings
from tests.support.cli import switchboard
from tests.support.paths import ROOT
from tests.support.store import recorded_home


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("switchboard",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _help(argv: list[str]) -> str:
    code, out, err = switchboard([*argv, "--help"], {})
    assert code == 0 and err == ""
    return " ".join(out.split())


def test_every_argument_and_every_command_has_a_description():
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{' '.join(path)} {choice.dest}" for choice in action._choices_actions if not choice.help]
            elif not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_callbacks_review_show_help_shows_only_what_show_takes():
    shown = _help(["callbacks", "review", "show"])
    assert shown.startswith("usage: switchboard callbacks review show [-h] [--json] ")
    assert "--token" not in shown and "--deliver" not in shown
    assert "--token" in _help(["callbacks", "review", "set"]) and "--deliver" in _help(["callbacks", "review", "set"])


def test_a_bare_switchboard_is_a_usage_mistake_with_the_help(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = switchboard([], {})
    assert code == 2 and out == ""
    assert "usage: switchboard" in err and err.rstrip().endswith("switchboard: name a command, e.g. `switchboard "
                                                                 "doctor` (see above)")


def test_the_exit_code_transcripts_help_gives_for_the_store_is_the_one_it_exits_with(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "switchboard.db").write_bytes(b"this is not a database" * 100)  # damaged
    code, _, err = switchboard(["--env-file", "/dev/null", "transcripts", "search", "dentist"],
                               {"SWITCHBOARD_HOME": str(tmp_path / "home")})
    assert code == 2 and "Traceback" not in err, err
    assert "2 usage (no such call, a search with no words) or the store (cannot be opened, damaged)" in _help(
        ["transcripts"])


def test_run_help_names_every_exit_code_run_can_end_with():
    shown = _help(["run"])
    for promise in ("0 stopped", "1 Discord refused the gateway intents or a request, or the client failed",
                    "2 a setting is missing or malformed, Discord rejected the token, or the store cannot be opened "
                    "or is damaged", "130 Ctrl-C before start-up finished", "retries"):
        assert promise in shown


@pytest.mark.parametrize("argv", [["runs", "show", "abc"], ["runs", "stop", "run-3"]])
def test_a_run_reference_that_is_not_a_number_says_so(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    asyncio.run(recorded_home(tmp_path / "home"))
    code, out, err = switchboard(["--env-file", "/dev/null", *argv], {"SWITCHBOARD_HOME": str(tmp_path / "home")})
    assert code == 2 and out == ""
    assert f"{argv[-1]!r} is not a run number (e.g. 12 or #12" in err and "there is no run" not in err


def test_a_bad_listener_setting_stops_run_in_the_usual_form_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = switchboard(["--env-file", "/dev/null", "run"], {
        "DISCORD_BOT_TOKEN": "fake-bot-token.Switchboard.0123456789", "OPENAI_API_KEY": "sk-not-used",
        "SWITCHBOARD_HOME": str(tmp_path / "home"), "TRANSCRIPT_LISTENER_API_KEY": "sn-NEVER-SHOWN",
        "SMARTNUMBERS_STREAM_URL": "wss://evil.example/ws/hermes?key=sn-NEVER-SHOWN"})
    assert code == 2 and out == ""
    assert err == ("switchboard run: SMARTNUMBERS_STREAM_URL='wss://evil.example/ws/hermes?…': stream URL refused: host "
                   "evil.example is not in SMARTNUMBERS_ALLOWED_STREAM_HOSTS (exact host names, comma-separated)\n")
    assert "sn-NEVER-SHOWN" not in err and not (tmp_path / "home").exists()  # stopped before the store was opened


def test_doctor_shows_the_modes_a_call_starts_with():
    def row(variables):
        return next(c for c in doctor.run_checks(check_settings(variables)) if c.name == "call modes")

    default = row({})
    assert (default.status, default.detail) == ("ok", "reply to everyone (follow-up window 15 s in addressed mode); "
                                                      "captions off; call limit none; session rollover after 3300 s")
    chosen = row({"SWITCHBOARD_REPLY_TO": "addressed", "SWITCHBOARD_FOLLOWUP_S": "8", "SWITCHBOARD_CAPTIONS": "on",
                  "SWITCHBOARD_CALL_MAX_MINUTES": "90", "SWITCHBOARD_SESSION_ROLLOVER_S": "1800"})
    assert chosen.detail == ("reply to addressed (follow-up window 8 s in addressed mode); captions on; call limit "
                             "90 min; session rollover after 1800 s")
    bad = row({"SWITCHBOARD_FOLLOWUP_S": "1e9"})
    assert (bad.status, bad.detail) == ("bad", "not checked: fix SWITCHBOARD_FOLLOWUP_S first (above)")


def test_python_m_bot_without_the_dependencies_is_one_line_not_a_traceback(tmp_path):
    """`-S`: no site-packages, as a system Python without the venv's packages."""
    result = subprocess.run([sys.executable, "-S", "-m", "bot", "doctor"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("switchboard: ") and " is not installed for " in line and "run `make setup`" in line
