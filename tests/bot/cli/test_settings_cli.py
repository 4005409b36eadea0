"""Settings parse fail-closed; doctor and the CLI never print secrets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bot.settings import Settings, SettingsError, check_settings, parse_operator_ids, realtime_api_key
from tests.support.cli import switchboard

SECRET = "sk-live-should-never-appear-42"


@pytest.mark.parametrize("raw", ["abc", "123", "1234567890123456789,,x", ",x",
                                 "1234567890123456789;1234567890123456788", "-1234567890123456789",
                                 "1234567890123456",  # 16 digits: too short for a snowflake
                                 "01234567890123456789",  # leading zero
                                 "123456789012345678901",  # 21 digits
                                 "99999999999999999999",  # 20 digits but past 2**64 - 1
                                 "123456789012345678, 987654321098765432x"])
def test_malformed_operator_ids_authorise_nobody_and_say_so(raw):
    ids, problem = parse_operator_ids(raw)
    assert ids == frozenset() and problem and "nobody" in problem and "SWITCHBOARD_OPERATOR_USER_IDS" in problem


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_unset_or_blank_operator_ids_authorise_nobody_quietly(raw):
    assert parse_operator_ids(raw) == (frozenset(), None)
    env = {} if raw is None else {"SWITCHBOARD_OPERATOR_USER_IDS": raw}
    assert Settings.from_env(env).operator_user_ids == frozenset()


def test_operator_ids_parse_immutable_snowflakes_of_17_to_20_digits():
    ids, problem = parse_operator_ids("12345678901234567, 12345678901234567890")
    assert ids == {12345678901234567, 12345678901234567890} and problem is None
    ids, problem = parse_operator_ids("123456789012345678, 987654321098765432")
    assert ids == {123456789012345678, 987654321098765432} and problem is None


@pytest.mark.parametrize("raw", ["123456789012345678,", "123456789012345678,,", ",123456789012345678",
                                 "123456789012345678, ,987654321098765432", "123456789012345678,\t,"])
def test_a_trailing_or_doubled_comma_in_the_operator_list_disables_nobody(raw):
    ids, problem = parse_operator_ids(raw)
    assert ids and ids <= {123456789012345678, 987654321098765432} and problem is None
    report = check_settings({"SWITCHBOARD_OPERATOR_USER_IDS": raw})
    assert report.settings.operator_user_ids == ids and report.notices == () and report.problems == ()


def test_an_operator_list_of_only_commas_authorises_nobody_and_says_so():
    ids, problem = parse_operator_ids(", ,")
    assert ids == frozenset() and problem and "no Discord ID" in problem


def test_malformed_operators_are_a_notice_that_does_not_stop_commands():
    report = check_settings({"SWITCHBOARD_OPERATOR_USER_IDS": "123456789012345678,nope"})
    assert report.problems == () and report.settings.operator_user_ids == frozenset()
    assert len(report.notices) == 1 and "nobody may run mutating tools" in report.notices[0]


def test_key_resolution_prefers_the_scoped_key_and_never_falls_through_a_blank_one():
    both = Settings.from_env({"SWITCHBOARD_OPENAI_API_KEY": "scoped", "OPENAI_API_KEY": "shared"})
    assert realtime_api_key(both).get_secret_value() == "scoped"
    shared = Settings.from_env({"OPENAI_API_KEY": "shared"})
    assert realtime_api_key(shared).get_secret_value() == "shared"
    blank = Settings.from_env({"SWITCHBOARD_OPENAI_API_KEY": "", "OPENAI_API_KEY": "shared"})
    with pytest.raises(SettingsError, match="set but blank"):
        realtime_api_key(blank)
    with pytest.raises(SettingsError, match="no API key"):
        realtime_api_key(Settings.from_env({}))
    xai = Settings.from_env({"SWITCHBOARD_PROVIDER": "xai", "OPENAI_API_KEY": "shared"})
    with pytest.raises(SettingsError, match="XAI_API_KEY"):
        realtime_api_key(xai)


def test_missing_key_for_the_chosen_provider_points_at_the_one_that_is_set():
    settings = Settings.from_env({"XAI_API_KEY": "xk"})
    with pytest.raises(SettingsError, match="XAI_API_KEY is set — did you mean SWITCHBOARD_PROVIDER=xai"):
        realtime_api_key(settings)


def test_settings_never_print_secrets():
    settings = Settings.from_env({"SWITCHBOARD_DISCORD_TOKEN": SECRET, "OPENAI_API_KEY": SECRET,
                                  "SWITCHBOARD_HERMES_API_KEY": SECRET})
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in str(realtime_api_key(settings)) and SECRET not in repr(settings.discord_token)
    assert settings.discord_token.get_secret_value() == SECRET


def test_a_malformed_secret_is_reported_without_its_value():
    report = check_settings({"OPENAI_API_KEY": SECRET + " oops", "DISCORD_BOT_TOKEN": SECRET + "\n"})
    text = "\n".join(report.problems)
    assert len(report.problems) == 2 and "OPENAI_API_KEY (value not shown)" in text
    assert SECRET not in text


BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
# the console script `pip install` made for `[project.scripts]`, beside the interpreter running the tests
SCRIPT = Path(sys.executable).parent / "switchboard"


def run_cli(*args: str, env: dict[str, str] | None = None, program: tuple[str, ...] = (sys.executable, "-m", "bot"),
            ) -> subprocess.CompletedProcess:
    """A real process: `python -m bot ARGS` (or `program ARGS`) with only `env`."""
    return subprocess.run([*program, "--env-file", "/dev/null", *args],
                          capture_output=True, text=True, env={**BASE_ENV, **(env or {})}, timeout=60)


def run_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """What `run_cli` does, in this process: for tests of the output and exit code only."""
    argv = ["--env-file", "/dev/null", *args]
    code, out, err = switchboard(argv, {**BASE_ENV, **(env or {})})
    return subprocess.CompletedProcess(argv, code, out, err)


def test_version_and_help_through_both_entry_points():
    assert SCRIPT.exists(), f"{SCRIPT} is missing: install the project into this environment (make setup)"
    assert run_cli("--version", program=(str(SCRIPT),)).stdout.startswith("switchboard ")
    help_text = run_cli("--help").stdout
    assert "doctor" in help_text and "talk" in help_text and "Exit codes" in help_text


def test_doctor_names_settings_but_never_their_values():
    result = run_cli("doctor", env={"OPENAI_API_KEY": SECRET, "SWITCHBOARD_OPERATOR_USER_IDS": "nope"})
    out = result.stdout + result.stderr
    assert "libopus" in out and "davey" in out and "OPENAI_API_KEY" in out
    assert SECRET not in out
    assert "nobody may run mutating tools" in out and result.returncode == 1  # malformed operators


def test_talk_without_a_key_says_what_to_set():
    result = run_here("talk", "--input-wav", "a.wav", "--output-wav", "b.wav")
    assert result.returncode == 2 and "SWITCHBOARD_OPENAI_API_KEY" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def _description(help_text: str) -> str:
    """The paragraph argparse prints between the usage block and the argument lists ('' when none)."""
    paragraphs = help_text.split("\n\n")
    first = paragraphs[1] if len(paragraphs) > 1 else ""
    first = re.sub(r"-\n\s*", "-", first)  # argparse may wrap at a hyphen: "named-\ncommand"
    return "" if first.startswith(("positional arguments:", "options:")) else " ".join(first.split())


def _actions(help_text: str) -> dict[str, str]:
    """A group's sub-commands as argparse lists them: name -> its one-line help (wrapped lines joined)."""
    actions: dict[str, str] = {}
    block = help_text.split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    name = None
    for line in block.splitlines()[2:]:  # after "  ACTION"
        if line.startswith("    ") and not line.startswith("     "):
            name, _, text = line.strip().partition(" ")
            actions[name] = text.strip()
        elif name is not None:
            actions[name] += " " + line.strip()
    return actions


