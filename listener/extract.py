"""The one structured request behind durable facts: an OpenAI-compatible Chat Completions call with
a strict JSON schema (`memory.FACT_SCHEMA`). The answer is a proposal; `memory.validate` decides.

The key only goes over https (plain http to a loopback address, for tests and local models); proxy
variables are ignored so the transcript is never diverted.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from listener.memory import FACT_SCHEMA, extraction_messages
from listener.model import Transcript

DEFAULT_TEXT_URL = "https://api.openai.com/v1"
DEFAULT_TEXT_MODEL = "gpt-4.1-mini"


class ExtractionError(RuntimeError):
    """The model could not be asked or did not answer usably; the message says which (no secrets),
    on one line: what the server wrote into it cannot start a line of its own in a log."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class FactExtractor:
    def __init__(self, *, url: str, key: str, model: str, timeout_s: float = 60.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self._endpoint = url.rstrip("/") + "/chat/completions"
        self._key = key
        self.model = model
        self._client = client or httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                                   follow_redirects=False)

    def request_body(self, transcript: Transcript, user_label: str | None) -> dict[str, Any]:
        return {"model": self.model, "messages": extraction_messages(transcript, user_label),
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "durable_facts", "strict": True, "schema": FACT_SCHEMA}}}

    async def extract(self, transcript: Transcript, user_label: str | None) -> Any:
        """The model's parsed answer (validate it before use)."""
        try:
            response = await self._client.post(self._endpoint, json=self.request_body(transcript, user_label),
                                               headers={"Authorization": f"Bearer {self._key}"})
        except httpx.TimeoutException:
            raise ExtractionError("the text model did not answer in time") from None
        except httpx.HTTPError as exc:
            raise ExtractionError(f"cannot reach the text model ({type(exc).__name__})") from None
        if response.status_code in (401, 403):
            raise ExtractionError(f"the text model refused the key (HTTP {response.status_code}); check "
                                  "SWITCHBOARD_TEXT_API_KEY or OPENAI_API_KEY")
        if response.status_code != 200:
            raise ExtractionError(f"the text model answered HTTP {response.status_code}: {_error_text(response)}")
        try:
            message = response.json()["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            raise ExtractionError("the text model's answer is not a chat completion") from None
        if message.get("refusal"):
            raise ExtractionError(f"the text model refused: {str(message['refusal'])[:200]}")
        content = message.get("content")
        try:
            if not isinstance(content, str):
                raise TypeError
            return json.loads(content)
        except (ValueError, TypeError):
            raise ExtractionError("the text model's answer is not the JSON the schema asks for") from None

    async def aclose(self) -> None:
        await self._client.aclose()


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
