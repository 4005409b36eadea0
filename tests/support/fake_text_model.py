"""Fake OpenAI-compatible Chat Completions endpoint (structured outputs) on loopback (aiohttp).

    async with FakeTextModel(key="k", model="gpt-test") as fake:
        fake.answer = lambda body: {"facts": [{"text": "likes tea"}]}
        extractor = FactExtractor(base_url=fake.url, api_key="k", model="gpt-test")  # hypothetical client
        ...
        assert "tea" in fake.last_user_text()
        fake.assert_clean()

It speaks the real shapes (`POST /v1/chat/completions` → a `chat.completion` object whose
`choices[0].message.content` is the JSON answer, `finish_reason: "stop"`, usage filled; errors as
`{"error": {"message", "type", "param", "code"}}`) and is as strict as the real API where a client
bug would show: a missing or wrong bearer is 401, a body that is not JSON or does not validate against
the `openai` package's own `CompletionCreateParamsNonStreaming` (Iterable fields are drained so the
lazy parts are checked too) or carries an argument the API does not know is 400, `stream: true` is
400, another model is 404 `model_not_found`, a `response_format` that is not a strict `json_schema`
is 400, a schema breaking the strict-mode rules anywhere (every object `additionalProperties: false`
and `required` naming exactly its `properties`; root an object; every node typed or an `anyOf`/`$ref`;
only the supported keywords; `$ref` resolving; at most 10 levels and 5000 properties) is 400, and
messages that are empty or lack a system/developer or a user message are 400. Any other path is the
real API's 404 "Invalid URL". Every rejected request is also recorded in `violations`, so
`assert_clean()` fails a test whose client sent one — unless the test expected it (`expect_violation`).
Every response body is built as, and checked against, `openai.types.chat.ChatCompletion` before it
is sent.

Beyond the real server: the test decides every answer. `answer(body) -> dict | str` (a dict is sent
JSON-encoded, a str raw, so a test can send malformed JSON; the fake does not check the answer against
the schema); `fail_next`, `refuse_next` and `hang_next` queue one-shot outcomes, used in the order
queued, for requests that passed the checks (a bad request is still rejected first). `requests` holds
every body that passed the checks, including those answered by a queued outcome, so retries can be
counted.
"""

from __future__ import annotations

import asyncio
import collections.abc
import itertools
import json
import re
import time
import typing
from collections import deque
from collections.abc import Callable
from typing import Any

import openai.types.chat as chat_types
import pydantic
from aiohttp import web
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.shared_params import ResponseFormatJSONSchema

# Strict-mode keywords (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas):
# the brief's set plus the documented numeric/string extras (format, multipleOf, exclusive bounds).
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "description", "anyOf",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
    "pattern", "format", "const", "$defs", "$ref", "title",
})
SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
MAX_DEPTH = 10
MAX_PROPERTIES = 5000
SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

PARAM_KEYS = frozenset(typing.get_type_hints(CompletionCreateParamsNonStreaming))
MESSAGE_KEYS = {
    role: frozenset(typing.get_type_hints(getattr(chat_types, f"ChatCompletion{name}MessageParam")))
    for role, name in (("system", "System"), ("developer", "Developer"), ("user", "User"),
                       ("assistant", "Assistant"), ("tool", "Tool"), ("function", "Function"))
}
RESPONSE_FORMAT_KEYS = frozenset(typing.get_type_hints(ResponseFormatJSONSchema))
JSON_SCHEMA_KEYS = frozenset({"name", "description", "schema", "strict"})

_PARAMS: pydantic.TypeAdapter | None = None


def _params() -> pydantic.TypeAdapter:
    global _PARAMS
    if _PARAMS is None:
        _PARAMS = pydantic.TypeAdapter(CompletionCreateParamsNonStreaming)
    return _PARAMS


def _drain(value: Any) -> Any:
    """Pydantic validates `Iterable[...]` lazily; walking the result runs the deferred checks."""
    if isinstance(value, dict):
        return {k: _drain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_drain(v) for v in value]
    if isinstance(value, collections.abc.Iterator):
        return [_drain(v) for v in value]
    return value


