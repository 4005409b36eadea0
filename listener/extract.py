"""The one structured request behind durable facts: the whole transcript, numbered, to a text model
(`common.text_model.TextModel`: OpenAI-compatible Chat Completions, strict JSON schema), with the
prompt and schema of who is trusted (`memory.Trust`: a phone call's user, a Discord call's
operators). The answer is a proposal; `memory.validate` decides.

The key only goes over https (plain http to a loopback address, for tests and local models); proxy
variables are ignored so the transcript is never diverted (both `TextModel`'s rules).
"""

from __future__ import annotations

from typing import Any

import httpx

from common.text_model import TextModel, TextModelError
from listener.memory import FACTS_NAME, Trust, as_trust, extraction_messages
from listener.model import Transcript

DEFAULT_TEXT_URL = "https://api.openai.com/v1"
DEFAULT_TEXT_MODEL = "gpt-4.1-mini"


class ExtractionError(TextModelError):
    """The model could not be asked or did not answer usably; the message says which (no secrets),
    on one line: what the server wrote into it cannot start a line of its own in a log."""


async def extract_facts(model: TextModel, transcript: Transcript, who: Trust | str | None) -> Any:
    """Ask `model` for the facts in `transcript`: its parsed answer (validate it before use with the
    same `who`). Raises ExtractionError, one line, never the key."""
    trust = as_trust(who)
    try:
        return await model.structured(extraction_messages(transcript, trust), FACTS_NAME, trust.schema)
    except TextModelError as exc:
        raise ExtractionError(str(exc)) from None


class FactExtractor:
    """The phone calls' fact model: a `TextModel` of its own (closed by `aclose`)."""

    def __init__(self, *, url: str, key: str, model: str, timeout_s: float = 60.0,
                 client: httpx.AsyncClient | None = None) -> None:
        try:
            self.text_model = TextModel(url, key, model, timeout_s, client=client)
        except TextModelError as exc:
            raise ExtractionError(str(exc)) from None
        self.model = model

    def request_body(self, transcript: Transcript, who: Trust | str | None) -> dict[str, Any]:
        trust = as_trust(who)
        return self.text_model.request_body(extraction_messages(transcript, trust), FACTS_NAME, trust.schema)

    async def extract(self, transcript: Transcript, who: Trust | str | None) -> Any:
        """The model's parsed answer (validate it before use)."""
        return await extract_facts(self.text_model, transcript, who)

    async def aclose(self) -> None:
        await self.text_model.aclose()
