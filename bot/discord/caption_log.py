"""The captions' sans-I/O core: one call's turns as escaped lines packed into Discord messages, and
which request (`PostMessage`, `EditMessage`) may go out when — at most one per message per 1.5 s and
5 per 5 s in the thread (Discord's per-channel write limit), so faster lines coalesce into the next
edit. Time comes in as `now`; `bot.discord.captions.CaptionThread` is the shell that sends them.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections import deque
from dataclasses import dataclass, field

from bot.discord.untrusted import escape_caller_text
from common.visible import ELLIPSIS, plain_line

log = logging.getLogger(__name__)

MAX_CHARS = 1800  # per message: Discord allows 2,000; the rest is margin
MAX_AGE_S = 10.0  # a message takes new lines for this long after its first
EDIT_INTERVAL_S = 1.5  # between two requests for the same message
BURST, WINDOW_S = 5, 5.0  # requests per window in the thread (Discord's per-channel write limit)
NAME_MAX = 64  # code points of a display name (Discord's are ≤ 32); longer ones are cut


# -- one line --------------------------------------------------------------------------------------


def caption_line(role: str, name: str | None, text: str, *, agent_name: str) -> str | None:
    """One caption line: `**{name}**: {text}` for a person, `**{agent_name} (assistant)**: {text}` for
    the assistant (`role == "assistant"`; any other role is a person). None when `text` shows nothing.

    The line is plain text on Discord whatever the caller said or is called: control and format
    characters (zero-width, bidi overrides) are dropped, newlines and runs of spaces become one space,
    markdown is escaped (`discord.utils.escape_markdown`), `@everyone`/`@here`/`<@id>`-style mentions are
    broken (`escape_mentions`), every bracket is escaped so no masked link `[x](url)` can form (not even
    across name and text), and every `<` is followed by a zero-width space so no `<@…>`, `<#…>`, `<@&…>`,
    `<t:…>` or `</…>` token is parsed. A person's name is cut to 64 characters; one that reads as the
    assistant's marker anywhere in it (`name_skeleton`: look-alike letters, fillers and invisible marks
    do not hide it) is marked "(person)". The line may be longer than a message; `CaptionLog` cuts it."""
    said = plain_line(text)
    if not said:
        return None
    if role == "assistant":
        who = f"{plain_line(agent_name, NAME_MAX) or 'Assistant'} (assistant)"
    else:
        who = plain_line(name, NAME_MAX) or "Someone"
        if _reads_as_assistant(who):
            who += " (person)"
    return f"**{escape_caller_text(who)}**: {escape_caller_text(said)}"


# Letters that look like those of "(assistant)" in Cyrillic, Greek, IPA and the like (NFKC already maps the
# fullwidth, circled, super- and subscript forms), and bracket look-alikes NFKC leaves alone.
_CONFUSABLE = str.maketrans({
    **dict.fromkeys("\u0430\u0251\u03b1\u237a\u0250", "a"), **dict.fromkeys("\u0455\ua731\u0282\u01bd", "s"),
    **dict.fromkeys("\u0456\u0131\u03b9\u04cf\u0269\ua647\u1fbe\u0457\u026a", "i"),
    **dict.fromkeys("\u0442\u03c4\u0287\u1d1b", "t"), **dict.fromkeys("\u0578\u057c\u0274\u03b7\u043f", "n"),
    **dict.fromkeys("\u2768\u276a\u27ee\u2985\u2e28\ufd3e\u0f3a\u0f3c", "("),
    **dict.fromkeys("\u2769\u276b\u27ef\u2986\u2e29\ufd3f\u0f3b\u0f3d", ")"),
})
_SKELETON_KEEPS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789()")


def name_skeleton(name: str) -> str:
    """What a name reads as: compatibility forms folded (NFKC), accents and other marks dropped, case
    folded, look-alike letters mapped to the Latin ones, and then only ASCII letters, digits and
    parentheses kept — fillers (U+3164, U+115F, U+FFA0, U+2800), variation selectors, joiners and
    spaces leave nothing behind."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", name))
    folded = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold().translate(_CONFUSABLE)
    return "".join(c for c in folded if c in _SKELETON_KEEPS)


def _reads_as_assistant(name: str) -> bool:
    return "(assistant)" in name_skeleton(name)


def discord_length(text: str) -> int:
    """Length as Discord may count it (UTF-16 code units): never less than `len`, so limits stay safe."""
    return len(text.encode("utf-16-le")) // 2


def cut_line(line: str, limit: int) -> str:
    """`line` if it fits in `limit`, else its start and "…", never ending in a lone escaping backslash."""
    if discord_length(line) <= limit:
        return line
    kept, used = [], 0
    for ch in line:
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > limit - 1:
            break
        kept.append(ch)
    head = "".join(kept)
    if (len(head) - len(head.rstrip("\\"))) % 2:
        head = head[:-1]
    return head + ELLIPSIS


# -- the core: which request, when -------------------------------------------------------------------


@dataclass(frozen=True)
class PostMessage:
    """Post `text` as a new message in the thread; it becomes our message number `slot` (0, 1, …)."""

    slot: int
    text: str