def _error_body(message: str, *, err_type: str = "invalid_request_error", param: str | None = None,
                code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def _error(message: str, *, status: int, err_type: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(_error_body(message, err_type=err_type, param=param, code=code), status=status,
                             headers=headers)


class SchemaError(ValueError):
    pass


def check_strict_schema(schema: Any) -> None:
    """Raise SchemaError naming the first place `schema` breaks OpenAI's strict-mode rules."""
    if not isinstance(schema, dict):
        raise SchemaError("schema must be a JSON object")
    if schema.get("type") != "object":
        raise SchemaError("the root schema must be an object ('type': 'object', not anyOf or a type list)")
    defs = schema.get("$defs", {})
    if not isinstance(defs, dict):
        raise SchemaError("'$defs' must be an object")
    counter = {"properties": 0}
    _check_node(schema, ("root",), depth=1, defs=defs, counter=counter)


def _where(path: tuple[str, ...]) -> str:
    return "context=" + repr(path)


def _check_node(node: Any, path: tuple[str, ...], *, depth: int, defs: dict, counter: dict) -> None:
    if not isinstance(node, dict):
        raise SchemaError(f"In {_where(path)}, schema must be a JSON object")
    unknown = sorted(set(node) - SCHEMA_KEYWORDS)
    if unknown:
        raise SchemaError(f"In {_where(path)}, {unknown[0]!r} is not permitted")
    if not ({"type", "anyOf", "$ref"} & set(node)):
        raise SchemaError(f"In {_where(path)}, schema must have a 'type' key")

    types: list[str] = []
    if "type" in node:
        raw = node["type"]
        types = raw if isinstance(raw, list) else [raw]
        if not types or not all(isinstance(t, str) and t in SCHEMA_TYPES for t in types) \
                or len(set(types)) != len(types):
            raise SchemaError(f"In {_where(path)}, invalid 'type': {raw!r}")

    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or (
                ref.startswith("#/$defs/") and ref[len("#/$defs/"):] in defs)):
            raise SchemaError(f"In {_where(path)}, reference {ref!r} can't be resolved")

    if "anyOf" in node:
        branches = node["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"In {_where(path)}, 'anyOf' must be a non-empty array")
        for i, branch in enumerate(branches):
            _check_node(branch, (*path, "anyOf", str(i)), depth=depth, defs=defs, counter=counter)

    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise SchemaError(f"In {_where(path)}, 'enum' must be a non-empty array")
    for key in ("description", "title", "pattern", "format"):
        if key in node and not isinstance(node[key], str):
            raise SchemaError(f"In {_where(path)}, {key!r} must be a string")
    for key in ("minItems", "maxItems"):
        if key in node and (not isinstance(node[key], int) or isinstance(node[key], bool) or node[key] < 0):
            raise SchemaError(f"In {_where(path)}, {key!r} must be a non-negative integer")
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if key in node and (not isinstance(node[key], (int, float)) or isinstance(node[key], bool)):
            raise SchemaError(f"In {_where(path)}, {key!r} must be a number")

    if "object" in types or "properties" in node or "additionalProperties" in node or "required" in node:
        _check_object(node, path, depth=depth, defs=defs, counter=counter)

    if "items" in node:
        _check_node(node["items"], (*path, "items"), depth=depth + 1, defs=defs, counter=counter)
    elif "array" in types:
        raise SchemaError(f"In {_where(path)}, an array schema must have 'items'")

    if "$defs" in node:
        if path != ("root",):
            raise SchemaError(f"In {_where(path)}, '$defs' is only permitted at the root")
        for name, sub in node["$defs"].items():
            _check_node(sub, ("$defs", name), depth=1, defs=defs, counter=counter)


def _check_object(node: dict, path: tuple[str, ...], *, depth: int, defs: dict, counter: dict) -> None:
    if depth > MAX_DEPTH:
        raise SchemaError(f"In {_where(path)}, schema exceeds the nesting limit of {MAX_DEPTH} levels")
    if node.get("additionalProperties") is not False:
        raise SchemaError(f"In {_where(path)}, 'additionalProperties' is required to be supplied and to be "
                          "false")
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise SchemaError(f"In {_where(path)}, 'properties' must be an object")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required) \
            or len(set(required)) != len(required):
        raise SchemaError(f"In {_where(path)}, 'required' must be an array of distinct strings")
    missing = [name for name in properties if name not in required]
    if missing:
        raise SchemaError(f"In {_where(path)}, 'required' is required to be supplied and to be an array "
                          f"including every key in properties. Missing {missing[0]!r}.")
    extra = [name for name in required if name not in properties]
    if extra:
        raise SchemaError(f"In {_where(path)}, 'required' names {extra[0]!r}, which is not in properties")
    counter["properties"] += len(properties)
    if counter["properties"] > MAX_PROPERTIES:
        raise SchemaError(f"schema exceeds the limit of {MAX_PROPERTIES} object properties")
    for name, sub in properties.items():
        _check_node(sub, (*path, "properties", name), depth=depth + 1, defs=defs, counter=counter)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


_HANG = object()


class FakeTextModel:
    """See the module docstring. `key=None` skips auth (an OpenAI-compatible server without keys)."""

    def __init__(self, *, key: str | None = "test-key", model: str = "gpt-test",
                 host: str = "127.0.0.1") -> None:
        self.key = key
        self.model = model
        self.host = host
        self.url = ""
        self.answer: Callable[[dict], dict | str] = lambda body: {"facts": []}
        self.requests: list[dict] = []
        self.violations: list[str] = []
        self.expected_violations = 0
        self.hanging = asyncio.Event()
        self._script: deque[Any] = deque()
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeTextModel:
        _params()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}/v1"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing.set()
        assert self._runner is not None
        await self._runner.cleanup()

    def assert_clean(self) -> None:
        unexpected = self.violations[self.expected_violations:]
        assert not unexpected, f"the client sent requests the real API would reject: {unexpected}"

    def expect_violation(self) -> None:
        """The next rejected request is what the test wants (e.g. a wrong key)."""
        self.expected_violations += 1

    # -- test controls -----------------------------------------------------------------------------

    def fail_next(self, status: int, message: str = "The server had an error while processing your request.",
                  times: int = 1, *, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        """Answer the next `times` good requests with an API error (500, 429, 503, …) instead."""
        if status == 429:
            err_type, code = "requests", code or "rate_limit_exceeded"
        elif status >= 500:
            err_type = "server_error"
        else:
            err_type = "invalid_request_error"
        for _ in range(times):
            self._script.append(("fail", status, message, err_type, code, headers))

    def refuse_next(self, text: str = "I'm sorry, I can't help with that.") -> None:
        """Answer the next good request with a refusal: `content: null`, `refusal: text`."""
        self._script.append(("refuse", text))

    def hang_next(self) -> None:
        """Never answer the next good request; it is cut off when the fake closes. `hanging` is set."""
        self._script.append(_HANG)

    def last_user_text(self) -> str:
        assert self.requests, "no request reached the fake"
        users = [m for m in self.requests[-1]["messages"] if m.get("role") == "user"]
        return _text_of(users[-1]["content"])

    # -- checks ------------------------------------------------------------------------------------

    def _reject(self, message: str, *, status: int, param: str | None = None, code: str | None = None,
                ) -> web.Response:
        self.violations.append(f"{status} {code or ''}: {message}")
        return _error(message, status=status, param=param, code=code)

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.key is None:
            return None
        header = request.headers.get("Authorization", "")
        if header != f"Bearer {self.key}":
            why = ("You didn't provide an API key." if not header
                   else "Incorrect API key provided.")
            return self._reject(why, status=401, code="invalid_api_key")
        return None

    def _check(self, body: Any) -> web.Response | None:
        if not isinstance(body, dict):
            return self._reject("The request body must be a JSON object.", status=400)
        unknown = sorted(set(body) - PARAM_KEYS)
        if unknown:
            return self._reject(f"Unrecognized request argument supplied: {unknown[0]}", status=400,
                                param=unknown[0])
        if body.get("stream"):
            return self._reject("This fake does not stream: 'stream' must be absent or false.", status=400,
                                param="stream")
        if not isinstance(body.get("messages", []), list):
            return self._reject(f"{body['messages']!r} is not of type 'array' - 'messages'", status=400,
                                param="messages")
        draining: str | None = None
        try:
            validated = _params().validate_python(body)
            for name, value in validated.items():
                draining = name  # where a lazily checked part fails is named in the error
                _drain(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            loc = (draining, *first["loc"]) if draining is not None else tuple(first["loc"])
            where = ".".join(str(p) for p in loc)
            return self._reject(f"Invalid request: {first['msg']} at {where!r} ({exc.error_count()} errors)",
                                status=400, param=str(loc[0]) if loc else None)

        messages = body["messages"]
        if not messages:
            return self._reject("[] is too short - 'messages'", status=400, param="messages")
        for i, message in enumerate(messages):
            extra = sorted(set(message) - MESSAGE_KEYS[message["role"]])
            if extra:
                return self._reject(f"Additional properties are not allowed ({extra[0]!r} was unexpected) - "
                                    f"'messages.{i}'", status=400, param=f"messages.[{i}]")
        roles = {m["role"] for m in messages}
        if not roles & {"system", "developer"}:
            return self._reject("messages need a system or developer message (the extraction instructions)",
                                status=400, param="messages")
        if "user" not in roles:
            return self._reject("messages need a user message (the text to extract from)", status=400,
                                param="messages")

        if body["model"] != self.model:
            return self._reject(f"The model `{body['model']}` does not exist or you do not have access to "
                                "it.", status=404, code="model_not_found")

        fmt = body.get("response_format")
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            return self._reject("response_format must be {'type': 'json_schema', ...} (structured outputs)",
                                status=400, param="response_format")
        extra = sorted(set(fmt) - RESPONSE_FORMAT_KEYS) or sorted(set(fmt["json_schema"]) - JSON_SCHEMA_KEYS)
        if extra:
            return self._reject(f"Unrecognized argument in response_format: {extra[0]}", status=400,
                                param="response_format")
        spec = fmt["json_schema"]
        if not SCHEMA_NAME.match(spec["name"]):
            return self._reject(f"Invalid 'response_format.json_schema.name': {spec['name']!r} must match "
                                "^[a-zA-Z0-9_-]+$ and be at most 64 characters", status=400,
                                param="response_format.json_schema.name")
        if spec.get("strict") is not True:
            return self._reject("response_format.json_schema.strict must be true", status=400,
                                param="response_format.json_schema.strict")
        if "schema" not in spec:
            return self._reject("response_format.json_schema.schema is required", status=400,
                                param="response_format.json_schema.schema")
        try:
            check_strict_schema(spec["schema"])
        except SchemaError as exc:
            return self._reject(f"Invalid schema for response_format '{spec['name']}': {exc}", status=400,
                                param="response_format", code="invalid_json_schema")
        return None

    # -- handlers ----------------------------------------------------------------------------------

    async def _unknown(self, request: web.Request) -> web.Response:
        return self._reject(f"Invalid URL ({request.method} {request.path})", status=404)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return self._reject("We could not parse the JSON body of your request. (HINT: This likely means "
                                "you aren't using your HTTP library correctly.)", status=400)
        if (bad := self._check(body)) is not None:
            return bad
        self.requests.append(body)

        outcome = self._script.popleft() if self._script else None
        if outcome is _HANG:
            self.hanging.set()
            await self._closing.wait()
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        if outcome is not None and outcome[0] == "fail":
            _, status, message, err_type, code, headers = outcome
            return _error(message, status=status, err_type=err_type, code=code, headers=headers)
        if outcome is not None and outcome[0] == "refuse":
            content, refusal = None, outcome[1]
        else:
            answer = self.answer(body)
            content, refusal = (answer if isinstance(answer, str) else json.dumps(answer)), None
        return web.json_response(self._completion(body, content, refusal),
                                 headers={"x-request-id": f"req_fake{next(self._ids):08d}"})

    def _completion(self, body: dict, content: str | None, refusal: str | None) -> dict:
        prompt = sum(len(_text_of(m.get("content"))) for m in body["messages"]) // 4 + 1
        completion = len(content or refusal or "") // 4 + 1
        n = body.get("n") or 1
        message = {"role": "assistant", "content": content, "refusal": refusal, "annotations": []}
        payload = {
            "id": f"chatcmpl-fake{len(self.requests):08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": i, "message": dict(message), "logprobs": None, "finish_reason": "stop"}
                        for i in range(n)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion * n,
                      "total_tokens": prompt + completion * n,
                      "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                    "accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
        ChatCompletion.model_validate(payload)  # the reference shape: a fake bug fails here, not in a client
        return payload
