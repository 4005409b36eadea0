"""One model, one set of rules: every malformed value is a problem that names the variable and
quotes the value; blank means unset; the settings for runs and Discord are validated too."""

from __future__ import annotations

import os

import pytest

from bot.environment import EnvFileError, read_variables
from bot.settings import Settings, SettingsError, check_settings
from tests.support.paths import ROOT


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("SWITCHBOARD_PROVIDER", "xia", "is not a provider; use openai or xai"),
    ("SWITCHBOARD_ENDPOINTING", "locl", "use server or local"),
    ("SWITCHBOARD_IDENTITY_INCLUDE", "persona,memroy", "unknown section memroy"),
    ("SWITCHBOARD_IDENTITY_INCLUDE", ",", "names no section"),
    ("SMARTNUMBERS_ALLOW_INSECURE_LOCAL", "maybe", "use true, false, yes, no, on, off, 1 or 0"),
    ("SMARTNUMBERS_MAX_MESSAGE_BYTES", "12", "must be between 1024 and 67108864 bytes"),
    ("SMARTNUMBERS_ALLOWED_STREAM_HOSTS", "https://evil.example/x", "is not a host name"),
    ("SWITCHBOARD_AGENT_NAME", "Ares; rm -rf", "must be a name"),
    ("SWITCHBOARD_AGENT_ENV", "PATH,OPENAI_API_KEY", "OPENAI_API_KEY holds one of Switchboard's secrets"),
    ("SWITCHBOARD_REPLY_TO", "all", "is not a reply mode; use everyone or addressed"),
    ("SWITCHBOARD_MIN_INTERRUPTION_MS", "9999", "must be between 0"),
    ("SWITCHBOARD_MIN_INTERRUPTION_MS", "soon", "is not a whole number of milliseconds"),
    ("SWITCHBOARD_FOLLOWUP_S", "-1", "greater than 0"),
    ("SWITCHBOARD_CAPTIONS", "maybe", "is not true or false; use true, false, yes, no, on, off, 1 or 0"),
    ("SWITCHBOARD_REALTIME_URL", "not a url", "not a wss:// URL"),
    ("SWITCHBOARD_VOICE", "robot", "unknown openai voice 'robot'"),
    ("SWITCHBOARD_MODEL", "gpt realtime", "is not a model name"),
    ("SWITCHBOARD_MODEL", "gpt-realtime", "shuts down"),
    ("SWITCHBOARD_DEAF_SECONDS", "nan", "finite number of seconds greater than 0"),
    ("SWITCHBOARD_DEAF_SECONDS", "inf", "finite"),
    ("SWITCHBOARD_DEAF_SECONDS", "1e999", "finite"),
    ("SWITCHBOARD_DEAF_SECONDS", "-1", "greater than 0"),
    ("SWITCHBOARD_DEAF_SECONDS", "0", "greater than 0"),
    ("SWITCHBOARD_DEAF_SECONDS", "five", "is not a number of seconds"),
    ("SWITCHBOARD_GUILD_IDS", "123456789012345678,0123456789012345678", "not a Discord ID"),
    ("SWITCHBOARD_RUNS_CHANNEL_ID", "12345", "not a Discord ID"),
    ("SWITCHBOARD_IDLE_LEAVE_S", "nan", "finite"),
    ("SWITCHBOARD_CALL_MAX_MINUTES", "0", "greater than 0"),
    ("SWITCHBOARD_CALL_MAX_MINUTES", "inf", "finite"),
    ("SWITCHBOARD_CALL_MAX_MINUTES", "an hour", "is not a number of minutes"),
    ("SWITCHBOARD_AGENT_LANES", "hermes-api,ssh", "unknown lane ssh"),
    ("SWITCHBOARD_HERMES_API_URL", "http://10.1.2.3:8642", "clear text"),
    ("SWITCHBOARD_HERMES_API_URL", "ftp://127.0.0.1", "not a https:// URL"),
    ("SWITCHBOARD_AGENT_COMMAND", "hermes -z", "does not contain {task}"),
    ("SWITCHBOARD_AGENT_COMMAND", "hermes -z '{task}", "check its quotes"),
    ("SWITCHBOARD_AGENT_TIMEOUT_S", "-5", "greater than 0"),
    # sanity limits of the call's timing settings (issue 29 item 16)
    ("SWITCHBOARD_FOLLOWUP_S", "1e9", "must be between 1 and 300 seconds"),
    ("SWITCHBOARD_SESSION_ROLLOVER_S", "1e300", "must be between 60 and 3540 seconds; OpenAI ends a session at 60"),
    ("SWITCHBOARD_SESSION_ROLLOVER_S", "3600", "must be between 60 and 3540 seconds"),
    ("SWITCHBOARD_SESSION_ROLLOVER_S", "5", "must be between 60 and 3540 seconds"),
    ("SWITCHBOARD_CALL_MAX_MINUTES", "0.001", "must be between 0.05 and 1440 minutes"),
    ("SWITCHBOARD_CALL_MAX_MINUTES", "1e9", "must be between 0.05 and 1440 minutes"),
    ("SWITCHBOARD_DEAF_SECONDS", "0.001", "must be between 1 and 60 seconds"),
    ("SWITCHBOARD_DEAF_SECONDS", "3600", "must be between 1 and 60 seconds"),
    # a stream URL the listener key may not go to stops every command, in the usual form (item 15)
    ("SMARTNUMBERS_STREAM_URL", "ws://203.0.113.5/ws", "only wss:// is accepted"),
    ("SMARTNUMBERS_STREAM_URL", "wss://evil.example/ws/hermes", "not in SMARTNUMBERS_ALLOWED_STREAM_HOSTS"),
    ("HERMES_MAX_CONCURRENT_RUNS", "0", "must be between 1 and 10000 runs"),
    ("HERMES_MAX_CONCURRENT_RUNS", "ten", "is not a whole number of runs"),
])
def test_each_malformed_value_is_one_problem_naming_the_variable_and_quoting_the_value(name, value, reason):
    report = check_settings({name: value})
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(f"{name}={value!r}: ") and reason in report.problems[0]
    assert report.failed == {name}
    with pytest.raises(SettingsError) as err:
        Settings.from_env({name: value})
    assert err.value.problems == report.problems


