"""Keep credentials out of logs, including what libraries log about our connections (every domain uses it).

`redact(text)` rewrites every shape a key takes in a log line: header lines, dict and tuple reprs,
URL queries and userinfo, bearer/basic values, and bare provider keys (`sk-…`, `xai-…`) wherever
they stand — also after an earlier, partial redaction.
"""

from __future__ import annotations

import logging
import re

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


class CredentialRedactor(logging.Filter):
    """Rewrites every record it sees so that no credential survives into a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 2 and isinstance(args[0], str) \
                and args[0].strip().lower() in _SENSITIVE_HEADERS:
            record.args = (args[0], MASK, *args[2:])
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not a leak
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def redacted_logger(name: str) -> logging.Logger:
    """A logger (created once per name) whose records never show credentials."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, CredentialRedactor) for f in logger.filters):
        logger.addFilter(CredentialRedactor())
    return logger
