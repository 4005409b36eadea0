"""Parse a finished call's transcript — Markdown blocks or JSON — into `listener.model.Transcript`.

Pure: no I/O, no clock (it logs the optional fields it dropped, and returns them in
`Transcript.dropped`). The payload is external, untrusted data; nothing in it chooses who holds
authority (a payload's `user_speaker` is ignored, direction comes only from the event `metadata`).

Markdown blocks (blocks are separated by blank lines)::

    1
    [00:00:02,200 --> 00:00:13,079]
    **TO**: Column's scheduling business.
    This is Erica speaking.

Rules decided here:

- Line ends may be LF, CRLF or CR. A blank line is one that is empty after `str.strip()`.
- A block's head is an optional index line (ASCII digits only) and an optional time line
  (`[H:MM:SS,mmm --> H:MM:SS,mmm]`; `.` or `,` before the fraction, brackets and hours optional),
  in that order, blank lines between them tolerated; then the speaker line `**LABEL**: text` (also
  `**LABEL:** text`; labels may contain spaces, never `**`).
- **A speaker label is recognised only as the first content line of a block.** Every later line of
  the block is text of that turn verbatim, even one that starts with `**TO**:`; a `**X**:` in the
  middle of a line is never a label. So a caller cannot open a turn under another label from inside
  their own text; only a blank line (the provider's block separator) ends a turn.
- A block of plain text lines with no head continues the previous turn (a stray blank line inside a
  long turn); before any turn it is an error. A head (index/time) followed by text without a label
  is an error. A head with no label and no text is an empty turn and is dropped.
- Text is the turn's lines, each stripped, blank lines dropped, joined with "\\n". Empty turns are
  dropped and the rest re-numbered 0.. in order. The block number becomes `source_turn_id`
  (normalised: "007" -> "7").
- Markdown has no conversation id: the `conversation_id` argument is required for it.

JSON: `{conversation_id, source, participants: {id: label}, turns: [{speaker, text, timestamp?,
turn_id?}]}` as str/bytes (UTF-8, BOM tolerated; detected by a leading `{`) or a decoded dict.
`speaker` is required: a participant id (a key of `participants`) becomes that participant's
label, anything else is kept as written (stripped) — so `{"p1": "TO"}` makes p1's turns `TO`'s, and
the local direction mapping then decides whether that is the user. `timestamp` is seconds (number or
numeric string), `[H:]MM:SS[.fff]`, or a range `H:MM:SS,mmm --> H:MM:SS,mmm` (the Markdown notation,
brackets optional: its start and end); `turn_id` (string or integer) becomes `source_turn_id`. When
the `conversation_id` argument is given it wins, and a payload naming a different conversation is an
error (a misdelivered transcript is not archived under another call).

**An optional field never costs the call.** A time line, `timestamp`, block number or `turn_id` that
cannot be read (or an id used twice: the later one), a `participants` or `source` of the wrong shape
is dropped with a one-line note (in `Transcript.dropped`, and logged: one line each, the first
`MAX_NOTES`), and the turn and the call are kept. Only what a call cannot be read without fails it:
the structure, a speaker, a turn's text, the conversation id.

Failures raise `TranscriptError` (a `ValueError`) with a one-line message naming the block and line
(Markdown) or the turn (`turns[3]`, JSON) and quoting at most ~60 characters of content. Linear
time: one pass over the lines, the only regular expressions are anchored, flat, and run on lines of
bounded length. Lean memory: lines are read one at a time, each turn's text is built once when the
turn ends (a clean single line is kept as is, not copied), equal labels share one string, and the
turns a parsed JSON document held are released as they are converted.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from listener.model import Transcript, Turn
from listener.text import quote_untrusted

__all__ = ["MAX_NOTES", "TranscriptError", "parse_transcript"]

log = logging.getLogger(__name__)

MAX_LABEL_CHARS = 200
MAX_NOTES = 20  # dropped-field notes kept (and logged) per call; the rest are counted
_MAX_TIME_LINE = 100  # a time line is short; longer lines are never run through the regex
_SNIP_CHARS = 40

_TIME = r"(?:(\d{1,3}):)?(\d{1,2}):(\d{2})(?:[,.](\d{1,9}))?"
_TIME_LINE = re.compile(rf"\[?[ \t]*{_TIME}[ \t]*-->[ \t]*{_TIME}[ \t]*\]?")
_CLOCK = re.compile(_TIME)
_SECONDS = re.compile(r"\d{1,12}(?:\.\d{1,9})?")
_EOL = re.compile(r"\r\n|\r|\n")
_CONTENT = re.compile(r"\S")
_DIRECTIONS = ("inbound", "outbound")


class TranscriptError(ValueError):
    """The transcript could not be parsed. The message is one line and says what and where."""


class _Unreadable(ValueError):
    """An optional field's value cannot be read; the message says why (the caller notes and drops it)."""


