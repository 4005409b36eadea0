"""The redactor over every shape a key takes in a log line."""

from __future__ import annotations

import base64
import json
import logging
from urllib.parse import quote, quote_plus

import pytest

from common.redact import CredentialRedactor, connection_logger, encoded_forms, redact, scrub_secrets

KEY = "sk-proj-Abc123def456ghi789"
XKEY = "xai-Zyx987wvu654tsr321"
OPAQUE = "q9W8e7R6t5Y4u3I2"  # a key with no recognisable prefix

SHAPES = [
    ("header line", f"> Authorization: Bearer {KEY}"),
    ("header line, opaque key", f"> Authorization: Bearer {OPAQUE}"),
    ("header dict repr", str({"Authorization": f"Bearer {KEY}"})),
    ("header dict, opaque", str({"Authorization": f"Bearer {OPAQUE}", "User-Agent": "x"})),
    ("header dict json", f'{{"authorization": "Bearer {OPAQUE}"}}'),
    ("list of tuples", str([("Authorization", f"Bearer {OPAQUE}"), ("Accept", "*/*")])),
    ("x-api-key header", f"x-api-key: {OPAQUE}"),
    ("api-key header", f"api-key: {OPAQUE}"),
    ("x-api-key in a dict", str({"x-api-key": OPAQUE})),
    ("url query key", f"GET https://host/v1/realtime?model=m&key={OPAQUE}&x=1"),
    ("url query api_key", f"wss://host/ws?api_key={OPAQUE}"),
    ("url query token", f"wss://host/ws?token={OPAQUE}"),
    ("url userinfo", f"ws://user:{OPAQUE}@127.0.0.1:9000/v1/realtime"),
    ("bare sk key", f"the key {KEY} was rejected"),
    ("bare xai key", f"using {XKEY}"),
    ("already half redacted", f"Authorization: *** {KEY}"),
    ("already half redacted, opaque", f"Authorization: *** Bearer {OPAQUE}"),
    ("basic auth", f"Authorization: Basic {OPAQUE}"),
    ("bearer alone", f"sent Bearer {OPAQUE} upstream"),
    ("env style", f"OPENAI_API_KEY={OPAQUE}"),
    ("password kv", f"password={OPAQUE}"),
    ("database url", f"postgresql://switchboard:{OPAQUE}@db.example:5432/sb?sslmode=require"),
    ("database url, postgres scheme", f"connecting to postgres://sb:{OPAQUE}@10.0.0.5/sb"),
    ("database url, password only", f"postgresql://:{OPAQUE}@db.example/sb"),
    ("database url, percent-encoded", f"postgresql://sb:{quote(OPAQUE + '@/:', safe='')}@db.example/sb"),
    ("database url, password in the query", f"postgresql://db.example/sb?user=sb&password={OPAQUE}&sslmode=verify-full"),
    ("libpq key/value", f"host=db.example port=5432 dbname=sb user=sb password={OPAQUE} sslmode=require"),
    ("libpq key/value, quoted", f"host=db.example password='{OPAQUE}' dbname=sb"),
]


@pytest.mark.parametrize("shape,line", SHAPES, ids=[s for s, _ in SHAPES])
def test_no_key_survives_redaction(shape, line):
    cleaned = redact(line)
    for secret in (KEY, XKEY, OPAQUE, KEY[3:], OPAQUE[:8]):
        assert secret not in cleaned, f"{shape}: {cleaned}"
    assert "***" in cleaned


@pytest.mark.parametrize("line", [
    "response.create sent (event sb_r3)",
    "monkey business at https://host/v1/realtime?model=gpt-realtime-2.1-mini",
    "turn 4: 512 ms to first audio, skipped 3 frames",
])
def test_ordinary_lines_are_left_alone(line):
    assert redact(line) == line


def test_the_filter_cleans_args_and_header_pairs():
    flt = CredentialRedactor()
    rec = logging.LogRecord("x", logging.DEBUG, __file__, 1, "> %s: %s", ("Authorization", f"Bearer {OPAQUE}"), None)
    flt.filter(rec)
    assert OPAQUE not in rec.getMessage()
    rec = logging.LogRecord("x", logging.DEBUG, __file__, 1, "headers %r", ({"Authorization": f"Bearer {OPAQUE}"},), None)
    flt.filter(rec)
    assert OPAQUE not in rec.getMessage()


def test_a_connection_log_removes_its_own_key_in_every_form_a_server_could_echo(caplog):
    key = "sk-live/KEY+with spaces=="
    log = connection_logger("tests.redact.connection", lambda: [key])
    caplog.set_level(logging.DEBUG, logger="tests.redact.connection")
    log.debug("> %s: %s", "Authorization", f"Bearer {key}")  # websockets' header dump
    log.debug("< Sec-WebSocket-Accept: %s", quote(f"Bearer {key}"))  # echoed back, percent-encoded
    log.info("closed: %s", json.dumps({"detail": key}))  # JSON-escaped in an error body
    text = caplog.text
    assert "Authorization: ***" in text and text.count("***") == 3, text
    assert all(form not in text for form in (key, quote(key, safe=""), json.dumps(key)[1:-1], "KEY+with"))


def test_a_connection_log_without_secrets_still_redacts_credentials(caplog):
    log = connection_logger("tests.redact.plain")
    caplog.set_level(logging.DEBUG, logger="tests.redact.plain")
    log.debug("> %s: %s", "X-Api-Key", "opaque-value-1234")
    assert "opaque-value-1234" not in caplog.text and "X-Api-Key: ***" in caplog.text


SPACED = "hunter2 pass/word+x"  # a space and a / are encoded differently by each URL encoder


@pytest.mark.parametrize("form", [quote(SPACED), quote(SPACED, safe=""), quote_plus(SPACED)],
                         ids=["path", "component", "form-field"])
def test_every_percent_encoding_of_a_secret_holding_a_space_and_a_slash_is_removed_whole(form):
    assert scrub_secrets(f"GET /x?p={form}&next=1", [SPACED]) == "GET /x?p=***&next=1"


def test_the_encoded_forms_are_hex_percent_and_base64_at_each_offset_and_never_short():
    forms = encoded_forms("abc")  # 3 bytes: hex is 6 characters, base64 4: all too short to match safely
    assert forms == {"%61%62%63", "%61%62%63".lower()}
    secret = "tok-3x/+Zq"
    for prefix in ("", "A", "AB", "ABC"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(f"{prefix}{secret}TAIL".encode()).decode()
            assert any(form in text for form in encoded_forms(secret)), (prefix, text)
    assert secret.encode().hex() in encoded_forms(secret) and secret.encode().hex().upper() in encoded_forms(secret)
