"""The call archive: transcripts and their turns in SQLite, searchable through an FTS5 index.

The listener owns these tables and their migrations (`MIGRATIONS`, plain `(package, version, sql)`
steps the service's store applies); the repository takes any database with the store's small async
interface (`Database`), so this package never imports the service. Every search result is external,
untrusted data and says so (`source_trust`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from .model import Transcript, Turn

PACKAGE = "listener"
SOURCE_TRUST = "external-untrusted"
MAX_LIMIT = 100

MIGRATIONS: tuple[tuple[str, int, str], ...] = ((PACKAGE, 1, """
    CREATE TABLE transcripts (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT    NOT NULL UNIQUE,
        source          TEXT    NOT NULL DEFAULT '',
        direction       TEXT,
        from_number     TEXT,
        to_number       TEXT,
        user_label      TEXT,
        participants    TEXT    NOT NULL DEFAULT '{}',
        raw             TEXT    NOT NULL,
        received_at     REAL    NOT NULL,
        review_status   TEXT    NOT NULL DEFAULT 'none'
    );
    CREATE INDEX transcripts_by_time ON transcripts (received_at);
    CREATE TABLE transcript_turns (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
        transcript_id  INTEGER NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
        turn_index     INTEGER NOT NULL,
        speaker        TEXT    NOT NULL,
        is_user        INTEGER NOT NULL DEFAULT 0,
        text           TEXT    NOT NULL,
        start_s        REAL,
        end_s          REAL,
        source_turn_id TEXT,
        UNIQUE (transcript_id, turn_index)
    );
    CREATE VIRTUAL TABLE transcript_turns_fts USING fts5(
        text, content='transcript_turns', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
    -- new turns are indexed in bulk by Archive.archive, in the same transaction (twice as fast as a
    -- row trigger); deletes and edits keep the index in step through triggers
    CREATE TRIGGER transcript_turns_ad AFTER DELETE ON transcript_turns BEGIN
        INSERT INTO transcript_turns_fts (transcript_turns_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    CREATE TRIGGER transcript_turns_au AFTER UPDATE OF text ON transcript_turns BEGIN
        INSERT INTO transcript_turns_fts (transcript_turns_fts, rowid, text) VALUES ('delete', old.id, old.text);
        INSERT INTO transcript_turns_fts (rowid, text) VALUES (new.id, new.text);
    END;
"""), (PACKAGE, 2, """
    CREATE TABLE listener_jobs (
        dedupe_key    TEXT    PRIMARY KEY,
        transcript_id INTEGER NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
        kind          TEXT    NOT NULL,
        job_id        TEXT,
        state         TEXT    NOT NULL DEFAULT 'claimed',
        detail        TEXT    NOT NULL DEFAULT '',
        created_at    REAL    NOT NULL
    );
    CREATE INDEX listener_jobs_by_transcript ON listener_jobs (transcript_id);
"""),
    # version 2: the execution ledger — one row per job slot (a named command's dedupe key), claimed
    # before its job starts, so a replayed event never dispatches twice
    (PACKAGE, 3, """
    ALTER TABLE transcripts ADD COLUMN memory_status TEXT NOT NULL DEFAULT 'none';
    ALTER TABLE transcripts ADD COLUMN review TEXT;
    ALTER TABLE transcripts ADD COLUMN card TEXT;
    ALTER TABLE listener_jobs ADD COLUMN label TEXT NOT NULL DEFAULT '';
    ALTER TABLE listener_jobs ADD COLUMN deliver TEXT NOT NULL DEFAULT '';
    ALTER TABLE listener_jobs ADD COLUMN delivered TEXT;
    CREATE INDEX listener_jobs_by_job ON listener_jobs (job_id);
    CREATE TABLE listener_callbacks (
        id           TEXT    PRIMARY KEY,
        name         TEXT    NOT NULL,
        instructions TEXT    NOT NULL,
        enabled      INTEGER NOT NULL DEFAULT 1,
        deliver      TEXT    NOT NULL DEFAULT '',
        revision     INTEGER NOT NULL DEFAULT 1,
        created_at   REAL    NOT NULL,
        updated_at   REAL    NOT NULL
    );
    CREATE TABLE listener_tokens (
        token_hash TEXT PRIMARY KEY,
        job_key    TEXT NOT NULL,
        expires_at REAL NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE listener_facts (
        id                INTEGER PRIMARY KEY AUTOINCREMENT,
        transcript_id     INTEGER NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
        fact              TEXT    NOT NULL,
        quote             TEXT    NOT NULL,
        assertion_turn    INTEGER NOT NULL,
        speaker           TEXT    NOT NULL,
        confirmation_turn INTEGER,
        created_at        REAL    NOT NULL,
        UNIQUE (transcript_id, fact)
    );
    CREATE VIRTUAL TABLE listener_facts_fts USING fts5(
        fact, content='listener_facts', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
    CREATE TRIGGER listener_facts_ai AFTER INSERT ON listener_facts BEGIN
        INSERT INTO listener_facts_fts (rowid, fact) VALUES (new.id, new.fact);
    END;
    CREATE TRIGGER listener_facts_ad AFTER DELETE ON listener_facts BEGIN
        INSERT INTO listener_facts_fts (listener_facts_fts, rowid, fact) VALUES ('delete', old.id, old.fact);
    END;
"""),
    # version 3: what comes after archiving — each call's memory state, review and Discord card; the
    # ledger names each job and where its result goes; callbacks (the default review is the callback
    # `default-review`); callback-mutation tokens (hashes only); durable facts with their provenance
)


class Database(Protocol):
    """What the archive needs of the service's store (`bot.store.Store` has exactly this)."""

    def transaction(self) -> AbstractAsyncContextManager[Any]: ...
    async def fetchone(self, sql: str, params: Sequence = ()) -> Any: ...
    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Any]: ...


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
    def __init__(self, db: Database) -> None:
        self.db = db

    async def archive(self, transcript: Transcript, raw: str, *, received_at: float,
                      user_label: str | None) -> Archived:
        """Store a transcript and its turns in one transaction; a known conversation is left as it was."""
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT id FROM transcripts WHERE conversation_id = ?",
                                    (transcript.conversation_id,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                return Archived(int(row[0]), False)
            cursor = await conn.execute(
                "INSERT INTO transcripts (conversation_id, source, direction, from_number, to_number, user_label, "
                "participants, raw, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (transcript.conversation_id, transcript.source, transcript.direction, transcript.from_number,
                 transcript.to_number, user_label, json.dumps(transcript.participants), raw, received_at))
            transcript_id = int(cursor.lastrowid)
            await conn.executemany(
                "INSERT INTO transcript_turns (transcript_id, turn_index, speaker, is_user, text, start_s, end_s, "
                "source_turn_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(transcript_id, t.index, t.speaker, int(user_label is not None and t.speaker == user_label), t.text,
                  t.start_s, t.end_s, t.source_turn_id) for t in transcript.turns])
            await conn.execute("INSERT INTO transcript_turns_fts (rowid, text) SELECT id, text FROM transcript_turns "
                               "WHERE transcript_id = ?", (transcript_id,))
        return Archived(transcript_id, True)

    async def load(self, transcript_id: int) -> tuple[Transcript, str | None]:
        """The archived call as the model it was stored from, and its user label — what every later step
        works from, so a redelivery carrying other text can never act on words that were not archived."""
        row = await self.db.fetchone("SELECT * FROM transcripts WHERE id = ?", (transcript_id,))
        if row is None:
            raise ArchiveError(f"no archived call {transcript_id}")
        turns = await self.db.fetchall(
            "SELECT turn_index, speaker, text, start_s, end_s, source_turn_id FROM transcript_turns WHERE "
            "transcript_id = ? ORDER BY turn_index", (transcript_id,))
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
        if offset < 0:
            raise ArchiveError("offset must be 0 or more")
        where, params = ["transcript_turns_fts MATCH ?"], [fts_query(query)]
        for clause, value in (("t.conversation_id = ?", conversation_id), ("u.speaker = ?", speaker),
                              ("t.direction = ?", direction), ("t.received_at >= ?", since),
                              ("t.received_at < ?", until)):
            if value is not None:
                where.append(clause)
                params.append(value)
        if number is not None:
            where.append("(t.from_number = ? OR t.to_number = ?)")
            params += [number, number]
        if user_only:
            where.append("u.is_user = 1")
        rows = await self.db.fetchall(
            "SELECT t.id AS transcript_id, t.conversation_id, t.direction, t.from_number, t.to_number, t.received_at, "
            "u.turn_index, u.speaker, u.is_user, u.text "
            "FROM transcript_turns_fts JOIN transcript_turns u ON u.id = transcript_turns_fts.rowid "
            "JOIN transcripts t ON t.id = u.transcript_id "
            f"WHERE {' AND '.join(where)} ORDER BY bm25(transcript_turns_fts), u.id LIMIT ? OFFSET ?",
            (*params, limit + 1, offset))
        page = [_result(r) for r in rows[:limit]]
        return {"source_trust": SOURCE_TRUST, "query": query, "results": page, "offset": offset,
                "next_offset": offset + limit if len(rows) > limit else None}

    async def show(self, ref: str | int) -> dict[str, Any]:
        """One archived call by archive id or conversation id, with every turn."""
        row = None
        text = str(ref).strip().lstrip("#")
        if isinstance(ref, int) and 0 < ref < 1 << 62 or text.isascii() and text.isdigit() and len(text) <= 18:
            row = await self.db.fetchone("SELECT * FROM transcripts WHERE id = ?", (int(text),))
        if row is None:
            row = await self.db.fetchone("SELECT * FROM transcripts WHERE conversation_id = ?", (str(ref),))
        if row is None:
            raise ArchiveError(f"no archived call {ref!r}; `switchboard transcripts search WORDS` finds calls")
        turns = await self.db.fetchall(
            "SELECT turn_index, speaker, is_user, text, start_s, end_s, source_turn_id FROM transcript_turns "
            "WHERE transcript_id = ? ORDER BY turn_index", (row["id"],))
        jobs = await self.db.fetchall(
            "SELECT kind, label, job_id, state, detail, delivered FROM listener_jobs WHERE transcript_id = ? "
            "ORDER BY rowid", (row["id"],))
        facts = await self.db.fetchall("SELECT fact, assertion_turn, confirmation_turn FROM listener_facts WHERE "
                                       "transcript_id = ? ORDER BY id", (row["id"],))
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


def _result(row: Any) -> dict[str, Any]:
    return {"transcript_id": row["transcript_id"], "conversation_id": row["conversation_id"],
            "direction": row["direction"], "from": row["from_number"], "to": row["to_number"],
            "received_at": row["received_at"], "turn_index": row["turn_index"], "speaker": row["speaker"],
            "is_user": bool(row["is_user"]), "text": row["text"]}
