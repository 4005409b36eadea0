"""The call archive: transcripts and their turns in SQLite, searchable through an FTS5 index, and
the execution ledger that says who starts each call's jobs (`ExecutionLedger`).

The listener owns these tables and their migrations (`MIGRATIONS`, plain `(package, version, sql)`
steps the service's store applies); the repository takes any database with the store's small async
interface (`Database`), so this package never imports the service. Every search result is external,
untrusted data and says so (`source_trust`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from listener.model import Transcript, Turn

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
    (PACKAGE, 4, """
    ALTER TABLE listener_jobs ADD COLUMN owner TEXT;
    ALTER TABLE listener_jobs ADD COLUMN claimed_at REAL;
    CREATE TABLE listener_steps (
        transcript_id INTEGER NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
        step          TEXT    NOT NULL,
        owner         TEXT    NOT NULL,
        claimed_at    REAL    NOT NULL,
        PRIMARY KEY (transcript_id, step)
    );
"""),
    # version 4: claims say who holds them and since when (several processes share the store): a
    # job slot claimed by a process that is gone is taken again; `listener_steps` holds who is
    # learning a call's facts or posting its card right now, so two listeners never do both twice
)


class Database(Protocol):
    """What the archive needs of the service's store (`common.store.Store` has exactly this)."""

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
                ((transcript_id, t.index, t.speaker, int(user_label is not None and t.speaker == user_label), t.text,
                  t.start_s, t.end_s, t.source_turn_id) for t in transcript.turns))  # a generator: no second copy
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
        if not 0 <= offset <= 10**9:
            raise ArchiveError("offset must be between 0 and 1000000000")
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


# -- the execution ledger: who starts each job, who does each step of a call ----------------------

STALE_CLAIM_S = 600.0  # a claim older than this is abandoned even when its owner still runs (a hung start)
STEPS = {"memory": "SELECT memory_status = 'done' FROM transcripts WHERE id = ?",
         "card": "SELECT card IS NOT NULL FROM transcripts WHERE id = ?"}


def process_owner() -> str:
    """A claim owner naming this process: `host:pid:?:nonce` (the shape of the runs service's owner
    tokens, so the composition root may pass one of those instead)."""
    return f"{socket.gethostname()}:{os.getpid()}:?:{secrets.token_hex(4)}"


def process_alive(owner: str) -> bool:
    """Whether the process named in a claim's owner still runs on this host. Another host's owner
    counts as gone: one SQLite file is never shared across hosts."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: `won` (this caller must do it now, and settle or release it), or
    `done` (the job slot has its run: `job_id`; the step is recorded), or neither: `holder` is
    doing it right now (another live process, or another task of this one)."""

    won: bool
    done: bool = False
    job_id: str | None = None
    holder: str | None = None


