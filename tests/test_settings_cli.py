"""Settings parse fail-closed; doctor and the CLI never print secrets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.settings import Settings, SettingsError, check_settings, parse_operator_ids, realtime_api_key

SECRET = "sk-live-should-never-appear-42"


@pytest.mark.parametrize("raw", ["abc", "123", "1234567890123456789,", "1234567890123456789,,x",
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


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    return subprocess.run([sys.executable, "-m", "bot", "--env-file", "/dev/null", *args],
                          capture_output=True, text=True, env={**base, **(env or {})}, timeout=60)


def test_version_and_help():
    assert run_cli("--version").stdout.startswith("switchboard ")
    help_text = run_cli("--help").stdout
    assert "doctor" in help_text and "talk" in help_text and "Exit codes" in help_text


def test_doctor_names_settings_but_never_their_values():
    result = run_cli("doctor", env={"OPENAI_API_KEY": SECRET, "SWITCHBOARD_OPERATOR_USER_IDS": "nope"})
    out = result.stdout + result.stderr
    assert "libopus" in out and "davey" in out and "OPENAI_API_KEY" in out
    assert SECRET not in out
    assert "nobody may run mutating tools" in out and result.returncode == 1  # malformed operators


def test_talk_without_a_key_says_what_to_set():
    result = run_cli("talk", "--input-wav", "a.wav", "--output-wav", "b.wav")
    assert result.returncode == 2 and "SWITCHBOARD_OPENAI_API_KEY" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
