"""The fake Chat Completions endpoint is as strict as the real one — and the openai SDK accepts it."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Literal

import httpx
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion

from common.tls import verified_tls
from tests.support.fake_text_model import FakeTextModel, SchemaError, check_strict_schema

KEY = "sk-text-test"
MODEL = "gpt-test"

FACTS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["facts"],
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": 20,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["text", "kind", "who"],
                "properties": {
                    "text": {"type": "string", "description": "one durable fact"},
                    "kind": {"type": "string", "enum": ["preference", "person", "plan"]},
                    "who": {"type": ["string", "null"]},
                },
            },
        },
    },
}


def body(schema: dict | None = None, **kw) -> dict:
    base = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "Extract durable facts."},
                     {"role": "user", "content": "Alice: I always drink green tea."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "facts", "strict": True,
                                            "schema": FACTS_SCHEMA if schema is None else schema}},
    }
    base.update(kw)
    return base


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}




def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=5, verify=verified_tls())


async def post(http: httpx.AsyncClient, fake: FakeTextModel, payload, *, key: str = KEY) -> httpx.Response:
    return await http.post(fake.url + "/chat/completions", json=payload, headers=auth(key))


def nested_item(schema: dict) -> dict:
    return schema["properties"]["facts"]["items"]


# -- the happy path --------------------------------------------------------------------------------

async def test_a_strict_request_gets_a_real_chat_completion_with_the_scripted_answer():
    answer = {"facts": [{"text": "drinks green tea", "kind": "preference", "who": "Alice"}]}
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        assert fake.url.startswith("http://127.0.0.1:") and fake.url.endswith("/v1")
        fake.answer = lambda request_body: answer
        response = await post(http, fake, body())
        assert response.status_code == 200, response.text
        completion = ChatCompletion.model_validate(response.json())
        assert completion.object == "chat.completion" and completion.model == MODEL
        choice = completion.choices[0]
        assert choice.finish_reason == "stop" and choice.message.refusal is None
        assert json.loads(choice.message.content) == answer
        usage = completion.usage
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
        assert fake.requests == [body()]
        assert fake.last_user_text() == "Alice: I always drink green tea."
        fake.assert_clean()


async def test_the_default_answer_is_no_facts_and_a_str_answer_is_sent_raw():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        first = await post(http, fake, body())
        assert json.loads(first.json()["choices"][0]["message"]["content"]) == {"facts": []}
        fake.answer = lambda request_body: '{"facts": [ oops'
        second = await post(http, fake, body(messages=[
            {"role": "developer", "content": "Extract."},
            {"role": "user", "content": [{"type": "text", "text": "part one, "},
                                         {"type": "text", "text": "two"}]}]))
        assert second.status_code == 200
        assert second.json()["choices"][0]["message"]["content"] == '{"facts": [ oops'
        assert fake.last_user_text() == "part one, two"
        fake.assert_clean()


# -- the fake is strict ----------------------------------------------------------------------------

async def test_a_wrong_or_missing_key_is_401_with_an_openai_error_body():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        wrong = await post(http, fake, body(), key="nope")
        missing = await http.post(fake.url + "/chat/completions", json=body())
        for response in (wrong, missing):
            assert response.status_code == 401
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert len(fake.violations) == 2 and fake.requests == []
        with pytest.raises(AssertionError, match="invalid_api_key"):
            fake.assert_clean()
        fake.expect_violation()
        fake.expect_violation()
        fake.assert_clean()


async def test_a_nested_object_without_additional_properties_false_is_400():
    schema = copy.deepcopy(FACTS_SCHEMA)
    del nested_item(schema)["additionalProperties"]
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        response = await post(http, fake, body(schema))
        assert response.status_code == 400
        assert "additionalProperties" in response.json()["error"]["message"]
        assert len(fake.violations) == 1 and "'items'" in fake.violations[0]
        assert fake.requests == []
        fake.expect_violation()
        fake.assert_clean()


async def test_required_must_list_every_property():
    schema = copy.deepcopy(FACTS_SCHEMA)
    nested_item(schema)["required"] = ["text", "kind"]  # "who" optional: not allowed in strict mode
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        response = await post(http, fake, body(schema))
        assert response.status_code == 400 and "Missing 'who'" in response.json()["error"]["message"]
        assert len(fake.violations) == 1
        fake.expect_violation()
        fake.assert_clean()


async def test_a_wrong_model_is_404_model_not_found():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        response = await post(http, fake, body(model="gpt-other"))
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
        assert fake.violations and fake.requests == []
        fake.expect_violation()
        fake.assert_clean()


async def test_stream_true_is_400():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        response = await post(http, fake, body(stream=True))
        assert response.status_code == 400 and response.json()["error"]["param"] == "stream"
        assert (await post(http, fake, body(stream=False))).status_code == 200
        assert len(fake.violations) == 1 and len(fake.requests) == 1


async def test_messages_without_a_user_or_a_system_message_are_400():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        no_user = body(messages=[{"role": "system", "content": "Extract durable facts."}])
        no_system = body(messages=[{"role": "user", "content": "hi"}])
        for payload in (no_user, no_system, body(messages=[])):
            assert (await post(http, fake, payload)).status_code == 400
        assert len(fake.violations) == 3 and fake.requests == []


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda b: b.update(temperature="hot"), id="type-checked-by-the-openai-params"),
    pytest.param(lambda b: b["messages"].append({"role": "robot", "content": "x"}), id="lazy-message-union"),
    pytest.param(lambda b: b.update(messages="Alice likes tea"), id="messages-not-an-array"),
    pytest.param(lambda b: b.update(temprature=0), id="unknown-argument"),
    pytest.param(lambda b: b["messages"][1].update(text="x"), id="unknown-message-key"),
    pytest.param(lambda b: b.pop("response_format"), id="no-response-format"),
    pytest.param(lambda b: b.update(response_format={"type": "json_object"}), id="json-object-mode"),
    pytest.param(lambda b: b["response_format"]["json_schema"].update(strict=False), id="not-strict"),
    pytest.param(lambda b: b["response_format"]["json_schema"].update(name="facts v2"), id="bad-name"),
    pytest.param(lambda b: b["response_format"]["json_schema"].pop("schema"), id="no-schema"),
])
async def test_other_request_bugs_are_400(mutate):
    payload = body(copy.deepcopy(FACTS_SCHEMA))
    mutate(payload)
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        response = await post(http, fake, payload)
        assert response.status_code == 400, response.text
        assert len(fake.violations) == 1 and fake.requests == []


async def test_bad_json_and_unknown_paths_are_rejected():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        bad = await http.post(fake.url + "/chat/completions", content=b"{not json", headers=auth())
        assert bad.status_code == 400
        doubled = await http.post(fake.url + "/v1/chat/completions", json=body(), headers=auth())
        assert doubled.status_code == 404 and "Invalid URL" in doubled.json()["error"]["message"]
        assert len(fake.violations) == 2


def test_the_strict_schema_rules():
    check_strict_schema(FACTS_SCHEMA)
    refs = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
            "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
            "$defs": {"A": {"type": "object", "additionalProperties": False, "required": [],
                            "properties": {}}}}
    check_strict_schema(refs)
    leaf = {"type": "object", "additionalProperties": False, "required": [], "properties": {}}
    for _ in range(9):
        leaf = {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {"x": leaf}}
    check_strict_schema(leaf)  # ten levels
    bad = [
        {"type": "array", "items": {"type": "string"}},                                  # root not an object
        {**FACTS_SCHEMA, "properties": {"facts": {"type": "string", "default": ""}}},    # unsupported keyword
        {**FACTS_SCHEMA, "properties": {"facts": {"description": "untyped"}}},           # no type
        {**FACTS_SCHEMA, "properties": {"facts": {"type": "date"}}},                     # unknown type
        {**FACTS_SCHEMA, "properties": {"facts": {"$ref": "#/$defs/Nope"}}},             # dangling $ref
        {**FACTS_SCHEMA, "properties": {"facts": {"anyOf": [{"type": "object"}]}}},      # object in anyOf
        {**FACTS_SCHEMA, "properties": {"facts": {"type": "array"}}},                    # array without items
        {**FACTS_SCHEMA, "required": ["facts", "extra"]},                                # not in properties
        {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {"x": leaf}},
    ]
    for schema in bad:
        with pytest.raises(SchemaError):
            check_strict_schema(schema)


# -- scripted outcomes -----------------------------------------------------------------------------

async def test_fail_next_then_success():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        fake.fail_next(500)
        fake.fail_next(429, "Rate limit reached", headers={"retry-after": "0"})
        first = await post(http, fake, body())
        assert first.status_code == 500 and first.json()["error"]["type"] == "server_error"
        second = await post(http, fake, body())
        assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
        assert second.headers["retry-after"] == "0"
        third = await post(http, fake, body())
        assert third.status_code == 200
        assert len(fake.requests) == 3  # retries are counted; scripted failures are not violations
        fake.assert_clean()


async def test_fail_next_times_and_bad_requests_are_still_rejected_first():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        fake.fail_next(503, times=2)
        assert (await post(http, fake, body(model="nope"))).status_code == 404  # does not consume a failure
        assert [(await post(http, fake, body())).status_code for _ in range(3)] == [503, 503, 200]
        fake.expect_violation()
        fake.assert_clean()


async def test_refuse_next_gives_a_refusal():
    async with FakeTextModel(key=KEY, model=MODEL) as fake, client() as http:
        fake.refuse_next("I can't help with that.")
        response = await post(http, fake, body())
        message = ChatCompletion.model_validate(response.json()).choices[0].message
        assert message.content is None and message.refusal == "I can't help with that."
        follow_up = await post(http, fake, body())
        assert follow_up.json()["choices"][0]["message"]["refusal"] is None


async def test_hang_next_times_the_client_out_and_the_fake_still_closes_promptly():
    async with client() as http:
        async with FakeTextModel(key=KEY, model=MODEL) as fake:
            fake.hang_next()
            with pytest.raises(httpx.ReadTimeout):
                await http.post(fake.url + "/chat/completions", json=body(), headers=auth(), timeout=0.05)
            assert fake.hanging.is_set() and len(fake.requests) == 1
            fake.hanging.clear()
            fake.hang_next()
            waiting = asyncio.create_task(post(http, fake, body()))  # no timeout: only the close ends it
            await fake.hanging.wait()
            closing = time.monotonic()
        assert time.monotonic() - closing < 1.0
        with pytest.raises(httpx.TransportError):
            await waiting
        assert time.monotonic() - closing < 1.0
        fake.assert_clean()


# -- the openai SDK as an independent reference client ---------------------------------------------

class Fact(pydantic.BaseModel):
    text: str
    kind: Literal["preference", "person", "plan"]
    who: str | None


class Facts(pydantic.BaseModel):
    facts: list[Fact]


async def test_the_openai_sdk_talks_to_the_fake():
    answer = {"facts": [{"text": "drinks green tea", "kind": "preference", "who": "Alice"}]}
    async with FakeTextModel(key=KEY, model=MODEL) as fake, \
            httpx.AsyncClient(trust_env=False, verify=verified_tls()) as http:
        fake.answer = lambda request_body: answer
        sdk = openai.AsyncOpenAI(base_url=fake.url, api_key=KEY, http_client=http, max_retries=0)
        messages = body()["messages"]
        created = await sdk.chat.completions.create(model=MODEL, messages=messages,
                                                    response_format=body()["response_format"])
        assert json.loads(created.choices[0].message.content) == answer
        parsed = await sdk.chat.completions.parse(model=MODEL, messages=messages, response_format=Facts)
        assert parsed.choices[0].message.parsed == Facts.model_validate(answer)  # the SDK's own strict schema
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model="gpt-other", messages=messages,
                                              response_format=body()["response_format"])
        assert len(fake.requests) == 2
        fake.expect_violation()
        fake.assert_clean()
