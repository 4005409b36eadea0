"""A logger per call: with one call per guild, every line must say which call it belongs to."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


class CallLogger(logging.LoggerAdapter):
    """Prefixes every message with `[call ID]` and puts `call_id` on the record for handlers."""

    def __init__(self, logger: logging.Logger, call_id: str) -> None:
        super().__init__(logger, {"call_id": call_id})
        self.call_id = call_id

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs.setdefault("extra", {})["call_id"] = self.call_id
        return f"[call {self.call_id}] {msg}", kwargs