@dataclass(frozen=True)
class EditMessage:
    """Replace the content of our message `slot` (posted earlier) with `text`."""

    slot: int
    text: str


CaptionAction = PostMessage | EditMessage


class InvalidState(RuntimeError):
    """`CaptionLog.sent()` without a request in flight."""


@dataclass
class _Message:
    opened_at: float
    lines: list[str] = field(default_factory=list)
    size: int = 0
    shown: int = 0  # lines Discord has (its last request for this message succeeded with them)
    posted: bool = False
    last_request_at: float = -math.inf


class CaptionLog:
    """The batching rules, without I/O or a clock: every entry point takes `now` (seconds, monotonic).

    `add(now, line)` appends a line to the current message while that stays within `max_chars` and is
    younger than `max_age_s`, else opens the next. `due(now)` returns the one request to make now, if
    any; the caller reports its success with `sent(now)` (the completion time, so the limits hold at
    Discord whatever the latency) or gives up with `fail()`. One request is in flight at a time.
    Requests respect `min_interval_s` per message and `burst` per `window_s` overall; messages are
    posted in order. `wake_at()` is when `due` will next have work (None: nothing until the next add
    or `sent`). Every line added before `fail()` ends up in exactly one message, in order."""

    def __init__(self, *, max_chars: int = MAX_CHARS, max_age_s: float = MAX_AGE_S,
                 min_interval_s: float = EDIT_INTERVAL_S, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        self.max_chars, self.max_age_s, self.min_interval_s = max_chars, max_age_s, min_interval_s
        self.window_s = window_s
        self._recent: deque[float] = deque(maxlen=burst)  # completion times of the last `burst` requests
        self._messages: dict[int, _Message] = {}  # slot -> message, while it may still need a request
        self._slots = 0
        self._in_flight: tuple[int, int] | None = None  # (slot, lines in the request)
        self.failed = False
        self.lines = 0  # added and kept (not dropped)
        self.shown = 0  # lines Discord has
        self.messages = 0  # messages posted
        self.dropped = 0  # lines that will never be shown (after `fail()`)

    @property
    def pending(self) -> bool:
        """Some kept line is not shown yet."""
        return not self.failed and self.shown < self.lines

    def add(self, now: float, line: str) -> None:
        if self.failed:
            self.dropped += 1
            return
        line = cut_line(line, self.max_chars)
        current = self._messages.get(self._slots - 1)
        if (current is None or now - current.opened_at >= self.max_age_s
                or current.size + 1 + discord_length(line) > self.max_chars):
            self._close_current()
            current = self._messages[self._slots] = _Message(opened_at=now)
            self._slots += 1
        current.size += discord_length(line) + (1 if current.lines else 0)
        current.lines.append(line)
        self.lines += 1

    def due(self, now: float) -> CaptionAction | None:
        if self.failed or self._in_flight is not None:
            return None
        ready_at, slot = self._next()
        if slot is None or ready_at > now:
            return None
        message = self._messages[slot]
        self._in_flight = (slot, len(message.lines))
        text = "\n".join(message.lines)
        return EditMessage(slot, text) if message.posted else PostMessage(slot, text)

    def sent(self, now: float) -> None:
        """The request `due` returned has succeeded (its message now shows what it carried)."""
        if self._in_flight is None:
            raise InvalidState("sent() without a request in flight")
        slot, count = self._in_flight
        self._in_flight = None
        message = self._messages[slot]
        self.shown += count - message.shown
        if not message.posted:
            message.posted = True
            self.messages += 1
        message.shown, message.last_request_at = count, now
        self._recent.append(now)
        if slot != self._slots - 1 and message.shown == len(message.lines):
            del self._messages[slot]  # closed and complete: never needs another request

    def fail(self) -> int:
        """Stop for good: lines not shown yet are dropped, later ones too. Returns how many so far."""
        if not self.failed:
            self.failed = True
            self.dropped += self.lines - self.shown
            self.lines = self.shown
            self._messages.clear()
            self._in_flight = None
        return self.dropped

    def wake_at(self) -> float | None:
        if self.failed or self._in_flight is not None:
            return None
        ready_at, slot = self._next()
        return None if slot is None else ready_at

    def _next(self) -> tuple[float, int | None]:
        """The earliest time a request may go out and for which message (the lowest slot on a tie)."""
        free_at = self._recent[0] + self.window_s if len(self._recent) == self._recent.maxlen else -math.inf
        best: tuple[float, int | None] = (math.inf, None)
        for slot, message in self._messages.items():  # slots in order
            if message.shown == len(message.lines):
                continue
            if message.posted:
                ready = max(free_at, message.last_request_at + self.min_interval_s)
            else:
                ready = max(free_at, message.opened_at)
            if ready < best[0]:
                best = (ready, slot)
            if not message.posted:
                break  # later messages are posted after this one
        return best

    def _close_current(self) -> None:
        current = self._messages.get(self._slots - 1)
        if current is not None and current.posted and current.shown == len(current.lines):
            del self._messages[self._slots - 1]  # complete, so no request for it is in flight
