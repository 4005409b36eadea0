"""Parse a finished call's transcript — Markdown blocks or JSON — into `listener.model.Transcript`.

Pure: no I/O, no clock. The payload is external, untrusted data; nothing in it chooses who holds
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
  (normalised: "007" -> "7"); a number used twice among the kept turns is an error.
- Markdown has no conversation id: the `conversation_id` argument is required for it.

JSON: `{conversation_id, source, participants: {id: label}, turns: [{speaker, text, timestamp?,
turn_id?}]}` as str/bytes (UTF-8, BOM tolerated; detected by a leading `{`) or a decoded dict.
`speaker` is kept as written (stripped); `timestamp` is seconds (number or numeric string) or
`[H:]MM:SS[.fff]` and becomes `start_s`; `turn_id` (string or integer) becomes `source_turn_id`
and must be unique. When the `conversation_id` argument is given it wins, and a payload naming a
different conversation is an error (a misdelivered transcript is not archived under another call).

Every failure raises `TranscriptError` (a `ValueError`) with a one-line message naming the block
and line (Markdown) or the turn (`turns[3]`, JSON) and quoting at most ~60 characters of content.
Linear time: one pass over the lines, the only regular expressions are anchored, flat, and run on
lines of bounded length.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from listener.model import Transcript, Turn

__all__ = ["TranscriptError", "parse_transcript"]

MAX_LABEL_CHARS = 200
_MAX_TIME_LINE = 100  # a time line is short; longer lines are never run through the regex
_SNIP_CHARS = 40

_TIME = r"(?:(\d{1,3}):)?(\d{1,2}):(\d{2})(?:[,.](\d{1,9}))?"
_TIME_LINE = re.compile(rf"\[?[ \t]*{_TIME}[ \t]*-->[ \t]*{_TIME}[ \t]*\]?")
_CLOCK = re.compile(_TIME)
_SECONDS = re.compile(r"\d{1,12}(?:\.\d{1,9})?")
_DIRECTIONS = ("inbound", "outbound")


class TranscriptError(ValueError):
    """The transcript could not be parsed. The message is one line and says what and where."""


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
    event's `{direction, from, to}` (and optionally `source`). Raises `TranscriptError`."""
    meta = _metadata(metadata)
    if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id.strip()):
        raise TranscriptError("conversation_id argument must be a non-empty string")
    cid = conversation_id.strip() if conversation_id is not None else None

    if isinstance(raw, dict):
        return _from_json(raw, cid, meta)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TranscriptError(f"transcript is not valid UTF-8 (byte {e.start})") from None
    elif isinstance(raw, str):
        text = raw[1:] if raw.startswith("\ufeff") else raw
    else:
        raise TranscriptError(f"unsupported transcript type {type(raw).__name__}")

    head = text.lstrip()
    if not head:
        raise TranscriptError("empty transcript")
    if head.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TranscriptError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise TranscriptError("invalid JSON: nested too deeply") from None
        except ValueError:  # e.g. an integer literal beyond Python's digit limit
            raise TranscriptError("invalid JSON: a value could not be decoded") from None
        return _from_json(obj, cid, meta)
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


def _clean_lines(lines: list[str]) -> str:
    return "\n".join(s for s in (line.strip() for line in lines) if s)


def _build(
    cid: str,
    drafts: list[_Draft],
    meta: dict[str, str | None],
    source: str,
    participants: dict[str, str],
    id_kind: str,
) -> Transcript:
    turns: list[Turn] = []
    seen: dict[str, str] = {}
    for d in drafts:
        body = _clean_lines(d.lines)
        if not body:
            continue
        if d.turn_id is not None:
            if d.turn_id in seen:
                raise TranscriptError(
                    f"{d.where}: {id_kind} {_snip(d.turn_id)} already used at {seen[d.turn_id]}"
                )
            seen[d.turn_id] = d.where
        turns.append(Turn(len(turns), d.speaker, body, d.start_s, d.end_s, d.turn_id))
    return Transcript(
        conversation_id=cid,
        turns=tuple(turns),
        source=source,
        direction=meta["direction"],
        from_number=meta["from"],
        to_number=meta["to"],
        participants=participants,
    )


@dataclass
class _Draft:
    speaker: str
    where: str
    lines: list[str] = field(default_factory=list)
    start_s: float | None = None
    end_s: float | None = None
    turn_id: str | None = None


# --- Markdown -----------------------------------------------------------------------------------


def _clock_seconds(h: str | None, m: str, s: str, frac: str | None, where: str) -> float:
    minutes, seconds = int(m), int(s)
    if seconds >= 60 or (h is not None and minutes >= 60):
        raise TranscriptError(f"{where}: time out of range")
    total = (int(h) if h else 0) * 3600 + minutes * 60 + seconds
    return total + (float("0." + frac) if frac else 0.0)


