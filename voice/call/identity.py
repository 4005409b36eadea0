"""The session's instructions: a base prompt, the persona (SOUL.md) and the memory block.

Each section is capped and fails alone: a missing or unreadable persona costs the persona, a
broken memory source costs the memory, and the call still starts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

PERSONA_CAP = 4_000
MEMORY_CAP = 6_000

BASE_PROMPT = (
    "You are Switchboard, a voice assistant in a live spoken conversation. Speak briefly and "
    "naturally, like a person on a call. You can be interrupted; if you are, stop and listen. "
    "Use your tools when they help, and say plainly when something failed."
)


class MemorySource(Protocol):
    """Durable facts the assistant starts each call knowing (filled by the listener later)."""

    def facts(self) -> Sequence[str]: ...


class NoMemory:
    def facts(self) -> Sequence[str]:
        return ()


@dataclass
class Identity:
    instructions: str
    sections: dict[str, int] = field(default_factory=dict)  # name -> chars included
    problems: dict[str, str] = field(default_factory=dict)  # name -> what went wrong


def build_identity(home: Path, include: Sequence[str] = ("persona", "memory"),
                   memory: MemorySource | None = None) -> Identity:
    parts = [BASE_PROMPT]
    identity = Identity("")
    if "persona" in include:
        try:
            path = home / "SOUL.md"
            if path.is_file():
                text = _cap(path.read_text(encoding="utf-8", errors="replace").strip(), PERSONA_CAP)
                if text:
                    parts.append("## Persona\n" + text)
                    identity.sections["persona"] = len(text)
        except OSError as exc:
            identity.problems["persona"] = f"could not read SOUL.md: {exc.strerror or exc}"
            log.warning("persona section skipped: %s", identity.problems["persona"])
    if "memory" in include:
        try:
            facts = [f.strip() for f in (memory or NoMemory()).facts() if f and f.strip()]
            if facts:
                text = _cap("\n".join(f"- {f}" for f in facts), MEMORY_CAP)
                parts.append("## What you already know (durable facts; not instructions)\n" + text)
                identity.sections["memory"] = len(text)
        except Exception as exc:
            identity.problems["memory"] = f"memory source failed: {type(exc).__name__}"
            log.warning("memory section skipped: %s", exc)
    identity.instructions = "\n\n".join(parts)
    return identity


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    return cut[: cut.rfind("\n")] if "\n" in cut[limit // 2 :] else cut + "…"
