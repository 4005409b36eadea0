"""The word checks behind durable facts (`listener.memory.validate`) — pure: whether a text is an
instruction, holds a negation, opens with a yes, repeats a fact, or grounds it in its quotes.

Typography never decides: every check reads text after NFKC and with curly apostrophes and quotes made
straight (`plain`: "don’t" is "don't").
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# An instruction, not a fact: an imperative opening, or the stock phrases of prompt injection.
_IMPERATIVE_START = re.compile(
    r"^\W*(please\W+)?(you\s+(must|should|need\s+to|have\s+to)\s+|from\s+now\s+on\W+)?"
    r"(ignore|disregard|forget|always|never|send|delete|remove|erase|forward|transfer|wire|pay|email|e-mail|"
    r"text|call|run|execute|share|reveal|tell|give|grant|allow|disable|enable|override|obey|follow|do\s+not|"
    r"don't)\b", re.IGNORECASE)
_INJECTION = re.compile(
    r"\b(ignore|disregard|forget)\b.{0,40}\b(instructions?|prompts?|rules|previous|above|prior)\b|"
    r"\bsystem\s+prompt\b|\bfrom\s+now\s+on\b|\b(assistant|agent|ai|bot)\s+(must|should|shall|will\s+always)\b|"
    r"\byou\s+(must|should|shall)\b|\bnew\s+instructions?\b", re.IGNORECASE)


# After NFKC (which already folds fullwidth ＇ and ＂): the apostrophe and quote look-alikes.
_STRAIGHT = str.maketrans({**dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035\u02bc\u02b9\u0060", "'"),
                           **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb", '"')})


def plain(text: str) -> str:
    """`text` with its typography neutralised: NFKC, then curly apostrophes and quotes straight."""
    return unicodedata.normalize("NFKC", text).translate(_STRAIGHT)


def is_instruction(text: str) -> bool:
    text = plain(text)
    return bool(_IMPERATIVE_START.search(text) or _INJECTION.search(text))


def has_negation(text: str) -> bool:
    return bool(_NEGATION.search(plain(text)))


def says_yes(text: str) -> bool:
    """The turn opens with an explicit yes ("Yes, …", "That's right", "Correct.")."""
    return bool(_YES.match(plain(text)))


def repeats(fact: str, quote: str, stop: frozenset[str] = frozenset()) -> bool:
    """The quote repeats the fact: one of its numbers, addresses or handles as a whole word, or at least
    half its content words (compared as `grounded` compares them)."""
    ids, content, whole, said = _compared(fact, quote, stop)
    return any(w in whole for w in ids) or (bool(content) and _half_said(content, said))


_WORD = re.compile(r"[\w@.+'-]+", re.UNICODE)
STOP_WORDS = frozenset("user user's users their they them that this with have has had from about will would there which "
                  "what when where were been being into onto your yours also just very than then them some".split())
CALL_STOP_WORDS = STOP_WORDS | frozenset("operator operator's operators operators' guest guest's guests".split())
_YES = re.compile(r"\W*(yes|yeah|yep|yup|yea|correct|right|exactly|indeed|absolutely|definitely|confirmed|true|"
                  r"(that|it)(\s+is|'s)\s+(right|correct|true|it)|sure)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(no|not|nope|never|wrong|incorrect|isn't|wasn't|aren't|don't|doesn't|didn't|can't|won't|"
                       r"nah|neither|nor)\b|n't\b", re.IGNORECASE)


def _words(text: str) -> list[str]:
    return [w.strip(".'-").casefold() for w in _WORD.findall(plain(text)) if w.strip(".'-")]


def grounded(fact: str, quotes: str, stop: frozenset[str] = STOP_WORDS) -> bool:
    """The fact says what its quotes say: every number, address or handle in it (anything with a digit
    or an @) is a whole word of them, and at least half its content words (not in `stop`: how facts
    name the trusted speakers) are (compared on their first 5 letters)."""
    ids, content, whole, said = _compared(fact, quotes, stop)
    return all(w in whole for w in ids) and (not content or _half_said(content, said))


def _compared(fact: str, quotes: str, stop: frozenset[str]) -> tuple[list[str], list[str], set[str], set[str]]:
    """The fact's identifiers (words with a digit or an @) and content words (4+ letters, no digit, not in `stop`),
    and the quotes' whole words and their first 5 letters."""
    words, quoted_words = _words(fact), _words(quotes)
    ids = [w for w in words if any(c.isdigit() for c in w) or "@" in w]
    content = [w for w in words if len(w) >= 4 and w not in stop and not any(c.isdigit() for c in w)]
    return ids, content, set(quoted_words), {w[:5] for w in quoted_words}


def _half_said(content: list[str], said: set[str]) -> bool:
    return sum(w[:5] in said for w in content) * 2 >= len(content)


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def quoted(quote: Any, text: str, minimum: int) -> bool:
    return isinstance(quote, str) and len(quote.strip()) >= minimum and _norm(quote) in _norm(text)
