"""The variables Switchboard reads: the process environment over a dotenv file, merged per variable.

Values are stripped, and a blank value counts as unset — with two exceptions, kept as "" because
there blank means something: SWITCHBOARD_AGENT_PROFILE (blank = run without a profile) and the
first name of a secret that has two (blank = no secret; never fall through to the second name).
The process environment is not changed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path

from dotenv import dotenv_values
from dotenv.parser import parse_stream

DEFAULT_ENV_FILE = Path(".env")
BLANK_MEANS_SOMETHING = frozenset({
    "SWITCHBOARD_AGENT_PROFILE",
    "SWITCHBOARD_OPENAI_API_KEY",  # before OPENAI_API_KEY
    "DISCORD_BOT_TOKEN",  # before SWITCHBOARD_DISCORD_TOKEN
    "SWITCHBOARD_HERMES_API_KEY",  # before API_SERVER_KEY
})


class EnvFileError(ValueError):
    """The dotenv file that was asked for cannot be used; the message names it and what to do."""


def read_variables(env_file: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment over dotenv, stripped, blanks dropped (see the module doc).

    `env_file` None reads `.env` when it exists and skips it silently otherwise; a file that was
    named explicitly must exist (EnvFileError).
    """
    environ = os.environ if environ is None else environ
    from_file = _read_env_file(env_file) if env_file is not None else _read_optional(DEFAULT_ENV_FILE)
    merged = {**from_file, **environ}
    return {name: value.strip() for name, value in merged.items()
            if value.strip() or name in BLANK_MEANS_SOMETHING}


def _read_optional(path: Path) -> dict[str, str]:
    return _read_env_file(path) if path.exists() else {}


def _read_env_file(path: Path) -> dict[str, str]:
    path = Path(path).expanduser()
    if not path.exists():
        raise EnvFileError(f"--env-file {path}: no such file; check the path, or leave --env-file out "
                           "(./.env is read when it exists)")
    if path.is_dir():
        raise EnvFileError(f"env file {path}: is a directory, not a dotenv file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise EnvFileError(f"env file {path}: cannot read it ({reason})") from None
    bad = [binding.original.line for binding in parse_stream(io.StringIO(text)) if binding.error]
    if bad:  # a line dotenv skips could be a security setting the user believes is set
        lines = ", ".join(str(n) for n in bad[:5]) + (" …" if len(bad) > 5 else "")
        raise EnvFileError(f"env file {path}: line {lines} is not NAME=value (an unclosed quote?); fix or "
                           "remove it — a setting there would be silently ignored")
    values = dotenv_values(stream=io.StringIO(text))
    return {name: value for name, value in values.items() if value is not None}