class ExecutionLedger:
    """Claims on job slots (`listener_jobs`: one row per review, callback and named command of a
    call) and on a call's steps (`listener_steps`: learning its facts, posting its card).

    A claim is read and taken inside one `BEGIN IMMEDIATE` transaction, so of any number of tasks
    and processes exactly one wins. It records its owner (this process) and time — the intent to
    start: a slot claimed but still without a run is taken again when its owner is gone (`alive`),
    when its owner is this ledger but no task of it is working on it (a start interrupted here), or
    after `STALE_CLAIM_S`. A slot with a run is never started again."""

    def __init__(self, db: Database, *, owner: str | None = None, alive: Callable[[str], bool] = process_alive,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.owner = owner or process_owner()
        self._alive = alive
        self._clock = clock
        self._holding: set[tuple[str, Any]] = set()  # claims this ledger's tasks are working on now

    def held_elsewhere(self, owner: str | None, since: float | None, what: tuple[str, Any]) -> bool:
        """Whether a claim by `owner` taken at `since` is being worked on right now by someone else."""
        if not owner or since is None or since < self._clock() - STALE_CLAIM_S:
            return False
        if owner == self.owner:
            return what in self._holding
        return self._alive(owner)

    async def claim_job(self, *, key: str, transcript_id: int, kind: str, label: str, deliver: str) -> Claim:
        """Claim a job slot: won (start it now, then `started` or `failed`), done (it has its run), or
        held by someone starting it right now."""
        claim = await self._claim_job(key, transcript_id, kind, label, deliver)
        if claim.won:  # after the commit, before any other task of this process can ask
            self._holding.add(("job", key))
        return claim

    async def _claim_job(self, key: str, transcript_id: int, kind: str, label: str, deliver: str) -> Claim:
        now = self._clock()
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT job_id, state, owner, claimed_at, created_at FROM listener_jobs "
                                    "WHERE dedupe_key = ?", (key,)) as cursor:
                row = await cursor.fetchone()
            if row is None:
                await conn.execute("INSERT INTO listener_jobs (dedupe_key, transcript_id, kind, label, deliver, "
                                   "created_at, state, owner, claimed_at) VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?, ?)",
                                   (key, transcript_id, kind, label[:200], deliver, now, self.owner, now))
                return Claim(True)
            if row["job_id"] is not None:
                return Claim(False, done=True, job_id=row["job_id"])
            if row["state"] == "claimed" and self.held_elsewhere(row["owner"], row["claimed_at"] or row["created_at"],
                                                                 ("job", key)):
                return Claim(False, holder=row["owner"])
            # never claimed by anyone alive: a start that failed, or one a crash or a stop left half-done
            await conn.execute("UPDATE listener_jobs SET state = 'claimed', owner = ?, claimed_at = ?, detail = '' "
                               "WHERE dedupe_key = ?", (self.owner, now, key))
            return Claim(True)

    async def started(self, key: str, job_id: str) -> None:
        """The slot's job is running as `job_id`; from now on the slot is done, whoever asks."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET job_id = ?, state = 'started', detail = '', owner = NULL "
                               "WHERE dedupe_key = ? AND job_id IS NULL", (job_id, key))
        self._holding.discard(("job", key))

    async def failed(self, key: str, detail: str) -> None:
        """This claim's start failed: the slot may be taken again (a later delivery retries it)."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET state = 'error', detail = ?, owner = NULL WHERE dedupe_key = ? "
                               "AND job_id IS NULL AND owner = ?", (detail[:300], key, self.owner))
        self._holding.discard(("job", key))

    async def job_ids(self, transcript_id: int) -> list[str]:
        """Every job that truly started for this call (a run exists), in the order they were claimed."""
        rows = await self.db.fetchall(
            "SELECT job_id FROM listener_jobs WHERE transcript_id = ? AND job_id IS NOT NULL ORDER BY rowid",
            (transcript_id,))
        return [row["job_id"] for row in rows]

    async def claim_step(self, transcript_id: int, step: str) -> Claim:
        """Claim a call's `step` ("memory", "card"): won (do it, then `release_step`), done (the
        archive records it as done), or held by someone doing it right now."""
        claim = await self._claim_step(transcript_id, step)
        if claim.won:
            self._holding.add((step, transcript_id))
        return claim

    async def _claim_step(self, transcript_id: int, step: str) -> Claim:
        now = self._clock()
        async with self.db.transaction() as conn:
            async with conn.execute(STEPS[step], (transcript_id,)) as cursor:
                done = await cursor.fetchone()
            if done is not None and done[0]:
                return Claim(False, done=True)
            async with conn.execute("SELECT owner, claimed_at FROM listener_steps WHERE transcript_id = ? AND "
                                    "step = ?", (transcript_id, step)) as cursor:
                row = await cursor.fetchone()
            if row is not None and self.held_elsewhere(row["owner"], row["claimed_at"], (step, transcript_id)):
                return Claim(False, holder=row["owner"])
            await conn.execute("INSERT INTO listener_steps (transcript_id, step, owner, claimed_at) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT (transcript_id, step) DO UPDATE SET owner = excluded.owner, "
                               "claimed_at = excluded.claimed_at", (transcript_id, step, self.owner, now))
            return Claim(True)

    async def card_posted(self, transcript_id: int, reference: str) -> None:
        """Record the call's card (unless the notifier already did) and let go of the card's claim."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET card = COALESCE(card, ?) WHERE id = ?", (reference, transcript_id))
            await conn.execute("DELETE FROM listener_steps WHERE transcript_id = ? AND step = 'card' AND owner = ?",
                               (transcript_id, self.owner))
        self._holding.discard(("card", transcript_id))

    async def release_step(self, transcript_id: int, step: str) -> None:
        """Done with `step` (recorded in the archive, or failed: the next delivery may claim it)."""
        if (step, transcript_id) not in self._holding:
            return  # let go already (`card_posted`)
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM listener_steps WHERE transcript_id = ? AND step = ? AND owner = ?",
                               (transcript_id, step, self.owner))
        self._holding.discard((step, transcript_id))
