"""One structured request to an OpenAI-compatible text model: Chat Completions with a strict JSON
schema, the answer parsed. Every domain that asks a text model something (durable facts from a
phone call or a Discord call, a call's recap) goes through `TextModel.structured`.

The key only goes over https (plain http to a loopback address, for tests and local models: the
rule of `common.urls.check_key_endpoint`); proxy variables are ignored and redirects refused, so
what is sent is never diverted. Every failure is one `TextModelError`: one line, never the key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from common.tls import verified_tls
from common.urls import UnsafeEndpoint, check_key_endpoint, display_url


class TextModelError(RuntimeError):
    """The model could not be asked or did not answer usably; the message says which and what to do
    (no secrets), on one line: what the server wrote into it cannot start a line of its own in a log."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class TextModel:
    """An OpenAI-compatible Chat Completions endpoint (`url` is its base, e.g.
    `https://api.openai.com/v1`) and the model to ask there. `client` is for tests (a custom TLS
    context, a short timeout); the model closes it in `aclose`, whichever made it."""

    def __init__(self, url: str, key: str, model: str, timeout_s: float = 60.0, *,
                 client: httpx.AsyncClient | None = None) -> None:
        try:
            check_key_endpoint(url, tls="https")
        except UnsafeEndpoint as exc:
            raise TextModelError(f"the text model URL {display_url(url)} is refused: {exc}") from None
        self._endpoint = url.strip().rstrip("/") + "/chat/completions"
        self._key = key
        self.model = model
        self._client = client or httpx.AsyncClient(trust_env=False, verify=verified_tls(),
                                                   timeout=httpx.Timeout(timeout_s, connect=10.0), follow_redirects=False)

    def request_body(self, messages: Sequence[Mapping[str, str]], name: str,
                     schema: Mapping[str, Any]) -> dict[str, Any]:
        return {"model": self.model, "messages": [dict(m) for m in messages],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "strict": True, "schema": dict(schema)}}}

    async def structured(self, messages: Sequence[Mapping[str, str]], name: str, schema: Mapping[str, Any]) -> Any:
        """The model's answer to `messages`, constrained to `schema` (strict mode; `name` names it:
        letters, digits, `_`, `-`), parsed from JSON. It is model output: check it before use."""
        try:
            response = await self._client.post(self._endpoint, json=self.request_body(messages, name, schema),
                                               headers={"Authorization": f"Bearer {self._key}"})
        except httpx.TimeoutException:
            raise TextModelError("the text model did not answer in time") from None
        except httpx.HTTPError as exc:
            raise TextModelError(f"cannot reach the text model ({type(exc).__name__})") from None
        if response.status_code in (401, 403):
            raise TextModelError(f"the text model refused the key (HTTP {response.status_code}); check "
                                 "SWITCHBOARD_TEXT_API_KEY or OPENAI_API_KEY")
        if response.status_code != 200:
            raise TextModelError(f"the text model answered HTTP {response.status_code}: "
                                 f"{self._hide_key(_error_text(response))[:200]}")
        try:
            message = response.json()["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            raise TextModelError("the text model's answer is not a chat completion") from None
        if message.get("refusal"):
            raise TextModelError(f"the text model refused: {self._hide_key(str(message['refusal']))[:200]}")
        content = message.get("content")
        try:
            if not isinstance(content, str):
                raise TypeError
            return json.loads(content)
        except (ValueError, TypeError):
            raise TextModelError("the text model's answer is not the JSON the schema asks for") from None

    async def aclose(self) -> None:
        await self._client.aclose()

    def _hide_key(self, text: str) -> str:
        # A server may echo what it was sent; the key never reaches a message.
        return text.replace(self._key, "[key]") if self._key else text


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text
