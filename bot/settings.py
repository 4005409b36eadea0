"""One typed settings object, parsed once from the environment (python-dotenv loads `.env`).

Security settings parse fail-closed: a set-but-blank or malformed value authorises nobody and is
reported as a problem, never silently widened. Secret values are wrapped in `Secret`, whose str/repr
never shows the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROVIDERS = ("openai", "xai")
ENDPOINTING_MODES = ("server", "local")
IDENTITY_SECTIONS = ("persona", "memory")
DEFAULT_MODEL = {"openai": "gpt-realtime-2.1-mini", "xai": "grok-voice-latest"}
DEFAULT_VOICE = {"openai": "marin", "xai": "Ara"}
_SNOWFLAKE = re.compile(r"^[1-9][0-9]{15,19}$")


class Secret:
    """A secret string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


class SettingsError(ValueError):
    """A setting is present but unusable; the message names the variable and what to do."""


@dataclass(frozen=True)
class Settings:
    home: Path
    provider: str = "openai"
    realtime_url: str | None = None
    model: str = DEFAULT_MODEL["openai"]
    voice: str = DEFAULT_VOICE["openai"]
    endpointing: str = "server"
    identity_include: tuple[str, ...] = IDENTITY_SECTIONS
    latency_log: Path | None = None
    deaf_after_s: float = 5.0
    discord_token: Secret | None = None
    operator_user_ids: frozenset[int] = frozenset()
    problems: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse settings; unusable values are recorded in `problems` and fall back fail-closed."""
        env = dict(os.environ if env is None else env)
        problems: list[str] = []
        home = Path(env.get("SWITCHBOARD_HOME") or "~/.switchboard").expanduser()

        provider = (env.get("SWITCHBOARD_PROVIDER") or "openai").strip().lower()
        if provider not in PROVIDERS:
            problems.append(f"SWITCHBOARD_PROVIDER={provider!r} is not one of {', '.join(PROVIDERS)}")
            provider = "openai"

        endpointing = (env.get("SWITCHBOARD_ENDPOINTING") or "server").strip().lower()
        if endpointing not in ENDPOINTING_MODES:
            problems.append(f"SWITCHBOARD_ENDPOINTING must be 'server' or 'local', not {endpointing!r}")
            endpointing = "server"

        include_raw = env.get("SWITCHBOARD_IDENTITY_INCLUDE")
        if include_raw is None:
            include = IDENTITY_SECTIONS
        else:
            names = tuple(n.strip().lower() for n in include_raw.split(",") if n.strip())
            unknown = [n for n in names if n not in IDENTITY_SECTIONS]
            if unknown:
                problems.append(f"SWITCHBOARD_IDENTITY_INCLUDE has unknown sections {unknown}; "
                                f"use any of {', '.join(IDENTITY_SECTIONS)}")
            include = tuple(n for n in names if n in IDENTITY_SECTIONS)

        deaf = 5.0
        if env.get("SWITCHBOARD_DEAF_SECONDS"):
            try:
                deaf = float(env["SWITCHBOARD_DEAF_SECONDS"])
                if deaf <= 0:
                    raise ValueError
            except ValueError:
                problems.append("SWITCHBOARD_DEAF_SECONDS must be a positive number of seconds")
                deaf = 5.0

        operators, op_problem = parse_operator_ids(env.get("SWITCHBOARD_OPERATOR_USER_IDS"))
        if op_problem:
            problems.append(op_problem)

        token = env.get("SWITCHBOARD_DISCORD_TOKEN")
        latency = env.get("SWITCHBOARD_LATENCY_LOG")
        present = tuple(sorted(k for k in env if k.startswith("SWITCHBOARD_") or k in _SHARED_KEYS))
        return cls(
            home=home,
            provider=provider,
            realtime_url=(env.get("SWITCHBOARD_REALTIME_URL") or None),
            model=(env.get("SWITCHBOARD_MODEL") or DEFAULT_MODEL[provider]).strip(),
            voice=(env.get("SWITCHBOARD_VOICE") or DEFAULT_VOICE[provider]).strip(),
            endpointing=endpointing,
            identity_include=include,
            latency_log=Path(latency).expanduser() if latency else None,
            deaf_after_s=deaf,
            discord_token=Secret(token) if token else None,
            operator_user_ids=operators,
            problems=tuple(problems),
            present=present,
            env=env,
        )


_SHARED_KEYS = ("OPENAI_API_KEY", "XAI_API_KEY")


def parse_operator_ids(raw: str | None) -> tuple[frozenset[int], str | None]:
    """Immutable Discord user IDs, comma separated. Unset, blank or any malformed entry -> nobody."""
    if raw is None:
        return frozenset(), None
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not _SNOWFLAKE.match(p) for p in parts):
        return frozenset(), ("SWITCHBOARD_OPERATOR_USER_IDS is blank or malformed, so nobody may run "
                             "mutating tools; set it to comma-separated numeric Discord user IDs")
    return frozenset(int(p) for p in parts), None


def realtime_api_key(settings: Settings) -> Secret:
    """The provider key, resolved fail-closed. Raises SettingsError naming the variable to set.

    OpenAI: SWITCHBOARD_OPENAI_API_KEY, then OPENAI_API_KEY; a set-but-blank first variable refuses
    rather than falling through to the shared key. xAI: XAI_API_KEY.
    """
    env = settings.env
    names = ("SWITCHBOARD_OPENAI_API_KEY", "OPENAI_API_KEY") if settings.provider == "openai" else ("XAI_API_KEY",)
    for name in names:
        if name in env:
            value = env[name].strip()
            if not value:
                raise SettingsError(f"{name} is set but blank; put your key there, or unset it"
                                    + (" to use OPENAI_API_KEY" if name == "SWITCHBOARD_OPENAI_API_KEY" else ""))
            return Secret(value)
    raise SettingsError(f"no API key for provider {settings.provider!r}: set {' or '.join(names)} "
                        "(in the environment or .env)")