def test_every_problem_is_reported_at_once_and_bad_values_fall_back_for_display():
    report = check_settings({"SWITCHBOARD_PROVIDER": "xia", "SWITCHBOARD_ENDPOINTING": "locl",
                             "SWITCHBOARD_DEAF_SECONDS": "nan", "SWITCHBOARD_MODEL": "gpt-realtime-2.1"})
    assert [p.split("=")[0] for p in report.problems] == [
        "SWITCHBOARD_PROVIDER", "SWITCHBOARD_ENDPOINTING", "SWITCHBOARD_DEAF_SECONDS"]
    assert (report.settings.provider, report.settings.endpointing, report.settings.deaf_after_s) == ("openai", "server", 5.0)


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_blank_means_unset_for_every_ordinary_setting(blank):
    names = ["SWITCHBOARD_PROVIDER", "SWITCHBOARD_MODEL", "SWITCHBOARD_VOICE", "SWITCHBOARD_REALTIME_URL",
             "SWITCHBOARD_ENDPOINTING", "SWITCHBOARD_IDENTITY_INCLUDE", "SWITCHBOARD_DEAF_SECONDS",
             "SWITCHBOARD_LATENCY_LOG", "SWITCHBOARD_GUILD_IDS", "SWITCHBOARD_AGENT_LANES",
             "SWITCHBOARD_HERMES_API_URL", "SWITCHBOARD_AGENT_COMMAND", "SWITCHBOARD_IDLE_LEAVE_S"]
    settings = Settings.from_env(read_variables(environ={name: blank for name in names}, env_file=os.devnull))
    assert settings == Settings.from_env({})
    assert (settings.model, settings.voice) == ("gpt-realtime-2.1-mini", "marin")


def test_model_and_voice_default_per_provider_and_voices_match_the_providers_spelling():
    xai = Settings.from_env({"SWITCHBOARD_PROVIDER": "XAI", "SWITCHBOARD_VOICE": "eve"})
    assert (xai.provider, xai.model, xai.voice) == ("xai", "grok-voice-latest", "Eve")
    custom = Settings.from_env({"SWITCHBOARD_VOICE": "voice_abc123"})  # OpenAI custom voices
    assert custom.voice == "voice_abc123"
    report = check_settings({"SWITCHBOARD_PROVIDER": "xai", "SWITCHBOARD_VOICE": "marin"})
    assert report.problems == ("SWITCHBOARD_VOICE='marin': unknown xai voice 'marin'; choose one of Ara, Eve, "
                               "Rex, Sal, Leo",)


def test_identity_sections_none_is_explicit_and_repeats_collapse():
    assert Settings.from_env({"SWITCHBOARD_IDENTITY_INCLUDE": "none"}).identity_include == ()
    assert Settings.from_env({"SWITCHBOARD_IDENTITY_INCLUDE": "Memory, persona,memory"}).identity_include == (
        "memory", "persona")


