"""The shared text-model client: one strict structured request, its answer parsed; every failure one
line that says what to do and never holds the key; the key only over https or to loopback, never
through a proxy or a redirect. Checked against the strict fake Chat Completions server."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from common.text_model import TextModel, TextModelError
from common.tls import verified_tls
from tests.support.fake_text_model import FakeTextModel

KEY = "sk-text-SECRET-4242"
SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green"]},
                                           "count": {"type": "integer"}},
          "required": ["colour", "count"], "additionalProperties": False}
MESSAGES = [{"role": "system", "content": "Answer with the colour and a count."},
            {"role": "user", "content": "Two green apples."}]


def client(timeout: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, verify=verified_tls(), timeout=httpx.Timeout(timeout))


async def test_one_strict_structured_request_and_its_answer_parsed():
    async with FakeTextModel(key=KEY, model="gpt-test") as fake:
        fake.answer = lambda body: {"colour": "green", "count": 2}
        model = TextModel(fake.url, KEY, "gpt-test", client=client())
        try:
            answer = await model.structured(MESSAGES, "apples", SCHEMA)
        finally:
            await model.aclose()
        fake.assert_clean()
    assert answer == {"colour": "green", "count": 2}
    (body,) = fake.requests
    assert body["messages"] == MESSAGES and body["model"] == "gpt-test"
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "apples", "strict": True, "schema": SCHEMA}}


@pytest.mark.parametrize("script,message", [
    (lambda fake: fake.fail_next(503, "overloaded"), "HTTP 503: overloaded"),
    (lambda fake: fake.fail_next(401, "bad key"), "refused the key"),
    (lambda fake: fake.fail_next(400, f"Incorrect API key provided: {KEY}"), "HTTP 400: Incorrect API key provided"),
    (lambda fake: fake.refuse_next("I can't help with that"), "refused: I can't help with that"),
    (lambda fake: fake.refuse_next(f"I won't echo {KEY}"), "refused: I won't echo [key]"),
    (lambda fake: setattr(fake, "answer", lambda body: "{not json"), "not the JSON"),
    (lambda fake: fake.fail_next(503, "overloaded\nFORGED model: a line of its own"), "HTTP 503: overloaded FORGED"),
])
async def test_a_model_that_fails_is_one_clear_line_without_the_key(script, message):
    async with FakeTextModel(key=KEY, model="gpt-test") as fake:
        script(fake)
        model = TextModel(fake.url, KEY, "gpt-test", client=client())
        try:
            with pytest.raises(TextModelError) as raised:
                await model.structured(MESSAGES, "apples", SCHEMA)
        finally:
            await model.aclose()
    text = str(raised.value)
    assert message in text and "SECRET" not in text and "\n" not in text and "\r" not in text


async def test_a_wrong_key_is_refused_and_the_message_says_which_variable_to_check():
    async with FakeTextModel(key="the-right-key", model="gpt-test") as fake:
        fake.expect_violation()
        model = TextModel(fake.url, KEY, "gpt-test", client=client())
        try:
            with pytest.raises(TextModelError, match="SWITCHBOARD_TEXT_API_KEY") as raised:
                await model.structured(MESSAGES, "apples", SCHEMA)
        finally:
            await model.aclose()
    assert "SECRET" not in str(raised.value)


async def test_a_model_that_never_answers_times_out_and_one_nobody_serves_is_unreachable():
    async with FakeTextModel(key=KEY, model="gpt-test") as fake:
        fake.hang_next()
        model = TextModel(fake.url, KEY, "gpt-test", client=client(timeout=0.3))
        try:
            with pytest.raises(TextModelError, match="did not answer in time"):
                await model.structured(MESSAGES, "apples", SCHEMA)
        finally:
            await model.aclose()
        url = fake.url
    gone = TextModel(url, KEY, "gpt-test", client=client())  # the fake is closed: nothing listens there
    try:
        with pytest.raises(TextModelError, match="cannot reach the text model"):
            await gone.structured(MESSAGES, "apples", SCHEMA)
    finally:
        await gone.aclose()


@pytest.mark.parametrize("url,why", [
    ("http://api.example.com/v1", "clear text"),
    ("https://user:pw@api.example.com/v1", "credentials in the URL"),
    ("https://api.example.com/v1?api_key=abc", "credential in the URL"),
    ("ftp://api.example.com/v1", "not a https:// URL"),
])
async def test_the_key_goes_only_over_https_or_to_loopback(url, why):
    with pytest.raises(TextModelError, match=why) as raised:
        TextModel(url, KEY, "gpt-test")
    assert "SECRET" not in str(raised.value) and "pw" not in str(raised.value)
    for fine in ("https://api.example.com/v1", "http://127.0.0.1:9/v1", "http://localhost:9/v1", "http://[::1]:9/v1"):
        await TextModel(fine, KEY, "gpt-test", client=client()).aclose()


async def test_proxy_variables_are_ignored(monkeypatch):
    async with FakeTextModel(key=KEY, model="gpt-test") as fake:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")  # a proxy nobody serves: honouring it fails
        fake.answer = lambda body: {"colour": "red", "count": 1}
        model = TextModel(fake.url, KEY, "gpt-test", 5.0)  # its own client, as the app builds it
        try:
            assert await model.structured(MESSAGES, "apples", SCHEMA) == {"colour": "red", "count": 1}
        finally:
            await model.aclose()
        fake.assert_clean()


async def test_a_redirect_is_not_followed():
    """A redirect could carry the request, key and all, somewhere else: it is an error instead."""
    async with FakeTextModel(key=KEY, model="gpt-test") as fake:
        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(fake.url + "/chat/completions")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", redirect)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            model = TextModel(f"http://127.0.0.1:{port}/v1", KEY, "gpt-test", 5.0)
            try:
                with pytest.raises(TextModelError, match="HTTP 307"):
                    await model.structured(MESSAGES, "apples", SCHEMA)
            finally:
                await model.aclose()
        finally:
            await runner.cleanup()
    assert fake.requests == []
