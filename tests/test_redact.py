"""The redactor over every shape a key takes in a log line."""

from __future__ import annotations

import logging

import pytest

from common.redact import CredentialRedactor, redact

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