def test_settings_for_discord_and_runs_have_documented_defaults():
    settings = Settings.from_env({})
    assert settings.discord_token is None and settings.guild_ids == frozenset()
    assert settings.runs_channel_id is None and settings.idle_leave_s == 120.0
    assert settings.agent_lanes == ("hermes-api", "command")
    assert settings.hermes_api_url == "http://127.0.0.1:8642" and settings.hermes_api_key is None
    assert settings.agent_command == ("hermes", "-z", "{task}") and settings.agent_profile is None
    assert settings.agent_timeout_s == 1800.0
    assert settings.hermes_max_concurrent_runs == 10  # Hermes's own max_concurrent_runs
    assert Settings.from_env({"HERMES_MAX_CONCURRENT_RUNS": "4"}).hermes_max_concurrent_runs == 4


def test_settings_for_discord_and_runs_parse():
    settings = Settings.from_env({
        "SWITCHBOARD_GUILD_IDS": "123456789012345678, 223456789012345678",
        "SWITCHBOARD_RUNS_CHANNEL_ID": "323456789012345678", "SWITCHBOARD_IDLE_LEAVE_S": "30.5",
        "SWITCHBOARD_AGENT_LANES": "command", "SWITCHBOARD_HERMES_API_URL": "https://hermes.example/",
        "SWITCHBOARD_AGENT_COMMAND": "my-agent --prompt={task} --quiet 'two words'",
        "SWITCHBOARD_AGENT_PROFILE": "research", "SWITCHBOARD_AGENT_TIMEOUT_S": "60"})
    assert settings.guild_ids == {123456789012345678, 223456789012345678}
    assert settings.runs_channel_id == 323456789012345678 and settings.idle_leave_s == 30.5
    assert settings.agent_lanes == ("command",) and settings.hermes_api_url == "https://hermes.example"
    assert settings.agent_argv("rm -rf /; echo 'hi'") == ["my-agent", "--prompt=rm -rf /; echo 'hi'", "--quiet",
                                                          "two words"]
    assert settings.agent_profile == "research" and settings.agent_timeout_s == 60.0


def test_a_call_has_no_length_limit_unless_one_is_set():
    assert Settings.from_env({}).call_max_minutes is None
    assert Settings.from_env({"SWITCHBOARD_CALL_MAX_MINUTES": "90"}).call_max_minutes == 90.0


def test_agent_profile_keeps_unset_and_blank_apart():
    assert Settings.from_env({}).agent_profile is None
    assert Settings.from_env(read_variables(environ={"SWITCHBOARD_AGENT_PROFILE": "  "},
                                            env_file=os.devnull)).agent_profile == ""


def test_two_named_secrets_use_the_first_that_is_set_and_a_blank_first_name_means_none():
    assert Settings.from_env({"SWITCHBOARD_DISCORD_TOKEN": "old"}).discord_token.get_secret_value() == "old"
    both = Settings.from_env({"DISCORD_BOT_TOKEN": "new", "SWITCHBOARD_DISCORD_TOKEN": "old"})
    assert both.discord_token.get_secret_value() == "new"
    assert Settings.from_env({"API_SERVER_KEY": "k2"}).hermes_api_key.get_secret_value() == "k2"
    blank = read_variables(environ={"SWITCHBOARD_HERMES_API_KEY": "", "API_SERVER_KEY": "k2",
                                    "DISCORD_BOT_TOKEN": " ", "SWITCHBOARD_DISCORD_TOKEN": "old"},
                           env_file=os.devnull)
    settings = Settings.from_env(blank)
    assert settings.hermes_api_key is None and settings.discord_token is None


def test_the_environment_wins_per_variable_and_a_scoped_key_in_dotenv_beats_a_shared_one_outside(tmp_path):
    env_file = tmp_path / "switchboard.env"
    env_file.write_text("SWITCHBOARD_OPENAI_API_KEY=scoped-from-file\nSWITCHBOARD_VOICE=cedar\n"
                        "SWITCHBOARD_ENDPOINTING=local\n")
    variables = read_variables(env_file, environ={"OPENAI_API_KEY": "shared", "SWITCHBOARD_VOICE": "ash"})
    settings = Settings.from_env(variables)
    assert settings.openai_api_key.get_secret_value() == "scoped-from-file"
    assert (settings.voice, settings.endpointing) == ("ash", "local")


def test_an_env_file_given_explicitly_must_exist_but_the_default_may_be_absent(tmp_path, monkeypatch):
    with pytest.raises(EnvFileError, match="no such file"):
        read_variables(tmp_path / "missing.env", environ={})
    with pytest.raises(EnvFileError, match="is a directory"):
        read_variables(tmp_path, environ={})
    monkeypatch.chdir(tmp_path)
    assert read_variables(None, environ={"A": "1"}) == {"A": "1"}
    (tmp_path / ".env").write_text("SWITCHBOARD_VOICE=cedar\n")
    assert read_variables(None, environ={})["SWITCHBOARD_VOICE"] == "cedar"