def _snip(s: str) -> str:
    """A short, one-line, quoted excerpt of untrusted content for an error message."""
    r = repr(s[:_SNIP_CHARS] + ("…" if len(s) > _SNIP_CHARS else ""))
    return r if len(r) <= 60 else r[:57] + "..."


def parse_transcript(
    raw: str | bytes | dict,
    *,
    conversation_id: str | None = None,
    metadata: dict | None = None,
) -> Transcript:
    """Parse `raw` (Markdown blocks or a JSON transcript) into a `Transcript`. `metadata` is the
    event's `{direction, from, to}` (and optionally `source`). Raises `TranscriptError`; optional
    fields it could not read are dropped, logged and listed in `Transcript.dropped`."""
    meta = _metadata(metadata)
    if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id.strip()):
        raise TranscriptError("conversation_id argument must be a non-empty string")
    cid = conversation_id.strip() if conversation_id is not None else None

    if isinstance(raw, dict):
        transcript = _from_json(raw, cid, meta, owned=False)
    else:
        transcript = _from_text(raw, cid, meta)
    for note in transcript.dropped:
        log.warning("call %s: transcript field dropped, the call is kept: %s",
                    quote_untrusted(transcript.conversation_id), note)
    return transcript


def _from_text(raw: str | bytes, cid: str | None, meta: dict[str, str | None]) -> Transcript:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TranscriptError(f"transcript is not valid UTF-8 (byte {e.start})") from None
    elif isinstance(raw, str):
        text = raw[1:] if raw.startswith("\ufeff") else raw
    else:
        raise TranscriptError(f"unsupported transcript type {type(raw).__name__}")

    first = _CONTENT.search(text)  # not `text.lstrip()`: that copies the whole text
    if first is None:
        raise TranscriptError("empty transcript")
    if text.startswith("{", first.start()):
        try:
            obj = json.loads(text, object_pairs_hook=_json_object)
        except json.JSONDecodeError as e:
            raise TranscriptError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise TranscriptError("invalid JSON: nested too deeply") from None
        except ValueError:  # e.g. an integer literal beyond Python's digit limit
            raise TranscriptError("invalid JSON: a value could not be decoded") from None
        del text, raw  # the document is in `obj` now; this copy of the text can go
        return _from_json(obj, cid, meta, owned=True)
    if cid is None:
        raise TranscriptError("a Markdown transcript needs the conversation_id argument")
    return _from_markdown(text, cid, meta)


# --- metadata -----------------------------------------------------------------------------------


def _metadata(metadata: Any) -> dict[str, str | None]:
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TranscriptError("metadata must be an object")

    def text(key: str) -> str | None:
        v = metadata.get(key)
        return (v.strip() or None) if isinstance(v, str) else None

    direction = (text("direction") or "").lower()
    return {
        "direction": direction if direction in _DIRECTIONS else None,
        "from": text("from"),
        "to": text("to"),
        "source": text("source"),
    }


# --- building turns -----------------------------------------------------------------------------


def _clean_text(text: str) -> str:
    """A turn's text: its lines stripped, blank ones dropped, joined with "\n" (a clean single line is
    returned as it is, not copied)."""
    if "\n" not in text and "\r" not in text:
        return text.strip()
    return "\n".join(s for s in (line.strip() for line in _EOL.split(text)) if s)


