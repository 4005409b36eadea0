"""What of a run's output may be kept — pure: the head and the tail within a cap (saying what was
cut), and never a secret, whole or cut short, plain or encoded."""

from __future__ import annotations

import re
from collections.abc import Iterable

from common.redact import secret_forms

REDACTED = "[redacted]"
# No run of this many characters of a secret survives: a cap, a preview or a stream cut a secret
# anywhere, so its pieces (a head ending with its first characters, a tail starting mid-secret) count.
SECRET_PIECE_CHARS = 8
# A callback-mutation token (listener.callbacks: "sbt_" + URL-safe base64), whole or cut short, even
# one the scrubber was not told about.
MUTATION_TOKEN = re.compile(r"sbt_[A-Za-z0-9_-]+")


class CappedOutput:
    """Keeps at most `cap` bytes: the first quarter and the last three quarters of the stream.

    A one-shot agent prints its final answer last, so the tail matters most; the head keeps the
    opening context (what it set out to do). `text()` marks the gap with the number of bytes cut.
    """

    def __init__(self, cap: int) -> None:
        if cap < 16:
            raise ValueError("cap must be at least 16 bytes")
        self._head_cap = cap // 4
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            excess = len(self._tail) - self._tail_cap
            if excess > 0:
                del self._tail[:excess]

    @property
    def cut(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if not self.cut:
            return head + tail
        return f"{head}\n[… {self.cut} bytes cut: the output was longer than the {self._head_cap + self._tail_cap}-byte cap …]\n{tail}"


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """`text` bounded to about `cap` bytes with the same head/tail policy; True when something was cut."""
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text, False
    capture = CappedOutput(cap)
    capture.feed(data)
    return capture.text(), True


class Scrubber:
    """Replaces every secret it was given — as written, and in every form `common.redact.secret_forms`
    knows (escaped, percent-encoded, hex, base64: `cat .env | base64` is no way around it) — and every
    piece of one of those at least `SECRET_PIECE_CHARS` long, and anything shaped like a mutation token,
    with `[redacted]` (adjacent finds become one). Line breaks do not hide a form: `base64` and `xxd -p`
    wrap their lines, so the text is also searched with its line breaks left out.

    Blank secrets are ignored; a secret shorter than a piece is replaced only whole (its encoded forms
    are matched when they are at least `common.redact.ENCODED_FORM_MIN` long).
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: tuple[str, ...] = tuple(sorted({s for s in secrets if s and s.strip()}, key=len, reverse=True))
        self._forms = tuple(sorted({f for s in self.secrets for f in secret_forms(s)}, key=len, reverse=True))
        n = SECRET_PIECE_CHARS
        self._pieces = frozenset(f[i:i + n] for f in self._forms if len(f) >= n for i in range(len(f) - n + 1))

    def with_secrets(self, more: Iterable[str]) -> Scrubber:
        return Scrubber((*self.secrets, *more))

    def __call__(self, text: str) -> str:
        spans = [m.span() for m in MUTATION_TOKEN.finditer(text)] + self._found(text)
        kept = [i for i, c in enumerate(text) if c not in "\r\n"]
        if len(kept) < len(text):  # the same search with the line breaks left out, mapped back
            spans += [(kept[a], kept[b - 1] + 1) for a, b in self._found("".join(text[i] for i in kept))]
        if not spans:
            return text
        spans.sort()
        out: list[str] = []
        kept_to = 0
        end = -1
        for start, stop in spans:
            if start > end:  # a new find: keep the text before it
                if end >= 0:
                    out.append(REDACTED)
                out.append(text[kept_to:start])
            end = max(end, stop)
            kept_to = end
        out.append(REDACTED)
        out.append(text[kept_to:])
        return "".join(out)

    def _found(self, text: str) -> list[tuple[int, int]]:
        spans = []
        for form in self._forms:
            start = text.find(form)
            while start >= 0:
                spans.append((start, start + len(form)))
                start = text.find(form, start + 1)
        if self._pieces:
            n = SECRET_PIECE_CHARS
            spans.extend((i, i + n) for i in range(len(text) - n + 1) if text[i:i + n] in self._pieces)
        return spans