def _time_line(s: str, where: str) -> tuple[float, float] | None:
    if len(s) <= _MAX_TIME_LINE:
        m = _TIME_LINE.fullmatch(s)
        if m:
            g = m.groups()
            return _clock_seconds(*g[0:4], where), _clock_seconds(*g[4:8], where)
    if s.startswith("[") and "-->" in s:
        raise TranscriptError(f"{where}: malformed time line {_snip(s)}")
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


def _from_markdown(text: str, cid: str, meta: dict[str, str | None]) -> Transcript:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    drafts: list[_Draft] = []
    head_index: str | None = None
    head_time: tuple[float, float] | None = None
    in_body = False  # inside a turn's text: every non-blank line is text until a blank line
    after_blank = True
    block = 0
    for lineno, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s:
            in_body, after_blank = False, True
            continue
        if after_blank:
            block, after_blank = block + 1, False
        if in_body:
            drafts[-1].lines.append(s)
            continue
        where = f"block {block}, line {lineno}"
        label = _label_line(s, where)
        if label is not None:
            d = _Draft(label[0], f"block {block}", [label[1]], turn_id=head_index)
            if head_time is not None:
                d.start_s, d.end_s = head_time
            drafts.append(d)
            head_index, head_time, in_body = None, None, True
            continue
        if _is_index(s):  # an earlier head with no label was an empty turn: dropped
            head_index, head_time = str(int(s)), None
            continue
        times = _time_line(s, where)
        if times is not None:
            if head_time is not None:
                head_index = None
            head_time = times
            continue
        if head_index is not None or head_time is not None:
            raise TranscriptError(f"{where}: expected a **LABEL**: line, got {_snip(s)}")
        if not drafts:
            raise TranscriptError(
                f"{where}: expected an index, a [start --> end] time or a **LABEL**: line, got {_snip(s)}"
            )
        drafts[-1].lines.append(s)  # a text-only block continues the previous turn
        in_body = True
    return _build(cid, drafts, meta, meta["source"] or "", {}, "block number")


# --- JSON ---------------------------------------------------------------------------------------


def _timestamp(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:
            f = math.inf
        if math.isfinite(f) and f >= 0:
            return f
    elif isinstance(v, str):
        s = v.strip()
        if len(s) <= 32:
            if _SECONDS.fullmatch(s):
                return float(s)
            m = _CLOCK.fullmatch(s)
            if m:
                return _clock_seconds(*m.groups(), where)
    raise TranscriptError(f"{where}: timestamp must be seconds or HH:MM:SS")


def _from_json(obj: Any, cid: str | None, meta: dict[str, str | None]) -> Transcript:
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

    source = obj.get("source")
    if source is not None and not isinstance(source, str):
        raise TranscriptError("JSON source must be a string")

    raw_parts = obj.get("participants")
    participants: dict[str, str] = {}
    if raw_parts is not None:
        if not isinstance(raw_parts, dict):
            raise TranscriptError("JSON participants must be an object of id -> label")
        for k, v in raw_parts.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TranscriptError("JSON participants must map string ids to string labels")
            participants[k] = v

    turns = obj.get("turns")
    if not isinstance(turns, list):
        raise TranscriptError("JSON transcript has no 'turns' list")
    drafts: list[_Draft] = []
    for i, t in enumerate(turns):
        where = f"turns[{i}]"
        if not isinstance(t, dict):
            raise TranscriptError(f"{where}: a turn must be an object")
        speaker = t.get("speaker")
        if not isinstance(speaker, str) or not speaker.strip():
            raise TranscriptError(f"{where}: speaker must be a non-empty string")
        speaker = speaker.strip()
        if len(speaker) > MAX_LABEL_CHARS:
            raise TranscriptError(f"{where}: speaker longer than {MAX_LABEL_CHARS} characters")
        body = t.get("text")
        if body is None:
            body = ""
        if not isinstance(body, str):
            raise TranscriptError(f"{where}: text must be a string")
        turn_id = t.get("turn_id")
        if turn_id is not None:
            if isinstance(turn_id, bool) or not isinstance(turn_id, (str, int)):
                raise TranscriptError(f"{where}: turn_id must be a string or an integer")
            if isinstance(turn_id, int) and abs(turn_id) >= 10**18:
                raise TranscriptError(f"{where}: turn_id integer out of range")
            turn_id = str(turn_id).strip()
            if not turn_id:
                raise TranscriptError(f"{where}: turn_id is empty")
        lines = body.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        drafts.append(_Draft(speaker, where, lines, _timestamp(t.get("timestamp"), where), None, turn_id))
    return _build(
        cid, drafts, meta, source if source is not None else meta["source"] or "", participants, "turn_id"
    )