class _Turns:
    """The kept turns, built one at a time as the parser finishes each: empty ones dropped, the rest
    numbered in order, source ids unique (a repeated one is dropped from the later turn), equal labels
    sharing one string, and notes about every optional field dropped."""

    def __init__(self, id_kind: str, where: str) -> None:
        self.id_kind = id_kind
        self._where_format = where  # "block {}" or "turns[{}]"
        self.turns: list[Turn] = []
        self.notes: list[str] = []
        self._unnoted = 0
        # Source ids seen so far. While the ids only grow — in (length, text) order: 1, 2, …, 10 or
        # t1, …, t10 — none can repeat and the set is not needed (it costs ~0.25x a transcript of
        # short turns); the first id out of order builds it from the turns kept so far.
        self._seen: set[str] | None = None
        self._last_id: tuple[int, str] | None = None
        self._labels: dict[str, str] = {}

    def _where(self, n: int) -> str:
        return self._where_format.format(n)

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self._unnoted += 1

    def add(self, speaker: str, text: str, start: float | None, end: float | None, turn_id: str | None,
            where: int) -> None:
        """`where`: the block number (Markdown) or the position in `turns` (JSON), for notes."""
        if not text:
            return
        if turn_id is not None:
            turn_id = self._unique(turn_id, where)
        label = self._labels.setdefault(speaker, speaker)
        self.turns.append(Turn(len(self.turns), label, text, start, end, turn_id))

    def _unique(self, turn_id: str, where: int) -> str | None:
        """`turn_id`, or None (noted) when an earlier kept turn already has it."""
        if self._seen is None:
            key = (len(turn_id), turn_id)
            if self._last_id is None or key > self._last_id:
                self._last_id = key
                return turn_id
            self._seen = {t.source_turn_id for t in self.turns if t.source_turn_id is not None}
        if turn_id in self._seen:
            self.note(f"{self._where(where)}: {self.id_kind} {_snip(turn_id)} already used by an earlier "
                      "turn; dropped from this turn")
            return None
        self._seen.add(turn_id)
        return turn_id

    def transcript(self, cid: str, meta: dict[str, str | None], source: str,
                   participants: dict[str, str]) -> Transcript:
        notes = self.notes + ([f"and {self._unnoted} more"] if self._unnoted else [])
        return Transcript(
            conversation_id=cid,
            turns=tuple(self.turns),
            source=source,
            direction=meta["direction"],
            from_number=meta["from"],
            to_number=meta["to"],
            participants=participants,
            dropped=tuple(notes),
        )


# --- Markdown -----------------------------------------------------------------------------------


def _clock_seconds(h: str | None, m: str, s: str, frac: str | None) -> float:
    minutes, seconds = int(m), int(s)
    if seconds >= 60 or (h is not None and minutes >= 60):
        raise _Unreadable("time out of range")
    total = (int(h) if h else 0) * 3600 + minutes * 60 + seconds
    return total + (float("0." + frac) if frac else 0.0)


def _time_range(s: str) -> tuple[float, float] | None:
    """`start --> end` as seconds; None when `s` is not one; _Unreadable when it is out of range."""
    if len(s) <= _MAX_TIME_LINE:
        m = _TIME_LINE.fullmatch(s)
        if m:
            g = m.groups()
            return _clock_seconds(*g[0:4]), _clock_seconds(*g[4:8])
    return None


_NO_TIME: tuple[None, None] = (None, None)  # a time line was there, but could not be read


def _time_line(s: str, where: str, turns: _Turns) -> tuple[float, float] | tuple[None, None] | None:
    """A head's time line: its (start, end); `_NO_TIME` for one that cannot be read (noted, the block
    is kept); None when the line is not a time line."""
    try:
        times = _time_range(s)
    except _Unreadable as exc:
        turns.note(f"{where}: {exc} in time line {_snip(s)}; time dropped")
        return _NO_TIME
    if times is not None:
        return times
    if s.startswith("[") and "-->" in s:
        turns.note(f"{where}: malformed time line {_snip(s)}; time dropped")
        return _NO_TIME
    return None


def _label_line(s: str, where: str) -> tuple[str, str] | None:
    """`**LABEL**: text` or `**LABEL:** text` -> (label, text); None when the line is not one."""
    if not s.startswith("**"):
        return None
    close = s.find("**", 2)
    if close < 0:
        return None
    label, rest = s[2:close], s[close + 2 :]
    if label.endswith(":"):  # `**TO:** text` (so `**TO:** : x` is TO saying ": x")
        label, text = label[:-1], rest
    elif rest.lstrip().startswith(":"):
        text = rest.lstrip()[1:]
    else:
        return None
    label = label.strip()
    if not label:
        raise TranscriptError(f"{where}: empty speaker label")
    if len(label) > MAX_LABEL_CHARS:
        raise TranscriptError(f"{where}: speaker label longer than {MAX_LABEL_CHARS} characters")
    return label, text.strip()


