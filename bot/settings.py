"""One typed settings model (pydantic-settings) that every command validates the same way.

Values come from `bot.environment.read_variables`: the process environment over the dotenv file,
merged per variable and stripped, a blank value counting as unset (see that module for the two
exceptions). `check_settings` validates them once and returns every problem, each naming the
variable and quoting the value (secrets: never the value); the CLI stops every command on any
problem and `doctor` prints the same lines. Secrets are `SecretStr`, which never prints itself.

Fail-closed, and the one setting that warns rather than stops: SWITCHBOARD_OPERATOR_USER_IDS unset,
blank or with any malformed entry authorises nobody; a malformed value is a notice (doctor reports
it and fails; commands that do not use it go on).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot import setting_rules as rules
from common.urls import check_key_endpoint, display_url
from runs.agent_command import AgentEnvError, check_agent_env, parse_agent_env
from voice.call.providers import (
    DEFAULT_MODEL,
    DEFAULT_VOICE,
    PROVIDERS,
    ProviderConfigError,
    check_model,
    check_voice,
)
from voice.call.providers.endpoint import check_realtime_url

ENDPOINTING_MODES = ("server", "local")
REPLY_MODES = ("everyone", "addressed")
IDENTITY_SECTIONS = ("persona", "memory")
AGENT_LANES = ("hermes-api", "command")
DEFAULT_AGENT_COMMAND = "hermes -z {task}"
OPERATORS = "SWITCHBOARD_OPERATOR_USER_IDS"

# Every variable a secret may come from: their values are never shown, in any message.
SECRET_VARIABLES = frozenset({
    "DISCORD_BOT_TOKEN", "SWITCHBOARD_DISCORD_TOKEN", "SWITCHBOARD_OPENAI_API_KEY", "OPENAI_API_KEY",
    "XAI_API_KEY", "SWITCHBOARD_HERMES_API_KEY", "API_SERVER_KEY", "TRANSCRIPT_LISTENER_API_KEY",
    "SWITCHBOARD_TEXT_API_KEY", "SWITCHBOARD_DATABASE_URL",
})
DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")
URL_VARIABLES = frozenset({"SWITCHBOARD_REALTIME_URL", "SWITCHBOARD_HERMES_API_URL", "SMARTNUMBERS_STREAM_URL",
                           "SWITCHBOARD_TEXT_URL"})
SMARTNUMBERS_HOST = "connections.smartnumbers.labs.bandwidth.com"
SMARTNUMBERS_STREAM_URL = f"wss://{SMARTNUMBERS_HOST}/ws/hermes"
KEY_VARIABLES = {"openai": ("SWITCHBOARD_OPENAI_API_KEY", "OPENAI_API_KEY"), "xai": ("XAI_API_KEY",)}
# Sanity limits of the call's timing settings: (lowest, highest, why), in seconds (the call limit in minutes).
TIMING_LIMITS = {
    "deaf_after_s": (1.0, 60.0, ""),
    "followup_s": (1.0, 300.0, ""),
    "session_rollover_s": (60.0, 3540.0, "; OpenAI ends a session at 60 minutes, so it must roll over before that"),
}
CALL_MINUTES_LIMITS = (0.05, 1440.0, " (3 s to 24 hours; unset = no limit)")


class SettingsError(ValueError):
    """Settings are unusable. `problems` holds one line per problem, each naming its variable."""

    def __init__(self, problems: tuple[str, ...] | list[str] | str) -> None:
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("\n".join(self.problems))


class Settings(BaseSettings):
    """Everything Switchboard reads from its environment, validated. Build it with `check_settings`
    or `Settings.from_env`; the field names are the code's, the aliases the variables'."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True, validate_default=True)

    # -- the call ---------------------------------------------------------------------------------
    home: Path = Field(Path("~/.switchboard"), validation_alias="SWITCHBOARD_HOME")
    # The store in PostgreSQL instead of SQLite in `home` (it may carry a password: never shown).
    database_url: SecretStr | None = Field(None, validation_alias="SWITCHBOARD_DATABASE_URL")
    provider: str = Field("openai", validation_alias="SWITCHBOARD_PROVIDER")
    realtime_url: str | None = Field(None, validation_alias="SWITCHBOARD_REALTIME_URL")
    model: str = Field("", validation_alias="SWITCHBOARD_MODEL")
    voice: str = Field("", validation_alias="SWITCHBOARD_VOICE")
    endpointing: str = Field("server", validation_alias="SWITCHBOARD_ENDPOINTING")
    identity_include: tuple[str, ...] = Field(IDENTITY_SECTIONS, validation_alias="SWITCHBOARD_IDENTITY_INCLUDE")
    latency_log: Path | None = Field(None, validation_alias="SWITCHBOARD_LATENCY_LOG")
    session_rollover_s: float = Field(3300.0, validation_alias="SWITCHBOARD_SESSION_ROLLOVER_S")
    openai_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices(*KEY_VARIABLES["openai"]))
    xai_api_key: SecretStr | None = Field(None, validation_alias="XAI_API_KEY")

    # -- Discord ----------------------------------------------------------------------------------
    discord_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("DISCORD_BOT_TOKEN", "SWITCHBOARD_DISCORD_TOKEN"))
    operator_user_ids: frozenset[int] = Field(frozenset(), validation_alias=OPERATORS)
    guild_ids: frozenset[int] = Field(frozenset(), validation_alias="SWITCHBOARD_GUILD_IDS")
    runs_channel_id: int | None = Field(None, validation_alias="SWITCHBOARD_RUNS_CHANNEL_ID")
    idle_leave_s: float = Field(120.0, validation_alias="SWITCHBOARD_IDLE_LEAVE_S")
    deaf_after_s: float = Field(5.0, validation_alias="SWITCHBOARD_DEAF_SECONDS")
    reply_to: str = Field("everyone", validation_alias="SWITCHBOARD_REPLY_TO")
    followup_s: float = Field(15.0, validation_alias="SWITCHBOARD_FOLLOWUP_S")
    min_interruption_ms: int = Field(400, validation_alias="SWITCHBOARD_MIN_INTERRUPTION_MS")
    captions: bool = Field(False, validation_alias="SWITCHBOARD_CAPTIONS")
    call_max_minutes: float | None = Field(None, validation_alias="SWITCHBOARD_CALL_MAX_MINUTES")

    # -- background runs ---------------------------------------------------------------------------
    agent_lanes: tuple[str, ...] = Field(AGENT_LANES, validation_alias="SWITCHBOARD_AGENT_LANES")
    hermes_api_url: str = Field("http://127.0.0.1:8642", validation_alias="SWITCHBOARD_HERMES_API_URL")
    hermes_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("SWITCHBOARD_HERMES_API_KEY", "API_SERVER_KEY"))
    agent_command: tuple[str, ...] = Field(DEFAULT_AGENT_COMMAND, validation_alias="SWITCHBOARD_AGENT_COMMAND")
    agent_profile: str | None = Field(None, validation_alias="SWITCHBOARD_AGENT_PROFILE")
    agent_timeout_s: float = Field(1800.0, validation_alias="SWITCHBOARD_AGENT_TIMEOUT_S")
    agent_env: tuple[str, ...] = Field((), validation_alias="SWITCHBOARD_AGENT_ENV")
    hermes_max_concurrent_runs: int = Field(10, validation_alias="HERMES_MAX_CONCURRENT_RUNS")

    # -- the Smartnumbers listener ------------------------------------------------------------------
    listener_key: SecretStr | None = Field(None, validation_alias="TRANSCRIPT_LISTENER_API_KEY")
    stream_hosts: frozenset[str] = Field(frozenset({SMARTNUMBERS_HOST}), validation_alias="SMARTNUMBERS_ALLOWED_STREAM_HOSTS")
    transcript_hosts: frozenset[str] = Field(frozenset(), validation_alias="SMARTNUMBERS_ALLOWED_TRANSCRIPT_HOSTS")
    allow_insecure_local: bool = Field(False, validation_alias="SMARTNUMBERS_ALLOW_INSECURE_LOCAL")
    # after the two it is checked against (a validator sees only the fields above it)
    stream_url: str = Field(SMARTNUMBERS_STREAM_URL, validation_alias="SMARTNUMBERS_STREAM_URL")
    max_message_bytes: int = Field(1 << 20, validation_alias="SMARTNUMBERS_MAX_MESSAGE_BYTES")
    max_transcript_bytes: int = Field(20 << 20, validation_alias="SMARTNUMBERS_MAX_TRANSCRIPT_BYTES")
    agent_name: str = Field("Ares", validation_alias="SWITCHBOARD_AGENT_NAME")
    activation_names: tuple[str, ...] = Field((), validation_alias="SWITCHBOARD_ACTIVATION_NAMES")
    transcripts_channel_id: int | None = Field(None, validation_alias="SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID")
    auto_review: bool = Field(True, validation_alias="SWITCHBOARD_AUTO_REVIEW")
    text_model: str = Field("gpt-4.1-mini", validation_alias="SWITCHBOARD_TEXT_MODEL")
    text_url: str = Field("https://api.openai.com/v1", validation_alias="SWITCHBOARD_TEXT_URL")
    text_api_key: SecretStr | None = Field(None, validation_alias="SWITCHBOARD_TEXT_API_KEY")

    # -- health and metrics (bot.fleet) -----------------------------------------------------------------
    http_addr: tuple[str, int] | None = Field(None, validation_alias="SWITCHBOARD_HTTP_ADDR")

    # -- where the values came from (names only) ---------------------------------------------------
    present: tuple[str, ...] = ()

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        # The variables arrive already merged (environment over .env, per variable): pydantic-settings'
        # own sources would pick a fallback name per source, so a shared key in the environment would
        # beat the scoped one in .env.
        return (init_settings,)

    @classmethod
    def from_env(cls, variables: Mapping[str, str]) -> Settings:
        """Validate `variables` (see `bot.environment`); raise SettingsError listing every problem."""
        report = check_settings(variables)
        if report.problems:
            raise SettingsError(report.problems)
        return report.settings

    def agent_argv(self, task: str) -> list[str]:
        """SWITCHBOARD_AGENT_COMMAND for `task`: argv with `{task}` replaced, never through a shell."""
        return [part.replace("{task}", task) for part in self.agent_command]

    # -- validators: each raises ValueError with what to do; check_settings adds the variable ------

    @field_validator("home", mode="before")
    @classmethod
    def _home(cls, value: Any) -> Path:
        return Path(value).expanduser()

    @field_validator("database_url", mode="before")
    @classmethod
    def _database_url(cls, value: Any) -> SecretStr | None:
        text = (value.get_secret_value() if isinstance(value, SecretStr) else str(value)).strip() \
            if value is not None else ""
        if not text:
            return None
        if not text.startswith(DATABASE_URL_SCHEMES):
            scheme = text.split("://", 1)[0][:20] if "://" in text else "none"
            raise ValueError(f"must be a postgresql:// or postgres:// URL (its scheme is {scheme}); unset it to keep "
                             "the store in SWITCHBOARD_HOME")
        if problem := rules.malformed_url(text):  # said here, not by the driver, whose message quotes the URL
            raise ValueError(f"is not a well-formed URL ({problem}): use postgresql://USER:PASSWORD@HOST:PORT/DBNAME, "
                             "with any @ : / in the password percent-encoded")
        return SecretStr(text)

    @field_validator("latency_log", mode="before")
    @classmethod
    def _latency_log(cls, value: Any) -> Path | None:
        return None if value is None else Path(value).expanduser()

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> str:
        return rules.one_of(value, tuple(PROVIDERS), "a provider")

    @field_validator("endpointing", mode="before")
    @classmethod
    def _endpointing(cls, value: Any) -> str:
        return rules.one_of(value, ENDPOINTING_MODES, "an endpointing mode")

    @field_validator("realtime_url", mode="before")
    @classmethod
    def _realtime_url(cls, value: Any) -> str | None:
        return None if value is None else rules.endpoint(check_realtime_url, value)

    @field_validator("hermes_api_url", mode="before")
    @classmethod
    def _hermes_api_url(cls, value: Any) -> str:
        return rules.endpoint(lambda url: check_key_endpoint(url, tls="https"), value).rstrip("/")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any, info: ValidationInfo) -> str:
        provider = info.data.get("provider")
        if provider is None:
            return str(value)  # the provider is already a problem; nothing to check against
        model = str(value) or DEFAULT_MODEL[provider]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]*", model):
            raise ValueError("is not a model name (letters, digits and . _ : - only)")
        _provider_accepts(check_model, provider, model)
        return model

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value: Any, info: ValidationInfo) -> str:
        provider = info.data.get("provider")
        if provider is None:
            return str(value)
        spelled = {v.lower(): v for v in PROVIDERS[provider].voices}
        voice = spelled.get(str(value).lower(), str(value)) or DEFAULT_VOICE[provider]
        _provider_accepts(check_voice, provider, voice)
        return voice

    @field_validator("identity_include", mode="before")
    @classmethod
    def _identity_include(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str) and value.strip().lower() == "none":
            return ()
        sections = rules.choices(value, IDENTITY_SECTIONS, "section", also="or none")
        if not sections:  # "," names nothing: say so rather than silently meaning "none"
            raise ValueError(f"names no section; use {','.join(IDENTITY_SECTIONS)}, one of them, or none")
        return sections

    @field_validator("agent_lanes", mode="before")
    @classmethod
    def _agent_lanes(cls, value: Any) -> tuple[str, ...]:
        lanes = rules.choices(value, AGENT_LANES, "lane")
        if not lanes:
            raise ValueError(f"names no lane; use {','.join(AGENT_LANES)} or one of them")
        return lanes

    @field_validator("agent_env", mode="before")
    @classmethod
    def _agent_env(cls, value: Any) -> tuple[str, ...]:
        try:
            return parse_agent_env(value) if isinstance(value, str) else check_agent_env(tuple(value))
        except AgentEnvError as exc:
            raise ValueError(str(exc).removeprefix("SWITCHBOARD_AGENT_ENV: ")) from None

    @field_validator("reply_to", mode="before")
    @classmethod
    def _reply_to(cls, value: Any) -> str:
        return rules.one_of(value, REPLY_MODES, "a reply mode")

    @field_validator("min_interruption_ms", mode="before")
    @classmethod
    def _min_interruption(cls, value: Any) -> int:
        return rules.whole_number(value, 0, 5000, "milliseconds", "400; 0 = any speech interrupts at once")

    @field_validator("hermes_max_concurrent_runs", mode="before")
    @classmethod
    def _hermes_max_runs(cls, value: Any) -> int:
        return rules.whole_number(value, 1, 10000, "runs", "10, Hermes's own max_concurrent_runs")

    @field_validator("idle_leave_s", "agent_timeout_s", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> float:
        return rules.positive_seconds(value)

    @field_validator("http_addr", mode="before")
    @classmethod
    def _http_addr(cls, value: Any) -> tuple[str, int] | None:
        return value if value is None or isinstance(value, tuple) else rules.bind_address(value)

    @field_validator("deaf_after_s", "followup_s", "session_rollover_s", mode="before")
    @classmethod
    def _timing(cls, value: Any, info: ValidationInfo) -> float:
        low, high, why = TIMING_LIMITS[info.field_name]  # type: ignore[index]
        return rules.seconds_between(value, low, high, why)

    @field_validator("call_max_minutes", mode="before")
    @classmethod
    def _minutes(cls, value: Any) -> float | None:
        if value is None:
            return None
        minutes = rules.positive_minutes(value)
        low, high, why = CALL_MINUTES_LIMITS
        return rules.minutes_between(minutes, low, high, why)

    @field_validator("operator_user_ids", mode="before")
    @classmethod
    def _operators(cls, value: Any) -> frozenset[int]:
        return value if isinstance(value, frozenset) else parse_operator_ids(value)[0]  # fail-closed

    @field_validator("guild_ids", mode="before")
    @classmethod
    def _guild_ids(cls, value: Any) -> frozenset[int]:
        return value if isinstance(value, frozenset) else rules.snowflakes(value)

    @field_validator("text_url", mode="before")
    @classmethod
    def _text_url(cls, value: Any) -> str:
        return rules.endpoint(lambda url: check_key_endpoint(url, tls="https"), value).rstrip("/")

    @field_validator("text_model", mode="before")
    @classmethod
    def _text_model(cls, value: Any) -> str:
        model = str(value).strip()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}", model):
            raise ValueError("is not a model name (letters, digits and . _ : / - only), e.g. gpt-4.1-mini")
        return model

    @field_validator("runs_channel_id", "transcripts_channel_id", mode="before")
    @classmethod
    def _runs_channel(cls, value: Any) -> int | None:
        return None if value is None else rules.snowflake(value)

    @field_validator("agent_command", mode="before")
    @classmethod
    def _agent_command(cls, value: Any) -> tuple[str, ...]:
        return value if isinstance(value, tuple) else rules.command_template(value, "{task}")

    @field_validator("stream_hosts", "transcript_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> frozenset[str]:
        if isinstance(value, frozenset):
            return value
        hosts = [h.strip().lower().rstrip(".") for h in str(value).split(",") if h.strip()]
        bad = [h for h in hosts if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", h)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a host name; list exact host names, comma-separated (no scheme, "
                             "port or wildcard)")
        return frozenset(hosts)

    @field_validator("allow_insecure_local", "auto_review", "captions", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError("is not true or false; use true, false, yes, no, on, off, 1 or 0")

    @field_validator("stream_url", mode="before")
    @classmethod
    def _stream_url(cls, value: Any, info: ValidationInfo) -> str:
        """The URL the listener key is sent to: checked here, so a bad one stops every command."""
        from listener.stream import StreamConfigError, check_stream_url

        hosts, insecure = info.data.get("stream_hosts"), info.data.get("allow_insecure_local")
        if hosts is None or insecure is None:
            return str(value)  # what it is checked against is already a problem
        try:
            check_stream_url(str(value), allowed_hosts=hosts, allow_insecure_local=insecure)
        except StreamConfigError as exc:
            raise ValueError(str(exc)) from None
        return str(value)

    @field_validator("max_message_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> int:
        return rules.whole_number(value, 1024, 64 << 20, "bytes", "1048576 (1 MiB)")

    @field_validator("max_transcript_bytes", mode="before")
    @classmethod
    def _transcript_bytes(cls, value: Any) -> int:
        return rules.whole_number(value, 1024, 1 << 30, "bytes", "20971520 (20 MiB)")

    @field_validator("agent_name", mode="before")
    @classmethod
    def _agent_name(cls, value: Any) -> str:
        name = " ".join(str(value).split())
        if not re.fullmatch(r"[\w][\w .'-]{0,39}", name):
            raise ValueError("must be a name of up to 40 letters, digits, spaces, . ' or -")
        return name

    @field_validator("activation_names", mode="before")
    @classmethod
    def _activation_names(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        names = tuple(dict.fromkeys(" ".join(n.split()) for n in str(value).split(",") if n.strip()))
        for name in names:
            if not re.fullmatch(r"[\w][\w .'-]{0,39}", name):
                raise ValueError(f"{name!r} is not a name; comma-separated names of letters, digits, spaces")
        return names

    @field_validator("openai_api_key", "xai_api_key", "discord_token", "hermes_api_key", "listener_key",
                     "text_api_key", mode="before")
    @classmethod
    def _secret(cls, value: Any, info: ValidationInfo) -> SecretStr | None:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text is None:
            return None
        rules.check_token(text)
        if not text and info.field_name != "openai_api_key":
            return None  # a blank first name means none; realtime_api_key explains a blank OpenAI key
        return SecretStr(text)


@dataclass(frozen=True)
class SettingsReport:
    """The outcome of validating once.

    `problems` stop every command; `notices` (a malformed fail-closed setting) and `ignored`
    (unknown SWITCHBOARD_* names) do not. `failed` names the variables with a problem; in
    `settings` each of them is replaced by its default, so the object is still usable for display.
    """

    settings: Settings
    problems: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    failed: frozenset[str] = frozenset()


def check_settings(variables: Mapping[str, str]) -> SettingsReport:
    """Validate `variables` with the one model; collect every problem and notice."""
    known = {name: value for name, value in variables.items() if name in ALL_VARIABLES}
    present = tuple(sorted(known))
    problems: list[str] = []
    failed: set[str] = set()
    for _ in range(len(known) + 1):
        try:
            settings = Settings(**known, present=present)
            break
        except ValidationError as exc:
            names = {str(err["loc"][0]) if err["loc"] else "" for err in exc.errors()}
            if not problems:  # later passes only see what the defaults standing in for bad values cause
                problems, failed = [_describe(err) for err in exc.errors()], names
            known = {name: value for name, value in known.items() if name not in names}
    else:  # pragma: no cover - every pass drops at least one variable
        settings = Settings(present=present)
    _, operators = parse_operator_ids(variables.get(OPERATORS))
    miscased = _miscased(variables)
    problems += miscased.values()
    return SettingsReport(settings, tuple(problems), (operators,) if operators else (),
                          _unknown(variables), frozenset(failed) | set(miscased))


def parse_operator_ids(raw: str | None) -> tuple[frozenset[int], str | None]:
    """Immutable Discord user IDs, comma separated. Unset, blank or any malformed entry -> nobody."""
    if raw is None or not raw.strip():
        return frozenset(), None
    try:
        return rules.snowflakes(raw), None
    except ValueError as exc:
        return frozenset(), (f"{OPERATORS}={raw!r}: {exc}, so nobody may run mutating tools; set it to "
                             "comma-separated numeric Discord user IDs")


def key_variable(settings: Settings) -> str | None:
    """Which variable the provider key comes from (the first one set), or None."""
    return next((name for name in KEY_VARIABLES[settings.provider] if name in settings.present), None)


def realtime_api_key(settings: Settings) -> SecretStr:
    """The provider key, resolved fail-closed. Raises SettingsError naming the variable to set.

    OpenAI: SWITCHBOARD_OPENAI_API_KEY, then OPENAI_API_KEY; a set-but-blank first variable refuses
    rather than falling through to the shared key. xAI: XAI_API_KEY.
    """
    names = KEY_VARIABLES[settings.provider]
    name = key_variable(settings)
    key = settings.openai_api_key if settings.provider == "openai" else settings.xai_api_key
    if name is None or key is None:
        other = next((n for p, ns in KEY_VARIABLES.items() if p != settings.provider for n in ns
                      if n in settings.present), None)
        hint = f"; {other} is set — did you mean SWITCHBOARD_PROVIDER={_provider_of(other)}?" if other else ""
        raise SettingsError(f"no API key for provider {settings.provider!r}: set {' or '.join(names)} "
                            f"(in the environment or .env){hint}")
    if not key.get_secret_value():
        raise SettingsError(f"{name} is set but blank; put your key there, or unset it"
                            + (" to use OPENAI_API_KEY" if name == "SWITCHBOARD_OPENAI_API_KEY" else ""))
    return key


def text_model_key(settings: Settings) -> tuple[str | None, str]:
    """The durable-fact model's key and where it comes from: SWITCHBOARD_TEXT_API_KEY, else the OpenAI
    key (SWITCHBOARD_OPENAI_API_KEY, OPENAI_API_KEY). (None, what to set) when there is none."""
    if "SWITCHBOARD_TEXT_API_KEY" in settings.present:
        key = settings.text_api_key.get_secret_value() if settings.text_api_key is not None else ""
        return (key or None), "SWITCHBOARD_TEXT_API_KEY"
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key is not None else ""
    name = next((n for n in KEY_VARIABLES["openai"] if n in settings.present), None)
    if key and name:
        return key, name
    return None, "SWITCHBOARD_TEXT_API_KEY (or OPENAI_API_KEY)"


# -- helpers -----------------------------------------------------------------------------------------

ALL_VARIABLES = frozenset(
    name
    for field in Settings.model_fields.values()
    for name in (field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices)
                 else [field.validation_alias] if field.validation_alias else [])
)


def _provider_accepts(check, provider: str, value: str) -> None:
    try:
        check(provider, value)
    except ProviderConfigError as exc:
        raise ValueError(str(exc)) from None


def _provider_of(variable: str) -> str:
    return next(p for p, names in KEY_VARIABLES.items() if variable in names)


def _describe(err: Any) -> str:
    """One line: the variable, its value (never a secret's; a URL without userinfo or query), why."""
    name = str(err["loc"][0]) if err["loc"] else "settings"
    reason = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if name in SECRET_VARIABLES:
        return f"{name} (value not shown): {reason}"
    if not isinstance(value, str):
        return f"{name}: {reason}"
    shown = display_url(value) if name in URL_VARIABLES else rules.clip(value)
    return f"{name}={shown!r}: {reason}"


# Read by one command, not settings: `switchboard callbacks` takes a named-command run's token from here.
RUNTIME_VARIABLES = frozenset({"SWITCHBOARD_CALLBACK_TOKEN"})


def _miscased(variables: Mapping[str, str]) -> dict[str, str]:
    """A setting's name in the wrong case (`switchboard_guild_ids`) is never read. It stops every command
    rather than warning: the value was meant to take effect, and some narrow who or what is served
    (guilds, hosts), so running on the default would be the opposite of what was asked. Keyed by the
    setting's real name; the value is not shown (it may be a secret)."""
    return {name.upper(): f"{name} is not read (value not shown): setting names are upper case; rename it "
                          f"{name.upper()}"
            for name in sorted(variables) if name != name.upper() and name.upper() in ALL_VARIABLES}


def _unknown(variables: Mapping[str, str]) -> tuple[str, ...]:
    lines = []
    for name in sorted(variables):
        upper = name.upper()
        if upper.startswith("SWITCHBOARD_") and upper not in ALL_VARIABLES and upper not in RUNTIME_VARIABLES:
            close = difflib.get_close_matches(upper, sorted(ALL_VARIABLES), n=1)
            lines.append(f"{name} is not a Switchboard setting and is ignored"
                         + (f"; did you mean {close[0]}?" if close else "; see .env.example"))
    return tuple(lines)
