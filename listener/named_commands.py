"""Named call commands: the user speaker directly addressing the agent by name in a transcript.

Pure: no I/O, no clock. Transcript text is untrusted; a command only ever comes from a turn whose
speaker equals the locally configured `user_label` (None -> nobody is the user -> no commands).

A *direct address* is one of the agent's names — its full name, the full name's first word, or a
configured alias (case-insensitive, whole words, any run of whitespace between a name's words; the
longest name wins, so "Hey Ares Agent, ..." addresses "Ares Agent") — that is either

- followed by `,` `:` `;` an en/em dash, or a `-` that is not part of a hyphenated word
  ("Ares - add that", not "Ares-based"), or
- preceded by `hey` / `ok` / `okay`, optionally followed by such punctuation ("hey Ares book it").

Rules decided here where the design is silent:

- **Clause-initial only.** The address (including its hey/ok/okay) must open the turn, a line, or a
  clause: what precedes it, ignoring whitespace, is nothing, a newline, or one of `. ! ? , ; : … -`
  and the en/em dash. So "I told Ares, and he agreed", "I said okay Ares is fine" and
  "they said 'Ares, ...'" never count; a miss is the safe failure for something that grants
  authority. A possessive ("Ares's") or a hyphenated word ("Ares-based", "anti-Ares") is not a
  whole-word match.
- A command's text runs from after the address and its punctuation to the start of the next direct
  address in the turn (or the end of the turn), with surrounding whitespace and trailing `, ; : -`
  dashes trimmed; it is verbatim (`turn.text[start:end]`). An address whose text has no letter or
  digit is not a command ("Ares," / "Hey Ares." / "Ares, Ares, book it" -> one command).
- `ordinal` is the position of the address among the turn's direct addresses (0-based), counting
  the ones that carried no command, so it is the "address ordinal" the dedupe key is built from.
- `dedupe_key` is a compact JSON array `[conversation_id, "turn_id", id, ordinal]` when the turn has
  a source id, else `[conversation_id, "index", index, ordinal]` — unambiguous (a turn id "5" never
  collides with index 5, a ":" in an id cannot shift fields) and stable across re-parses.
- Aliases are matched as written; only the full agent name contributes its first word.
- In a transcript's turns, apostrophe look-alikes (’ ‘ ʼ ′ ＇) count as `'`: typography never makes
  a possessive into an address. (`addresses_agent`, the voice call's check, reads text as given.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from listener.model import Transcript, Turn

__all__ = ["CallCommand", "addresses_agent", "command_dedupe_key", "find_commands", "is_command_span"]

_DASHES = "\u2013\u2014"  # en dash, em dash
_ADDRESS_PUNCT = ",:;" + _DASHES  # plus "-" when not inside a hyphenated word
_SKIP = set(_ADDRESS_PUNCT + "-")
_TRAILING = set(",;:-" + _DASHES)
_BOUNDARY = set(".!?,;:\u2026-" + _DASHES)
_LEADS = ("hey", "okay", "ok")
_APOSTROPHES = str.maketrans(dict.fromkeys("\u2018\u2019\u201b\u02bc\u2032\uff07", "'"))


@dataclass(frozen=True)
class CallCommand:
    """One named command. `text` is verbatim: `turn.text[start:end] == text`."""

    conversation_id: str
    turn_index: int
    source_turn_id: str | None
    ordinal: int  # the address's position among the turn's direct addresses, 0-based
    address: str  # the name as written in the turn, e.g. "Ares Agent"
    text: str
    start: int
    end: int
    dedupe_key: str


def command_dedupe_key(conversation_id: str, turn: Turn, ordinal: int) -> str:
    if turn.source_turn_id is not None:
        parts: list[object] = [conversation_id, "turn_id", turn.source_turn_id, ordinal]
    else:
        parts = [conversation_id, "index", turn.index, ordinal]
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))


def is_command_span(candidate: str, command: CallCommand) -> bool:
    """True when `candidate` (a model's trimmed span) is a non-empty substring of the detected
    command text; "non-empty" means it holds at least one letter or digit."""
    return isinstance(candidate, str) and any(ch.isalnum() for ch in candidate) and candidate in command.text


def _names(agent_name: str, aliases: Sequence[str]) -> tuple[str, ...]:
    full = " ".join(agent_name.split()) if isinstance(agent_name, str) else ""
    if not full:
        raise ValueError("agent_name must be a non-empty name")
    if isinstance(aliases, str):
        raise TypeError("aliases must be a sequence of names, not a string")
    candidates = [full, full.split()[0], *(" ".join(str(a).split()) for a in aliases)]
    seen: dict[str, str] = {}
    for name in candidates:
        key = name.casefold()
        if name and key not in _LEADS and key not in seen:
            seen[key] = name
    return tuple(sorted(seen.values(), key=lambda n: (-len(n.split()), -len(n))))


@lru_cache(maxsize=64)
def _pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    alts = "|".join(r"\s+".join(re.escape(w) for w in n.split()) for n in names)
    lead = r"(?P<lead>hey|okay|ok)(?![\w'])[\s,:;\-" + _DASHES + r"]*"
    # whole words: not inside a word, a possessive ("Ares's") or a hyphenated word ("Ares-based")
    return re.compile(rf"(?<!\w)(?<!\w-)(?:{lead})?(?P<name>{alts})(?![\w]|['-]\w)", re.IGNORECASE)


def _clause_start(text: str, pos: int) -> bool:
    """Nothing but whitespace between `pos` and the start of the text, a newline, or a boundary
    punctuation mark. The backward scan crosses only whitespace, so all scans together are linear."""
    i = pos - 1
    while i >= 0:
        ch = text[i]
        if ch == "\n":
            return True
        if not ch.isspace():
            return ch in _BOUNDARY
        i -= 1
    return True


def _punct_follows(text: str, pos: int) -> bool:
    n = len(text)
    i = pos
    while i < n and text[i].isspace():
        i += 1
    if i >= n:
        return False
    if text[i] in _ADDRESS_PUNCT:
        return True
    return text[i] == "-" and not (i + 1 < n and (text[i + 1].isalnum() or text[i + 1] == "_"))


def _addresses(text: str, pattern: re.Pattern[str]) -> list[tuple[int, int, int]]:
    """Direct addresses in `text` as (address start, name start, name end)."""
    found = []
    for m in pattern.finditer(text):
        name_start, name_end = m.span("name")
        if m.group("lead") is not None and _clause_start(text, m.start()):
            found.append((m.start(), name_start, name_end))
        elif _clause_start(text, name_start) and _punct_follows(text, name_end):
            found.append((name_start, name_start, name_end))
    return found


def _turn_commands(transcript: Transcript, turn: Turn, pattern: re.Pattern[str]) -> list[CallCommand]:
    text = turn.text
    # An apostrophe look-alike reads as "'" ("okay Ares’s idea" is a possessive, not an address);
    # one character for one, so every position found is a position in the turn's own text.
    found = _addresses(text.translate(_APOSTROPHES), pattern)
    out = []
    for ordinal, (_, name_start, name_end) in enumerate(found):
        stop = found[ordinal + 1][0] if ordinal + 1 < len(found) else len(text)
        start = name_end
        while start < stop and (text[start].isspace() or text[start] in _SKIP):
            start += 1
        end = stop
        while end > start and (text[end - 1].isspace() or text[end - 1] in _TRAILING):
            end -= 1
        body = text[start:end]
        if not any(ch.isalnum() for ch in body):
            continue
        out.append(
            CallCommand(
                conversation_id=transcript.conversation_id,
                turn_index=turn.index,
                source_turn_id=turn.source_turn_id,
                ordinal=ordinal,
                address=text[name_start:name_end],
                text=body,
                start=start,
                end=end,
                dedupe_key=command_dedupe_key(transcript.conversation_id, turn, ordinal),
            )
        )
    return out


def find_commands(
    transcript: Transcript,
    *,
    user_label: str | None,
    agent_name: str,
    aliases: Sequence[str] = (),
) -> list[CallCommand]:
    """Every named command in the user speaker's turns, in transcript order."""
    if user_label is None:
        return []
    pattern = _pattern(_names(agent_name, aliases))
    out: list[CallCommand] = []
    for turn in transcript.turns:
        if turn.speaker == user_label:
            out.extend(_turn_commands(transcript, turn, pattern))
    return out


def addresses_agent(text: str, *, agent_name: str, aliases: Sequence[str] = ()) -> bool:
    """True when `text` directly addresses the agent by name, by the same rule as a named command
    (see the module docstring): a voice call's addressed-only mode answers exactly such turns."""
    if not isinstance(text, str) or not text:
        return False
    return bool(_addresses(text.translate(_APOSTROPHES), _pattern(_names(agent_name, aliases))))
