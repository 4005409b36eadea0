"""The value rules settings are checked with: pure functions that return the parsed value or raise
ValueError saying what is wrong and what to use (the caller adds the variable and its value)."""

from __future__ import annotations

import ipaddress
import math
import re
import shlex
from collections.abc import Callable
from typing import Any

_SNOWFLAKE = re.compile(r"[1-9][0-9]{16,19}")  # 17–20 digits, no leading zero
_MAX_SNOWFLAKE = 2**64 - 1


def one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    """`value`, lower-cased, if it is one of `allowed`."""
    text = str(value).strip().lower()
    if text not in allowed:
        raise ValueError(f"is not {what}; use {' or '.join(allowed)}")
    return text


def choices(value: Any, allowed: tuple[str, ...], what: str, also: str = "") -> tuple[str, ...]:
    """A comma-separated list drawn from `allowed`, in order, without repeats. Unknown names refuse."""
    if isinstance(value, tuple):
        return value
    names = [n.strip().lower() for n in str(value).split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown {what}{plural} {', '.join(unknown)}; use any of {','.join(allowed)}"
                         + (f" {also}" if also else ""))
    return tuple(dict.fromkeys(names))


def whole_number(value: Any, low: int, high: int, unit: str, example: str) -> int:
    """A whole number of `unit` between `low` and `high` inclusive."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"is not a whole number of {unit}; e.g. {example}") from None
    if not low <= number <= high:
        raise ValueError(f"must be between {low} and {high} {unit}")
    return number


def positive_seconds(value: Any) -> float:
    """A finite number of seconds greater than 0 (`nan`, `inf` and `1e999` refuse)."""
    return _positive(value, "seconds", "5 or 2.5")


def positive_minutes(value: Any) -> float:
    """A finite number of minutes greater than 0 (a limit; the variable unset means none)."""
    return _positive(value, "minutes", "60 or 90 (unset = no limit)", note=" (unset = no limit)")


def _positive(value: Any, unit: str, example: str, note: str = "") -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"is not a number of {unit}; use e.g. {example}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a finite number of {unit} greater than 0{note}")
    return number


def seconds_between(value: Any, low: float, high: float, why: str = "") -> float:
    """A number of seconds from `low` to `high` inclusive (a sanity limit: `1e9` and `0.001` refuse)."""
    return _between(positive_seconds(value), low, high, "seconds", why)


def minutes_between(minutes: float, low: float, high: float, why: str = "") -> float:
    """`positive_minutes`' value, from `low` to `high` inclusive."""
    return _between(minutes, low, high, "minutes", why)


def _between(number: float, low: float, high: float, unit: str, why: str) -> float:
    if not low <= number <= high:
        raise ValueError(f"must be between {low:g} and {high:g} {unit}{why}")
    return number


def snowflake(value: Any) -> int:
    """One Discord ID: 17–20 digits, no leading zero, at most 2**64-1."""
    text = str(value).strip()
    if not _SNOWFLAKE.fullmatch(text) or int(text) > _MAX_SNOWFLAKE:
        raise ValueError("is not a Discord ID (17–20 digits, no leading zero); copy it with Developer "
                         "Mode > Copy ID")
    return int(text)


def snowflakes(value: Any) -> frozenset[int]:
    """Comma-separated Discord IDs. Empty items (a trailing or doubled comma) are skipped; any
    malformed entry, or no ID at all, refuses the whole list."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    bad = [p for p in parts if not _SNOWFLAKE.fullmatch(p) or int(p) > _MAX_SNOWFLAKE]
    if bad:
        shown = ", ".join(repr(clip(p, 24)) for p in bad[:3])
        raise ValueError(f"holds {shown}, not a Discord ID (17–20 digits, no leading zero)")
    if not parts:
        raise ValueError("holds no Discord ID, only commas")
    return frozenset(int(p) for p in parts)


def command_template(value: Any, placeholder: str) -> tuple[str, ...]:
    """A command line split the shell's way (shlex, never run through a shell); must use `placeholder`."""
    try:
        argv = tuple(shlex.split(str(value)))
    except ValueError as exc:
        raise ValueError(f"cannot be split into words ({exc}); check its quotes") from None
    if not argv:
        raise ValueError(f"is empty; use e.g. 'hermes -z {placeholder}'")
    if not any(placeholder in part for part in argv):
        raise ValueError(f"does not contain {placeholder}, where the task text goes; e.g. 'hermes -z {placeholder}'")
    return argv


def endpoint(check: Callable[[str], str], value: Any) -> str:
    """Run an endpoint check from common.urls, as a ValueError."""
    try:
        return check(str(value))
    except ValueError as exc:  # UnsafeEndpoint is a ValueError
        raise ValueError(str(exc)) from None


def check_token(text: str) -> None:
    """A key or token is one word of printable ASCII (a pasted newline or space breaks the header)."""
    if any(not (33 <= ord(c) < 127) for c in text):
        raise ValueError("contains spaces, control or non-ASCII characters; paste the key alone")


_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
ADDRESS_EXAMPLE = "e.g. 127.0.0.1:9464, [::1]:9464 or 0.0.0.0:9464 (unset = off)"


def bind_address(value: Any) -> tuple[str, int]:
    """`host:port` to listen on: an IPv4 address, a bracketed IPv6 address or a host name, and a port
    from 1 to 65535 (0, "any free port", would hide where the endpoints are)."""
    text = str(value).strip()
    if "/" in text:
        raise ValueError(f"is a URL or a path, not host:port; write only the address, {ADDRESS_EXAMPLE}")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        port = rest[1:] if bracket and rest.startswith(":") else ""
    else:
        host, _, port = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"has an IPv6 address without brackets; write it as [address]:port, {ADDRESS_EXAMPLE}")
    host = host.lower()
    if not host or not port:
        raise ValueError(f"is not host:port; use {ADDRESS_EXAMPLE}")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    bracketed = text.startswith("[")
    if (bracketed and not isinstance(literal, ipaddress.IPv6Address)) or (literal is None and not _HOST_NAME.fullmatch(host)):
        raise ValueError(f"does not name a host (an IP address or a host name); use {ADDRESS_EXAMPLE}")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"has no port from 1 to 65535; use {ADDRESS_EXAMPLE}")
    return host, int(port)


def show_address(address: tuple[str, int]) -> str:
    """`host:port` as it is written (IPv6 in brackets)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def malformed_url(text: str) -> str | None:
    """Why a database URL cannot be read (its host, its port, a space, or libpq's own parser), or None.
    The reason never quotes the URL: it may hold a password."""
    from urllib.parse import urlsplit

    if any(c.isspace() for c in text):
        return "it holds a space or a line break"
    try:
        urlsplit(text).port  # noqa: B018 (reading it is the check: a port that is not 0-65535 raises)
    except ValueError:
        return "its host or port cannot be read"
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # pragma: no cover (psycopg is a dependency; without it, connecting says so)
        return None
    try:
        conninfo_to_dict(text)
    except Exception:
        return "PostgreSQL's driver cannot read it"
    return None
