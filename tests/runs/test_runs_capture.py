"""The secret scrubber over what a run's output becomes: whole secrets, the pieces a cut or a split
leaves, mutation tokens nobody announced — and nothing else touched."""

from __future__ import annotations

import base64
from urllib.parse import quote, unquote

import pytest

from runs.capture import REDACTED, SECRET_PIECE_CHARS, CappedOutput, Scrubber

SECRET = "sk-proj-Q1w2E3r4T5y6U7i8O9p0-AsDfGhJkL"  # 38 characters
OTHER = "MTA5ODc2NTQzMjEwOTg3NjU0.GaBcDe.d1sc0rd"


def survivors(text: str, *secrets: str) -> list[str]:
    n = SECRET_PIECE_CHARS
    return [s[i:i + n] for s in secrets for i in range(len(s) - n + 1) if s[i:i + n] in text]


@pytest.mark.parametrize("text,expected", [
    (f"key={SECRET}.", f"key={REDACTED}."),
    (f"{SECRET}{OTHER}", REDACTED),  # adjacent finds are one
    (f"head {SECRET[:8]}", f"head {REDACTED}"),  # the first 8 characters at the end of a cut chunk
    (f"head {SECRET[:7]}", f"head {SECRET[:7]}"),  # 7 are not a piece
    (f"{SECRET[-8:]} tail", f"{REDACTED} tail"),  # a chunk that starts partway into it
    (f"mid {SECRET[10:30]} mid", f"mid {REDACTED} mid"),  # an error message cut at both ends
    ("nothing secret here, sk-proj- alone is 8 though", "nothing secret here, [redacted] alone is 8 though"),
    ("--token sbt_kZ3-9q_Xw-Pm_77 rest", f"--token {REDACTED} rest"),  # - and _ are token characters
    ("sbt_a", REDACTED),
    ("plain text", "plain text"),
])
def test_a_secret_whole_or_any_piece_of_eight_is_replaced(text, expected):
    assert Scrubber([SECRET, OTHER])(text) == expected


def test_a_short_secret_is_replaced_only_whole_and_blank_ones_are_ignored():
    scrub = Scrubber(["abc123", "", "   ", "abc123"])
    assert scrub.secrets == ("abc123",)
    assert scrub("x abc123 abc12") == f"x {REDACTED} abc12"
    assert Scrubber([])("nothing") == "nothing"


def test_a_secret_written_in_two_chunks_and_cut_by_the_cap_leaves_no_piece():
    capture = CappedOutput(256)  # keeps a 64-byte head and a 192-byte tail
    capture.feed(b"A" * 50 + SECRET[:20].encode())  # the head ends 14 characters into it
    capture.feed(SECRET[20:].encode() + b"B" * 400)
    capture.feed(OTHER[:5].encode())  # the tail starts partway into the other secret...
    capture.feed(OTHER[5:].encode() + b"C" * (192 - len(OTHER) + 12))  # ...12 characters in
    text = capture.text()
    assert capture.cut and survivors(text, SECRET, OTHER)  # the cut left pieces of both
    scrubbed = Scrubber([SECRET, OTHER])(text)
    assert survivors(scrubbed, SECRET, OTHER) == []
    assert scrubbed.startswith("A" * 50 + REDACTED + "\n[… ") and "bytes cut" in scrubbed
    assert scrubbed.endswith("]\n" + REDACTED + "C" * (192 - len(OTHER) + 12))


def test_a_secret_split_across_two_reports_is_gone_from_both():
    scrub = Scrubber([SECRET])
    first, second = f"writing {SECRET[:19]}", f"{SECRET[19:]} and on"
    assert scrub(first) == f"writing {REDACTED}" and scrub(second) == f"{REDACTED} and on"


def test_more_secrets_can_be_added_and_the_original_is_unchanged():
    scrub = Scrubber([SECRET])
    more = scrub.with_secrets([OTHER, ""])
    assert scrub(OTHER) == OTHER and more(f"{OTHER} {SECRET}") == f"{REDACTED} {REDACTED}"


DOTENV = (f"SWITCHBOARD_RUNS_CHANNEL_ID=123\nDISCORD_BOT_TOKEN={OTHER}\nOPENAI_API_KEY={SECRET}\n"
          "SWITCHBOARD_REPLY_TO=everyone\n").encode()


def wrapped(text: str, width: int) -> str:
    return "\n".join(text[i:i + width] for i in range(0, len(text), width)) + "\n"


def decodings(segment: str, encoding: str) -> list[str]:
    """What a piece of kept text says once decoded, at every alignment it could have."""
    if encoding == "percent":
        return [unquote(segment)]
    if "base64" in encoding:
        decode, step = (base64.urlsafe_b64decode if encoding == "base64url" else base64.b64decode), 4
    else:
        decode, step = bytes.fromhex, 2
    out = []
    for start in range(step):
        usable = segment[start:][: (len(segment) - start) // step * step].rstrip("=")
        try:
            out.append(decode(usable + "=" * (-len(usable) % 4) if step == 4 else usable).decode("utf-8", "replace"))
        except ValueError:
            pass
    return out


@pytest.mark.parametrize("prefix", [b"", b"#", b"##"])  # the secrets start at each of base64's byte offsets
@pytest.mark.parametrize("encoding", ["base64", "base64 -w0", "base64url", "hex", "HEX", "xxd -p", "percent"])
def test_an_encoded_copy_of_the_env_file_is_scrubbed_too(encoding, prefix):
    data = prefix + DOTENV
    shown = {"base64": lambda: base64.encodebytes(data).decode(),  # coreutils `base64`: 76-column lines
             "base64 -w0": lambda: base64.b64encode(data).decode(),
             "base64url": lambda: base64.urlsafe_b64encode(data).decode(),
             "hex": lambda: data.hex(), "HEX": lambda: data.hex().upper(),
             "xxd -p": lambda: wrapped(data.hex(), 60),  # `xxd -p`: 60-column lines
             "percent": lambda: quote(data.decode(), safe="")}[encoding]()
    scrubbed = Scrubber([SECRET, OTHER])(f"here is the file:\n{shown}done")
    assert scrubbed.startswith("here is the file:\n") and scrubbed.endswith("done")
    kept = scrubbed.removeprefix("here is the file:\n").removesuffix("done").replace("\n", "").split(REDACTED)
    assert len(kept) >= 3  # both secrets were found
    said = [text for segment in kept for text in decodings(segment, encoding)]
    assert "SWITCHBOARD_REPLY_TO=everyone" in "".join(said) or encoding != "percent"  # the rest is untouched
    assert survivors("\n".join(said), SECRET, OTHER) == []