COMMANDS = ["doctor", "run", "listen", "start", "talk", "runs", "transcripts", "callbacks"]
WRITES = ["register", "update", "enable", "disable", "remove", "review"]


def test_every_command_says_what_it_does_and_callback_changes_say_they_need_a_runs_token(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal's width, read from os.environ

    def help_of(*argv: str) -> str:
        result = run_here(*argv, "--help", env={"COLUMNS": "100"})
        assert result.returncode == 0 and not result.stderr, (argv, result.stderr)
        return result.stdout

    argvs = [(), *[(c,) for c in COMMANDS], *[("callbacks", w) for w in WRITES]]
    texts = dict(zip(argvs, [help_of(*argv) for argv in argvs], strict=True))
    for command in COMMANDS:
        assert len(_description(texts[(command,)])) > 40, (command, texts[(command,)])
    top = " ".join(texts[()].split())
    assert "3 talk --timeout, or a callbacks change without a run's token" in top
    assert "1 a failure (provider, network; doctor: a check failed)" in top
    assert "2 usage, configuration or a store that cannot be opened or is damaged" in top
    callbacks = " ".join(texts[("callbacks",)].split())
    assert "Exit codes: 0 ok, 2 usage, the store (cannot be opened, damaged) or a refused change (nothing saved), 3 no valid token" \
        in callbacks
    listed = _actions(texts[("callbacks",)])
    assert "token" not in listed["list"]
    for write in WRITES:
        assert listed[write].endswith("(needs a run's token)"), (write, listed)
        own = _description(texts[("callbacks", write)])
        assert "the token a named-command run is given (--token or SWITCHBOARD_CALLBACK_TOKEN)" in own, (write, own)
        assert "without it: exit 3" in own, (write, own)
