"""Keep credentials out of logs, including what libraries log about our connections."""

from __future__ import annotations

import logging
import re

_CREDENTIAL = re.compile(r"(?i)\b(authorization|x-api-key|api-key)(\s*[:=]\s*)(bearer\s+)?\S+")
_SENSITIVE_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie", "set-cookie"})


class CredentialRedactor(logging.Filter):
    """Rewrites log records that carry a credential header (e.g. websockets' debug handshake dump)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 2 and isinstance(args[0], str) \
                and args[0].strip().lower() in _SENSITIVE_HEADERS:
            record.args = (args[0], "***", *args[2:])
            return True
        message = record.getMessage()
        if _CREDENTIAL.search(message):
            record.msg, record.args = _CREDENTIAL.sub(r"\1\2***", message), ()
        return True


def redacted_logger(name: str) -> logging.Logger:
    """A logger (created once per name) whose records never show credential headers."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, CredentialRedactor) for f in logger.filters):
        logger.addFilter(CredentialRedactor())
    return logger
