"""Settings parse fail-closed; doctor and the CLI never print secrets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.settings import Settings, SettingsError, parse_operator_ids, realtime_api_key

SECRET = "sk-live-should-never-appear-42"


@pytest.mark.parametrize("raw", ["", "  ", "abc", "123", "1234567890123456789,", "1234567890123456789,,x",
                                 "1234567890123456789;1234567890123456788", "-1234567890123456789"])
def test_blank_or_malformed_operator_ids_authorise_nobody(raw):
    ids, problem = parse_operator_ids(raw)
    assert ids == frozenset() and problem and "nobody" in problem


def test_operator_ids_parse_immutable_snowflakes():
    ids, problem = parse_operator_ids("123456789012345678, 987654321098765432")
    assert ids == {123456789012345678, 987654321098765432} and problem is None
    assert parse_operator_ids(None) == (frozenset(), None)


def test_key_resolution_prefers_the_scoped_key_and_never_falls_through_a_blank_one():
    both = Settings.from_env({"SWITCHBOARD_OPENAI_API_KEY": "scoped", "OPENAI_API_KEY": "shared"})
    assert realtime_api_key(both).reveal() == "scoped"
    shared = Settings.from_env({"OPENAI_API_KEY": "shared"})
    assert realtime_api_key(shared).reveal() == "shared"
    blank = Settings.from_env({"SWITCHBOARD_OPENAI_API_KEY": " ", "OPENAI_API_KEY": "shared"})
    with pytest.raises(SettingsError, match="set but blank"):
        realtime_api_key(blank)
    with pytest.raises(SettingsError, match="no API key"):
        realtime_api_key(Settings.from_env({}))
    xai = Settings.from_env({"SWITCHBOARD_PROVIDER": "xai", "OPENAI_API_KEY": "shared"})
    with pytest.raises(SettingsError, match="XAI_API_KEY"):
        realtime_api_key(xai)


def test_settings_never_print_secrets():
    settings = Settings.from_env({"SWITCHBOARD_DISCORD_TOKEN": SECRET, "OPENAI_API_KEY": SECRET})
    assert SECRET not in repr(settings) and SECRET not in str(realtime_api_key(settings))


def test_bad_values_are_problems_with_safe_defaults():
    settings = Settings.from_env({"SWITCHBOARD_PROVIDER": "acme", "SWITCHBOARD_ENDPOINTING": "psychic",
                                  "SWITCHBOARD_IDENTITY_INCLUDE": "persona,diary", "SWITCHBOARD_DEAF_SECONDS": "-1"})
    assert settings.provider == "openai" and settings.endpointing == "server"
    assert settings.identity_include == ("persona",) and settings.deaf_after_s == 5.0
    assert len(settings.problems) == 4


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    return subprocess.run([sys.executable, "-m", "bot", "--env-file", "/nonexistent", *args],
                          capture_output=True, text=True, env={**base, **(env or {})}, timeout=60)


def test_version_and_help():
    assert run_cli("--version").stdout.startswith("switchboard ")
    help_text = run_cli("--help").stdout
    assert "doctor" in help_text and "talk" in help_text


def test_doctor_names_settings_but_never_their_values():
    result = run_cli("doctor", env={"OPENAI_API_KEY": SECRET, "SWITCHBOARD_OPERATOR_USER_IDS": "nope"})
    out = result.stdout + result.stderr
    assert "libopus" in out and "davey" in out and "OPENAI_API_KEY" in out
    assert SECRET not in out
    assert "nobody may run mutating tools" in out and result.returncode == 1  # malformed operators


def test_talk_without_a_key_says_what_to_set():
    result = run_cli("talk", "--input-wav", "a.wav", "--output-wav", "b.wav")
    assert result.returncode == 2 and "SWITCHBOARD_OPENAI_API_KEY" in result.stderr