def test_unknown_switchboard_variables_are_named_with_a_suggestion():
    report = check_settings({"SWITCHBOARD_ENDPOINTNG": "local", "UNRELATED": "x"})
    assert report.problems == () and report.ignored == (
        "SWITCHBOARD_ENDPOINTNG is not a Switchboard setting and is ignored; did you mean SWITCHBOARD_ENDPOINTING?",)


@pytest.mark.parametrize("value", ["true", "1", "yes", "on", "TRUE", " On "])
def test_every_spelling_the_flag_message_names_is_accepted(value):
    assert Settings.from_env({"SWITCHBOARD_CAPTIONS": value}).captions is True
    assert Settings.from_env({"SWITCHBOARD_CAPTIONS": {"true": "false", "1": "0", "yes": "no"}.get(
        value, "off")}).captions is False


def test_the_timing_limits_accept_their_bounds_and_the_defaults():
    settings = Settings.from_env({"SWITCHBOARD_FOLLOWUP_S": "300", "SWITCHBOARD_SESSION_ROLLOVER_S": "3540",
                                  "SWITCHBOARD_CALL_MAX_MINUTES": "0.05", "SWITCHBOARD_DEAF_SECONDS": "1"})
    assert (settings.followup_s, settings.session_rollover_s, settings.call_max_minutes, settings.deaf_after_s) == (
        300.0, 3540.0, 0.05, 1.0)
    defaults = Settings.from_env({})
    assert (defaults.followup_s, defaults.session_rollover_s, defaults.deaf_after_s) == (15.0, 3300.0, 5.0)


def test_a_setting_name_in_the_wrong_case_stops_every_command_naming_the_right_one():
    report = check_settings({"switchboard_guild_ids": "123456789012345678", "Switchboard_Captions": "true",
                             "switchboard_captoins": "true", "openai_api_key": "sk-NEVER-SHOWN-1234"})
    assert report.problems == (
        "Switchboard_Captions is not read (value not shown): setting names are upper case; rename it "
        "SWITCHBOARD_CAPTIONS",
        "openai_api_key is not read (value not shown): setting names are upper case; rename it OPENAI_API_KEY",
        "switchboard_guild_ids is not read (value not shown): setting names are upper case; rename it "
        "SWITCHBOARD_GUILD_IDS")
    assert report.failed == {"SWITCHBOARD_CAPTIONS", "OPENAI_API_KEY", "SWITCHBOARD_GUILD_IDS"}
    assert report.ignored == ("switchboard_captoins is not a Switchboard setting and is ignored; did you mean "
                              "SWITCHBOARD_CAPTIONS?",)
    assert report.settings.guild_ids == frozenset()  # never read: the command stops rather than serve every guild


def test_every_setting_is_documented_and_the_example_values_parse(tmp_path):
    from bot.settings import ALL_VARIABLES

    root = ROOT
    example = (root / ".env.example").read_text()
    docs = (root / "docs" / "configuration.md").read_text()
    assert {name for name in ALL_VARIABLES if name not in example} == set()
    assert {name for name in ALL_VARIABLES if f"`{name}`" not in docs} == set()
    uncommented = tmp_path / "example.env"  # every example line switched on, as a user would
    uncommented.write_text("\n".join(line[2:] for line in example.splitlines() if line.startswith("# ") and "=" in line
                                     and line[2:].split("=")[0] in ALL_VARIABLES))
    report = check_settings(read_variables(uncommented, environ={}))
    assert report.problems == () and report.ignored == ()


def test_the_database_url_is_a_secret_postgresql_url_and_blank_keeps_sqlite():
    from bot.services import database_url, process_secrets

    url = "postgresql://switchboard:pa%24%24word@db.internal:5432/sb?sslmode=require&application_name=x"
    settings = check_settings({"SWITCHBOARD_DATABASE_URL": url}).settings
    assert database_url(settings) == url and "pa%24%24word" not in repr(settings)  # passed through whole
    assert "pa$$word" in process_secrets(settings)  # scrubbed from whatever a run reports
    assert database_url(check_settings({"SWITCHBOARD_DATABASE_URL": "postgres://h/db"}).settings) == "postgres://h/db"
    assert database_url(check_settings({"SWITCHBOARD_DATABASE_URL": "  "}).settings) is None
    assert database_url(check_settings({}).settings) is None
    report = check_settings({"SWITCHBOARD_DATABASE_URL": "mysql://root:hunter2@db/sb"})
    (problem,) = report.problems
    assert problem.startswith("SWITCHBOARD_DATABASE_URL (value not shown): must be a postgresql:// or postgres://")
    assert "hunter2" not in problem and "mysql" in problem
