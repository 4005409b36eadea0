"""The call archive: transcripts and their turns, searchable through an FTS5 index.

`Archive` stores a parsed call once, loads it back, searches its turns and shows one call whole; its
tables, their migrations and every statement on them are in `listener.repository`. Every search
result is external, untrusted data and says so (`source_trust`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from listener.model import Transcript, Turn
from listener.repository import Database, FactRepository, JobRepository, TranscriptRepository

SOURCE_TRUST = "external-untrusted"
MAX_LIMIT = 100


class ArchiveError(ValueError):
    """A search or lookup the archive cannot answer; the message says what to change."""


@dataclass(frozen=True)
class Archived:
    transcript_id: int
    created: bool  # False: this conversation was already archived (a replayed event)


_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(text: str) -> str:
    """The user's words as an FTS5 query that matches turns holding all of them (each word quoted:
    FTS5 operators, columns and parentheses in the input are never interpreted)."""
    words = _WORD.findall(text or "")
    if not words:
        raise ArchiveError("the search has no words; try a name, a number or a phrase from the call")
    return " ".join(f'"{w}"' for w in words[:32])


class Archive:
    """Archived calls: stored once, loaded back as parsed, searched, shown whole (`db` is the store
    every listener service shares)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._transcripts = TranscriptRepository(db)
        self._jobs = JobRepository(db)
        self._facts = FactRepository(db)

    async def archive(self, transcript: Transcript, raw: str, *, received_at: float,
                      user_label: str | None) -> Archived:
        """Store a transcript and its turns in one transaction; a known conversation is left as it was."""
        return Archived(*await self._transcripts.insert(transcript, raw, received_at=received_at,
                                                        user_label=user_label))

    async def load(self, transcript_id: int) -> tuple[Transcript, str | None]:
        """The archived call as the model it was stored from, and its user label — what every later step
        works from, so a redelivery carrying other text can never act on words that were not archived."""
        row = await self._transcripts.get(transcript_id)
        if row is None:
            raise ArchiveError(f"no archived call {transcript_id}")
        turns = await self._transcripts.turns(transcript_id)
        return Transcript(row["conversation_id"], tuple(
            Turn(t["turn_index"], t["speaker"], t["text"], t["start_s"], t["end_s"], t["source_turn_id"]) for t in turns),
            source=row["source"], direction=row["direction"], from_number=row["from_number"],
            to_number=row["to_number"], participants=json.loads(row["participants"] or "{}")), row["user_label"]

    async def search(self, query: str, *, conversation_id: str | None = None, speaker: str | None = None,
                     direction: str | None = None, number: str | None = None, since: float | None = None,
                     until: float | None = None, user_only: bool = False, limit: int = 20,
                     offset: int = 0) -> dict[str, Any]:
        """Turns matching all the query's words, best match first, paginated (`next_offset` is None on
        the last page). Filters narrow by call, speaker label, direction, either phone number, time."""
        if not 1 <= limit <= MAX_LIMIT:
            raise ArchiveError(f"limit must be between 1 and {MAX_LIMIT}")
        if not 0 <= offset <= 10**9:
            raise ArchiveError("offset must be between 0 and 1000000000")
        rows = await self._transcripts.search_turns(
            fts_query(query), conversation_id=conversation_id, speaker=speaker, direction=direction, number=number,
            since=since, until=until, user_only=user_only, limit=limit + 1, offset=offset)
        page = [_result(r) for r in rows[:limit]]
        return {"source_trust": SOURCE_TRUST, "query": query, "results": page, "offset": offset,
                "next_offset": offset + limit if len(rows) > limit else None}

    async def show(self, ref: str | int) -> dict[str, Any]:
        """One archived call by archive id or conversation id, with every turn."""
        row = None
        text = str(ref).strip().lstrip("#")
        if isinstance(ref, int) and 0 < ref < 1 << 62 or text.isascii() and text.isdigit() and len(text) <= 18:
            row = await self._transcripts.get(int(text))
        if row is None:
            row = await self._transcripts.by_conversation(str(ref))
        if row is None:
            raise ArchiveError(f"no archived call {ref!r}; `switchboard transcripts search WORDS` finds calls")
        turns = await self._transcripts.turns(row["id"])
        jobs = await self._jobs.of_call(row["id"])
        facts = await self._facts.of_call(row["id"])
        return {"source_trust": SOURCE_TRUST, "id": row["id"], "conversation_id": row["conversation_id"],
                "source": row["source"], "direction": row["direction"], "from": row["from_number"],
                "to": row["to_number"], "user_label": row["user_label"], "received_at": row["received_at"],
                "review_status": row["review_status"], "review": row["review"], "memory_status": row["memory_status"],
                "facts": [{"fact": f["fact"], "turn": f["assertion_turn"] + 1,
                           "confirmed_in_turn": None if f["confirmation_turn"] is None else f["confirmation_turn"] + 1}
                          for f in facts],
                "jobs": [{"kind": j["kind"], "label": j["label"], "job_id": j["job_id"], "state": j["state"],
                          "detail": j["detail"], "delivered": j["delivered"]} for j in jobs],
                "turns": [{"index": t["turn_index"], "speaker": t["speaker"], "is_user": bool(t["is_user"]),
                           "text": t["text"], "start_s": t["start_s"], "end_s": t["end_s"],
                           "source_turn_id": t["source_turn_id"]} for t in turns]}

    async def review_of(self, transcript_id: int) -> str | None:
        """The call's review: its review run's output, or its error when the run failed (None: no
        review has landed yet, or there is no such call)."""
        return await self._transcripts.review_of(transcript_id)

    async def received_at(self, transcript_id: int) -> float | None:
        """When the call was first archived (None: no such call)."""
        return await self._transcripts.received_at(transcript_id)

    async def queue_review(self, transcript_id: int, status: str) -> None:
        """Set the call's review state, never over a review that has already landed."""
        await self._transcripts.queue_review(transcript_id, status)


def _result(row: Any) -> dict[str, Any]:
    return {"transcript_id": row["transcript_id"], "conversation_id": row["conversation_id"],
            "direction": row["direction"], "from": row["from_number"], "to": row["to_number"],
            "received_at": row["received_at"], "turn_index": row["turn_index"], "speaker": row["speaker"],
            "is_user": bool(row["is_user"]), "text": row["text"]}
