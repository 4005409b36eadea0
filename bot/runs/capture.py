"""Bounded output capture — pure: keep the head and the tail of a stream, and say what was cut."""

from __future__ import annotations


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
