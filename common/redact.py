"""Keep credentials out of logs, including what libraries log about our connections (every domain uses it).

`redact(text)` rewrites every shape a key takes in a log line: header lines, dict and tuple reprs,
URL queries and userinfo, bearer/basic values, and bare provider keys (`sk-…`, `xai-…`) wherever
they stand — also after an earlier, partial redaction. `secret_forms` lists every form a known secret
takes (escaped, percent-encoded, hex, base64): the run scrubber (`runs.capture`) and the connection
logs match them all.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"
_NAMES = (r"proxy-authorization|authorization|x-api-key|api[-_]?key|apikey|access[-_]?token|"
          r"refresh[-_]?token|client[-_]?secret|secret|password|passwd|token|key|cookie|set-cookie")
# name, then its value: `Name: v`, `name=v`, `'Name': 'v'`, `('Name', 'v')`, `"name":"v"`
_NAMED = re.compile(
    rf"(?i)(?<![A-Za-z0-9-])([\"']?)({_NAMES})\1(\s*[:=]\s*|\s*,\s*)([\"']?)"
    rf"((?:bearer|basic|token)\s+)?([^\s\"',&;)\]}}]+)"
)
_SCHEME_VALUE = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{4,})")
_BARE_KEY = re.compile(r"\b(?:sk|xai|sess|rk|pk)-[A-Za-z0-9_-]{8,}")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")
_SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
                                "set-cookie"})


def redact(text: str) -> str:
    """`text` with every credential replaced by ***."""
    text = _URL_USERINFO.sub(rf"\1{MASK}@", text)
    text = _NAMED.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{m[5] or ''}{MASK}", text)
    text = _SCHEME_VALUE.sub(rf"\1 {MASK}", text)
    return _BARE_KEY.sub(MASK, text)


def redacted_message(msg: object, args: object, secrets: Iterable[str] = ()) -> str:
    """A log call's message, formatted, with every credential replaced: a `(header name, value)` pair
    of a sensitive header (as websockets logs them) loses its whole value, every form of each of
    `secrets` goes (`scrub_secrets`), and the rest goes through `redact`."""
    if isinstance(args, tuple) and len(args) >= 2 and isinstance(args[0], str) \
            and args[0].strip().lower() in _SENSITIVE_HEADERS:
        args = (args[0], MASK, *args[2:])
    try:
        text = str(msg) % args if args else str(msg)
    except Exception:  # a malformed call is shown as its parts, still redacted
        text = " ".join(map(str, (msg, *(args if isinstance(args, tuple) else (args,)))))
    return redact(scrub_secrets(text, secrets))


class CredentialRedactor(logging.Filter):
    """Rewrites every record it sees so that no credential survives into a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not a leak
            return True
        cleaned = redacted_message(record.msg, record.args)
        if cleaned != record.getMessage():
            record.msg, record.args = cleaned, ()
        return True


ENCODED_FORM_MIN = 8  # an encoded form shorter than this is too likely to be ordinary text
_URL_SAFE = str.maketrans("+/", "-_")


def encoded_forms(secret: str) -> set[str]:
    """`secret` as the simple encodings write it, at least ENCODED_FORM_MIN characters each: hex (lower
    and upper case), every byte percent-encoded, and base64 (standard and URL-safe) at each of the three
    byte offsets it can start at inside a longer encoded text (`cat .env | base64`) — there only the
    characters that depend on the secret's bytes alone, so the form is found whatever surrounds it."""
    data = secret.encode("utf-8")
    forms = {data.hex(), data.hex().upper(), "".join(f"%{b:02X}" for b in data), "".join(f"%{b:02x}" for b in data)}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data).decode("ascii")
        stable = encoded[-(-8 * offset // 6):8 * (offset + len(data)) // 6]
        forms |= {stable, stable.translate(_URL_SAFE)}
    return {f for f in forms if len(f) >= ENCODED_FORM_MIN}


def secret_forms(secret: str) -> list[str]:
    """Every way `secret` can show up in text: as sent, inside a URL (percent- or plus-encoded), escaped
    by `repr` or JSON, with its whitespace runs collapsed, and in the simple encodings
    (`encoded_forms`: hex, percent, base64); longest first."""
    forms = {secret, " ".join(secret.split()), quote(secret), quote(secret, safe=""), quote_plus(secret),
             repr(secret)[1:-1], json.dumps(secret)[1:-1], *encoded_forms(secret)}
    return sorted((f for f in forms if f), key=len, reverse=True)


def scrub_secrets(text: str, secrets: Iterable[str], mask: str = MASK) -> str:
    """`text` with every form (`secret_forms`) of every non-blank secret replaced by `mask`."""
    for secret in secrets:
        if secret and secret.strip():
            for form in secret_forms(secret):
                text = text.replace(form, mask)
    return text


class ConnectionLog(logging.LoggerAdapter):
    """What a library logs about a connection that carries a key: every line goes through `redact` and
    has every form of the connection's own secrets replaced, whatever the server echoed back."""

    def __init__(self, logger: logging.Logger, secrets: Callable[[], Iterable[str]]) -> None:
        super().__init__(logger, {})
        self._secrets = secrets

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        kwargs.setdefault("stacklevel", 2)
        self.logger.log(level, "%s", redacted_message(msg, args, self._secrets()), **kwargs)


def connection_logger(name: str, secrets: Callable[[], Iterable[str]] = tuple) -> ConnectionLog:
    """The logger to give `websockets` for a connection that carries a key (the Realtime provider, the
    Smartnumbers stream): its upgrade-header dump and everything else it logs, redacted, with the
    connection's own `secrets` removed in any encoding."""
    return ConnectionLog(logging.getLogger(name), secrets)