def _is_index(s: str) -> bool:
    return len(s) <= 9 and s.isascii() and s.isdigit()


def _lines(text: str):
    """The lines of `text` one at a time (LF, CRLF or CR), never all at once."""
    pos = 0
    for m in _EOL.finditer(text):
        yield text[pos : m.start()]
        pos = m.end()
    yield text[pos:]


class _MarkdownTurn:
    __slots__ = ("speaker", "where", "lines", "start_s", "end_s", "turn_id")

    def __init__(self, speaker: str, where: int, first: str, times: tuple, turn_id: str | None) -> None:
        self.speaker, self.where, self.lines, self.turn_id = speaker, where, [first], turn_id
        self.start_s, self.end_s = times

    def done(self, turns: _Turns) -> None:
        lines = self.lines
        text = lines[0] if len(lines) == 1 else "\n".join(s for s in lines if s)  # lines are stripped
        turns.add(self.speaker, text, self.start_s, self.end_s, self.turn_id, self.where)


def _from_markdown(text: str, cid: str, meta: dict[str, str | None]) -> Transcript:
    turns = _Turns("block number", "block {}")
    current: _MarkdownTurn | None = None  # the turn being read; finished when the next one starts
    head_index: str | None = None
    head_time: tuple | None = None
    in_body = False  # inside a turn's text: every non-blank line is text until a blank line
    after_blank = True
    block = 0
    for lineno, line in enumerate(_lines(text), 1):
        s = line.strip()
        if not s:
            in_body, after_blank = False, True
            continue
        if after_blank:
            block, after_blank = block + 1, False
        if in_body:
            current.lines.append(s)  # type: ignore[union-attr]  # in_body implies a turn
            continue
        where = f"block {block}, line {lineno}"
        label = _label_line(s, where)
        if label is not None:
            if current is not None:
                current.done(turns)
            current = _MarkdownTurn(label[0], block, label[1], head_time or _NO_TIME, head_index)
            head_index, head_time, in_body = None, None, True
            continue
        if _is_index(s):  # an earlier head with no label was an empty turn: dropped
            head_index, head_time = str(int(s)), None
            continue
        times = _time_line(s, where, turns)
        if times is not None:
            if head_time is not None:
                head_index = None
            head_time = times
            continue
        if head_index is not None or head_time is not None:
            raise TranscriptError(f"{where}: expected a **LABEL**: line, got {_snip(s)}")
        if current is None:
            raise TranscriptError(
                f"{where}: expected an index, a [start --> end] time or a **LABEL**: line, got {_snip(s)}"
            )
        current.lines.append(s)  # a text-only block continues the previous turn
        in_body = True
    if current is not None:
        current.done(turns)
    return turns.transcript(cid, meta, meta["source"] or "", {})


# --- JSON ---------------------------------------------------------------------------------------


def _timestamp(v: Any) -> tuple[float, float | None]:
    """A JSON turn's `timestamp` as (start, end or None); _Unreadable says why it cannot be read."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:
            f = math.inf
        if math.isfinite(f) and f >= 0:
            return f, None
    elif isinstance(v, str):
        s = v.strip()
        if len(s) <= 32 and _SECONDS.fullmatch(s):
            return float(s), None
        if len(s) <= 32 and (m := _CLOCK.fullmatch(s)):
            return _clock_seconds(*m.groups()), None
        span = _time_range(s)  # the Markdown notation: the turn's start and end
        if span is not None:
            return span
    raise _Unreadable("not seconds, HH:MM:SS or a start --> end range")


def _turn_id(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _Unreadable("not a string or an integer")
    if isinstance(v, int) and abs(v) >= 10**18:
        raise _Unreadable("integer out of range")
    s = str(v).strip()
    if not s:
        raise _Unreadable("empty")
    if len(s) > MAX_LABEL_CHARS:
        raise _Unreadable(f"longer than {MAX_LABEL_CHARS} characters")
    return s


def _shown(v: Any) -> str:
    return _snip(v) if isinstance(v, str) else type(v).__name__


def _participants(raw: Any, turns: _Turns) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        kind = "a turn-shaped object" if isinstance(raw, _JsonTurn) else type(raw).__name__
        turns.note(f"participants is not an object of id -> label ({kind}); dropped")
        return {}
    out: dict[str, str] = {}
    for k, v in raw.items():
        label = v.strip() if isinstance(v, str) else ""
        if not isinstance(k, str) or not label or len(label) > MAX_LABEL_CHARS:
            turns.note(f"participants[{_shown(k)}]: the label must be a non-empty string of at most "
                       f"{MAX_LABEL_CHARS} characters; dropped")
            continue
        out[k] = label
    return out


class _JsonTurn(tuple):
    """A decoded JSON turn, only what the parser reads: (speaker, text, timestamp, turn_id)."""

    __slots__ = ()


def _json_object(pairs: list[tuple[str, Any]]) -> Any:
    """`json.loads`' hook for every object: a turn (an object with `speaker` and `text`, and no
    `turns`) is kept as a `_JsonTurn` — four references instead of a dict, and whatever else it
    carried (word timings, confidences) released as soon as it is read; any other object is a dict.
    (So a `participants` object whose ids are literally "speaker" and "text" reads as a turn: it is
    dropped with a note, the call is kept.)"""
    obj = dict(pairs)
    if "speaker" in obj and "text" in obj and "turns" not in obj:
        return _JsonTurn((obj["speaker"], obj["text"], obj.get("timestamp"), obj.get("turn_id")))
    return obj


def _from_json(obj: Any, cid: str | None, meta: dict[str, str | None], *, owned: bool) -> Transcript:
    """`owned`: `obj` was decoded here, so its turns may be released as they are converted."""
    if not isinstance(obj, dict):
        raise TranscriptError("JSON transcript must be an object")
    own = obj.get("conversation_id")
    if own is not None and (not isinstance(own, str) or not own.strip()):
        raise TranscriptError("JSON conversation_id must be a non-empty string")
    own = own.strip() if own is not None else None
    if cid is not None and own is not None and own != cid:
        raise TranscriptError(f"JSON conversation_id {_snip(own)} does not match the event's {_snip(cid)}")
    cid = cid or own
    if cid is None:
        raise TranscriptError("JSON transcript has no conversation_id")

    out = _Turns("turn_id", "turns[{}]")
    source = obj.get("source")
    if source is not None and not isinstance(source, str):
        out.note(f"source is not a string ({type(source).__name__}); dropped")
        source = None
    participants = _participants(obj.get("participants"), out)

    turns = obj.get("turns")
    if not isinstance(turns, list):
        raise TranscriptError("JSON transcript has no 'turns' list")
    for i in range(len(turns)):
        t = turns[i]
        if owned:
            turns[i] = None  # this turn's object is released once it is converted
        where = f"turns[{i}]"
        if isinstance(t, dict):
            t = _JsonTurn((t.get("speaker"), t.get("text"), t.get("timestamp"), t.get("turn_id")))
        elif not isinstance(t, _JsonTurn):
            raise TranscriptError(f"{where}: a turn must be an object")
        speaker, body, stamp, raw_id = t
        del t
        if not isinstance(speaker, str) or not speaker.strip():
            raise TranscriptError(f"{where}: speaker must be a non-empty string")
        speaker = speaker.strip()
        if len(speaker) > MAX_LABEL_CHARS:
            raise TranscriptError(f"{where}: speaker longer than {MAX_LABEL_CHARS} characters")
        speaker = participants.get(speaker, speaker)
        if body is None:
            body = ""
        if not isinstance(body, str):
            raise TranscriptError(f"{where}: text must be a string")
        start = end = None
        if stamp is not None:
            try:
                start, end = _timestamp(stamp)
            except _Unreadable as exc:
                out.note(f"{where}: timestamp {_shown(stamp)} is {exc}; dropped")
        turn_id = None
        if raw_id is not None:
            try:
                turn_id = _turn_id(raw_id)
            except _Unreadable as exc:
                out.note(f"{where}: turn_id {_shown(raw_id)} is {exc}; dropped")
        out.add(speaker, _clean_text(body), start, end, turn_id, i)
    return out.transcript(cid, meta, source if source is not None else meta["source"] or "", participants)
