"""The listener's tables, their migrations, and every SQL statement on them.

`MIGRATIONS` are plain `(package, version, sql)` steps the service's store applies; the repositories
take any database with the store's small async interface (`Database`), so this package never imports
the service. One repository a group of tables, all over the same database:

- `TranscriptRepository`: archived calls and their turns (`transcripts`, `transcript_turns`, the
  FTS5 index), with each call's review and memory state;
- `JobRepository`: the execution ledger — job slots (`listener_jobs`), a call's steps in progress
  (`listener_steps`) — each call's card, and where each job's result has gone (`delivered`:
  `WAITING`, `POSTING`…), the card and the results it releases changed together;
- `CallbackRepository`: the user's post-call callbacks (`listener_callbacks`);
- `TokenRepository`: callback-mutation tokens, hashes only (`listener_tokens`);
- `FactRepository`: durable facts with their provenance — a phone call's or a Discord call's —
  (`listener_facts` and its FTS5 index), and the Discord calls already debriefed (`listener_debriefs`).

A method that must be atomic across processes is one `BEGIN IMMEDIATE` transaction (the store's
`transaction()`) or one statement (`execute`); a read-decide-write takes the decision as a callable,
run inside the transaction. The plain
functions at the end read through a synchronous `sqlite3.Connection` (`switchboard doctor` opens one
read-only). Rules — what a claim is, what is valid, how a search is worded — live in the domain
modules that call these.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from listener.model import Fact, Transcript

PACKAGE = "listener"

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
    (PACKAGE, 5, """
    CREATE TABLE listener_facts_v5 (
        id                 INTEGER PRIMARY KEY AUTOINCREMENT,
        transcript_id      INTEGER REFERENCES transcripts (id) ON DELETE CASCADE,
        guild_id           INTEGER,
        call_id            INTEGER,
        fact               TEXT    NOT NULL,
        quote              TEXT    NOT NULL,
        assertion_turn     INTEGER NOT NULL,
        speaker            TEXT    NOT NULL,
        confirmation_turn  INTEGER,
        confirmed_by       TEXT,
        confirmation_quote TEXT,
        created_at         REAL    NOT NULL,
        UNIQUE (transcript_id, fact),
        UNIQUE (call_id, fact),
        CHECK ((transcript_id IS NULL) <> (call_id IS NULL)),
        CHECK ((call_id IS NULL) = (guild_id IS NULL))
    );
    INSERT INTO listener_facts_v5 (id, transcript_id, fact, quote, assertion_turn, speaker, confirmation_turn,
                                   created_at)
        SELECT id, transcript_id, fact, quote, assertion_turn, speaker, confirmation_turn, created_at
        FROM listener_facts;
    DROP TABLE listener_facts;
    ALTER TABLE listener_facts_v5 RENAME TO listener_facts;
    CREATE INDEX listener_facts_by_time ON listener_facts (created_at);
    CREATE TRIGGER listener_facts_ai AFTER INSERT ON listener_facts BEGIN
        INSERT INTO listener_facts_fts (rowid, fact) VALUES (new.id, new.fact);
    END;
    CREATE TRIGGER listener_facts_ad AFTER DELETE ON listener_facts BEGIN
        INSERT INTO listener_facts_fts (listener_facts_fts, rowid, fact) VALUES ('delete', old.id, old.fact);
    END;
    CREATE TABLE listener_debriefs (
        call_id      INTEGER PRIMARY KEY,
        guild_id     INTEGER NOT NULL,
        facts        INTEGER NOT NULL,
        rejected     INTEGER NOT NULL,
        debriefed_at REAL    NOT NULL
    );
"""),
    # version 5: facts from Discord voice calls beside the phone calls' — one table, one index, one
    # memory. A fact comes from an archived phone call (`transcript_id`) or a Discord call (`guild_id`,
    # `call_id`: the voice package's call row, not a foreign key: the listener owns no voice table),
    # never both; SQLite cannot relax a NOT NULL in place, so the table is rebuilt (ids and the FTS5
    # index kept) and its triggers made again. Each fact also keeps who confirmed it and their words
    # (a Discord call keeps only its last turns). `listener_debriefs`: one row per Discord call whose
    # facts were learned, written with them, so a second debrief adds nothing
)



class Database(Protocol):
    """What the repositories need of the service's store (`common.store.Store` has exactly this)."""

    def transaction(self) -> AbstractAsyncContextManager[Any]: ...
    async def execute(self, sql: str, params: Sequence = ()) -> int: ...
    async def fetchone(self, sql: str, params: Sequence = ()) -> Any: ...
    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Any]: ...


# -- archived calls ---------------------------------------------------------------------------------

class TranscriptRepository:
    """Archived calls (`transcripts`) and their turns (`transcript_turns`, indexed in
    `transcript_turns_fts`). Rows come back as the store gives them (`row["column"]`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def insert(self, transcript: Transcript, raw: str, *, received_at: float,
                     user_label: str | None) -> tuple[int, bool]:
        """Store a call, its turns and their index entries in one transaction: (its id, True); a
        conversation already archived is left as it was: (its id, False)."""
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT id FROM transcripts WHERE conversation_id = ?",
                                    (transcript.conversation_id,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                return int(row[0]), False
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
        return transcript_id, True

    async def get(self, transcript_id: int) -> Any:
        """The call's row (every column), or None."""
        return await self.db.fetchone("SELECT * FROM transcripts WHERE id = ?", (transcript_id,))

    async def by_conversation(self, conversation_id: str) -> Any:
        """The row of the call archived under this conversation id, or None."""
        return await self.db.fetchone("SELECT * FROM transcripts WHERE conversation_id = ?", (conversation_id,))

    async def turns(self, transcript_id: int) -> list[Any]:
        """The call's turns in order: turn_index, speaker, is_user, text, start_s, end_s, source_turn_id."""
        return await self.db.fetchall(
            "SELECT turn_index, speaker, is_user, text, start_s, end_s, source_turn_id FROM transcript_turns "
            "WHERE transcript_id = ? ORDER BY turn_index", (transcript_id,))

    async def search_turns(self, match: str, *, conversation_id: str | None = None, speaker: str | None = None,
                           direction: str | None = None, number: str | None = None, since: float | None = None,
                           until: float | None = None, user_only: bool = False, limit: int,
                           offset: int) -> list[Any]:
        """Turns matching the FTS5 query `match`, best first, `limit` rows from `offset`; each filter
        given narrows by call, speaker label, direction, either phone number, arrival time (`since`
        inclusive, `until` exclusive), the user's turns only."""
        where, params = ["transcript_turns_fts MATCH ?"], [match]
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
        return await self.db.fetchall(
            "SELECT t.id AS transcript_id, t.conversation_id, t.direction, t.from_number, t.to_number, t.received_at, "
            "u.turn_index, u.speaker, u.is_user, u.text "
            "FROM transcript_turns_fts JOIN transcript_turns u ON u.id = transcript_turns_fts.rowid "
            "JOIN transcripts t ON t.id = u.transcript_id "
            f"WHERE {' AND '.join(where)} ORDER BY bm25(transcript_turns_fts), u.id LIMIT ? OFFSET ?",
            (*params, limit, offset))

    async def received_at(self, transcript_id: int) -> float | None:
        """When the call was first archived (None: no such call)."""
        row = await self.db.fetchone("SELECT received_at FROM transcripts WHERE id = ?", (transcript_id,))
        return None if row is None else float(row["received_at"])

    async def review_of(self, transcript_id: int) -> str | None:
        """The call's review text (None: no review yet, or no such call)."""
        row = await self.db.fetchone("SELECT review FROM transcripts WHERE id = ?", (transcript_id,))
        return None if row is None else row["review"]

    async def memory_status(self, transcript_id: int) -> str | None:
        """The call's memory state ("none", "done", "error"; None: no such call)."""
        row = await self.db.fetchone("SELECT memory_status FROM transcripts WHERE id = ?", (transcript_id,))
        return None if row is None else row["memory_status"]

    async def set_memory_status(self, transcript_id: int, status: str) -> None:
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET memory_status = ? WHERE id = ?", (status, transcript_id))

    async def queue_review(self, transcript_id: int, status: str) -> None:
        """Set the review state, never over a review that has already landed ("done", "failed")."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET review_status = ? WHERE id = ? AND review_status NOT IN "
                               "('done', 'failed')", (status, transcript_id))

    async def record_review(self, transcript_id: int, review: str | None, status: str) -> None:
        """The review run's text and its final state."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET review = ?, review_status = ? WHERE id = ?",
                               (review, status, transcript_id))


# -- the execution ledger and where results went -----------------------------------------------------

WAITING = "waiting for the call card"  # `delivered`: the result waits for its call's card
POSTING = "posting by "  # + the owner token of the process posting it right now

_STEP_DONE = {"memory": "SELECT memory_status = 'done' FROM transcripts WHERE id = ?",
              "card": "SELECT card IS NOT NULL FROM transcripts WHERE id = ?"}


@dataclass(frozen=True)
class Found:
    """A job slot or call step a claim did not take: `done` (the slot has its run, `job_id`; the
    archive records the step as done), or held by `owner`."""

    done: bool = False
    job_id: str | None = None
    owner: str | None = None


@dataclass(frozen=True)
class JobRoute:
    """A job slot that has a run, with what a delivery needs: its call, its target, its result so far."""

    dedupe_key: str
    kind: str
    label: str
    deliver: str
    delivered: str | None
    transcript_id: int
    conversation_id: str
    from_number: str | None
    to_number: str | None
    card: str | None


class JobRepository:
    """Job slots (`listener_jobs`: one per review, callback and named command of a call; its run, its
    claim, where its result went) and a call's steps in progress (`listener_steps`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def claim_job(self, key: str, *, transcript_id: int, kind: str, label: str, deliver: str, owner: str,
                        now: float, held: Callable[[str | None, float | None], bool]) -> Found | None:
        """Take the slot `key` for `owner` inside one transaction: None when taken (a new slot, or one
        without a run whose claim `held(owner, since)` says nobody is working on — asked only about a
        slot in the claimed state), else what stood in the way."""
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT job_id, state, owner, claimed_at, created_at FROM listener_jobs "
                                    "WHERE dedupe_key = ?", (key,)) as cursor:
                row = await cursor.fetchone()
            if row is None:
                await conn.execute("INSERT INTO listener_jobs (dedupe_key, transcript_id, kind, label, deliver, "
                                   "created_at, state, owner, claimed_at) VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?, ?)",
                                   (key, transcript_id, kind, label[:200], deliver, now, owner, now))
                return None
            if row["job_id"] is not None:
                return Found(done=True, job_id=row["job_id"])
            if row["state"] == "claimed" and held(row["owner"], row["claimed_at"] or row["created_at"]):
                return Found(owner=row["owner"])
            await conn.execute("UPDATE listener_jobs SET state = 'claimed', owner = ?, claimed_at = ?, detail = '' "
                               "WHERE dedupe_key = ?", (owner, now, key))
            return None

    async def job_started(self, key: str, job_id: str) -> None:
        """The slot has its run (unless it had one already); nobody holds it any more."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET job_id = ?, state = 'started', detail = '', owner = NULL "
                               "WHERE dedupe_key = ? AND job_id IS NULL", (job_id, key))

    async def job_failed(self, key: str, detail: str, owner: str) -> None:
        """`owner`'s start of the slot failed: it is released, with why (cut to 300 characters)."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET state = 'error', detail = ?, owner = NULL WHERE dedupe_key = ? "
                               "AND job_id IS NULL AND owner = ?", (detail[:300], key, owner))

    async def job_ids(self, transcript_id: int) -> list[str]:
        """The call's runs, in the order their slots were claimed."""
        rows = await self.db.fetchall(
            "SELECT job_id FROM listener_jobs WHERE transcript_id = ? AND job_id IS NOT NULL ORDER BY rowid",
            (transcript_id,))
        return [row["job_id"] for row in rows]

    async def calls_without_runs(self) -> list[int]:
        """Every call with a slot still without a run (claimed or failed), in archive order."""
        rows = await self.db.fetchall(
            "SELECT DISTINCT transcript_id FROM listener_jobs WHERE job_id IS NULL AND state IN ('claimed', 'error') "
            "ORDER BY transcript_id")
        return [row["transcript_id"] for row in rows]

    async def of_call(self, transcript_id: int) -> list[Any]:
        """Every slot of the call in claim order: kind, label, job_id, state, detail, delivered."""
        return await self.db.fetchall(
            "SELECT kind, label, job_id, state, detail, delivered FROM listener_jobs WHERE transcript_id = ? "
            "ORDER BY rowid", (transcript_id,))

    async def for_card(self, transcript_id: int) -> list[tuple[str, str, str]]:
        """(run id or "not started", kind, label) of every slot of the call not skipped, in claim order."""
        rows = await self.db.fetchall(
            "SELECT COALESCE(job_id, 'not started') AS job_id, kind, label FROM listener_jobs WHERE transcript_id = ? "
            "AND state != 'skipped' ORDER BY rowid", (transcript_id,))
        return [(row["job_id"], row["kind"], row["label"]) for row in rows]

    # -- a call's steps ----------------------------------------------------------------------------

    async def claim_step(self, transcript_id: int, step: str, *, owner: str, now: float,
                         held: Callable[[str, float], bool]) -> Found | None:
        """Take the call's `step` ("memory", "card") for `owner` inside one transaction: None when taken,
        `Found(done=True)` when the archive records it done, `Found(owner=…)` when `held(owner, since)`
        says its holder is still on it."""
        async with self.db.transaction() as conn:
            async with conn.execute(_STEP_DONE[step], (transcript_id,)) as cursor:
                done = await cursor.fetchone()
            if done is not None and done[0]:
                return Found(done=True)
            async with conn.execute("SELECT owner, claimed_at FROM listener_steps WHERE transcript_id = ? AND "
                                    "step = ?", (transcript_id, step)) as cursor:
                row = await cursor.fetchone()
            if row is not None and held(row["owner"], row["claimed_at"]):
                return Found(owner=row["owner"])
            await conn.execute("INSERT INTO listener_steps (transcript_id, step, owner, claimed_at) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT (transcript_id, step) DO UPDATE SET owner = excluded.owner, "
                               "claimed_at = excluded.claimed_at", (transcript_id, step, owner, now))
            return None

    async def release_step(self, transcript_id: int, step: str, owner: str) -> None:
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM listener_steps WHERE transcript_id = ? AND step = ? AND owner = ?",
                               (transcript_id, step, owner))

    async def card_posted(self, transcript_id: int, reference: str, owner: str) -> None:
        """In one transaction: the call's card is `reference` unless one is recorded already, and
        `owner`'s claim on posting it is let go."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET card = COALESCE(card, ?) WHERE id = ?", (reference, transcript_id))
            await conn.execute("DELETE FROM listener_steps WHERE transcript_id = ? AND step = 'card' AND owner = ?",
                               (transcript_id, owner))

    # -- where results went ------------------------------------------------------------------------

    async def route(self, job_id: str) -> JobRoute | None:
        """The slot whose run is `job_id`, with its call (None: not a listener job)."""
        row = await self.db.fetchone(
            "SELECT j.dedupe_key, j.kind, j.label, j.deliver, j.delivered, t.id AS transcript_id, t.conversation_id, "
            "t.from_number, t.to_number, t.card FROM listener_jobs j JOIN transcripts t ON t.id = j.transcript_id "
            "WHERE j.job_id = ?", (job_id,))
        return None if row is None else JobRoute(
            row["dedupe_key"], row["kind"], row["label"], row["deliver"], row["delivered"], row["transcript_id"],
            row["conversation_id"], row["from_number"], row["to_number"], row["card"])

    async def wait_for_card(self, key: str, transcript_id: int) -> bool:
        """Mark the slot's result `WAITING` in one statement, only when it has no outcome yet and its
        call has no card recorded; True when it now waits."""
        return bool(await self.db.execute(
            "UPDATE listener_jobs SET delivered = ? WHERE dedupe_key = ? AND delivered IS NULL AND "
            "(SELECT card FROM transcripts WHERE id = ?) IS NULL", (WAITING, key, transcript_id)))

    async def record_card(self, transcript_id: int, reference: str) -> list[str]:
        """In one transaction: the call's card is `reference`, and the runs whose results wait for it
        (or were refused before) are read, in claim order."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET card = ? WHERE id = ?", (reference, transcript_id))
            async with conn.execute(
                    "SELECT job_id FROM listener_jobs WHERE transcript_id = ? AND job_id IS NOT NULL AND "
                    "(delivered = ? OR delivered LIKE 'post failed%') ORDER BY rowid",
                    (transcript_id, WAITING)) as cursor:
                return [row["job_id"] for row in await cursor.fetchall()]

    async def held_results(self) -> list[str]:
        """Runs whose result waits for a card now recorded, or was being posted (by whoever), in claim order."""
        rows = await self.db.fetchall(
            "SELECT j.job_id FROM listener_jobs j JOIN transcripts t ON t.id = j.transcript_id WHERE (j.delivered = ? "
            "OR j.delivered LIKE ?) AND t.card IS NOT NULL ORDER BY j.rowid", (WAITING, POSTING + "%"))
        return [row["job_id"] for row in rows]

    async def take_result(self, key: str, seen: str | None, poster: str) -> bool:
        """Compare-and-set: the result becomes `POSTING` + `poster` only if it is still `seen`; True for
        exactly one taker."""
        return await self.db.execute("UPDATE listener_jobs SET delivered = ? WHERE dedupe_key = ? AND delivered IS ?",
                                     (POSTING + poster, key, seen)) == 1

    async def settle_result(self, key: str, where: str, poster: str) -> None:
        """Record where the result went, if `poster` still holds it."""
        await self.db.execute("UPDATE listener_jobs SET delivered = ? WHERE dedupe_key = ? AND delivered = ?",
                              (where, key, POSTING + poster))


# -- callbacks and their mutation tokens --------------------------------------------------------------


class CallbackRepository:
    """The user's post-call callbacks (`listener_callbacks`); rows as the store gives them."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def all(self, *, first: str) -> list[Any]:
        """Every callback: the one with id `first` before the others, then by creation."""
        return await self.db.fetchall("SELECT * FROM listener_callbacks ORDER BY id = ? DESC, created_at, id",
                                      (first,))

    async def get(self, callback_id: str) -> Any:
        return await self.db.fetchone("SELECT * FROM listener_callbacks WHERE id = ?", (callback_id,))

    async def insert_new(self, callback_id: str, name: str, instructions: str, deliver: str, now: float) -> bool:
        """Add the callback in one transaction; False (nothing written) when that id exists already."""
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT 1 FROM listener_callbacks WHERE id = ?", (callback_id,)) as cursor:
                if await cursor.fetchone() is not None:
                    return False
            await conn.execute("INSERT INTO listener_callbacks (id, name, instructions, deliver, created_at, updated_at)"
                               " VALUES (?, ?, ?, ?, ?, ?)", (callback_id, name, instructions, deliver, now, now))
        return True

    async def change(self, callback_id: str, *, name: str | None, instructions: str | None, deliver: str | None,
                     enabled: bool | None, now: float) -> None:
        """Change only the fields given (not None), in one statement, and bump the revision: another
        process changing another field of the same callback at once keeps its change."""
        async with self.db.transaction() as conn:
            await conn.execute("UPDATE listener_callbacks SET name = COALESCE(?, name), "
                               "instructions = COALESCE(?, instructions), deliver = COALESCE(?, deliver), "
                               "enabled = COALESCE(?, enabled), revision = revision + 1, updated_at = ? WHERE id = ?",
                               (name, instructions, deliver, None if enabled is None else int(enabled), now,
                                callback_id))

    async def put(self, callback_id: str, name: str, instructions: str, deliver: str, now: float, *,
                  replace_deliver: bool) -> None:
        """Insert the callback, or (one statement: two processes at once both succeed) give the existing
        one these instructions, enabled, its revision bumped — and this deliver target when
        `replace_deliver`; its name stays."""
        async with self.db.transaction() as conn:
            await conn.execute("INSERT INTO listener_callbacks (id, name, instructions, deliver, created_at, updated_at) "
                               "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                               "instructions = excluded.instructions, enabled = 1, revision = revision + 1, "
                               "updated_at = excluded.updated_at"
                               + (", deliver = excluded.deliver" if replace_deliver else ""),
                               (callback_id, name, instructions, deliver, now, now))

    async def delete(self, callback_id: str) -> None:
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM listener_callbacks WHERE id = ?", (callback_id,))


class TokenRepository:
    """Callback-mutation tokens (`listener_tokens`): only their hashes, the job each is for, expiry."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, token_hash: str, job_key: str, *, expires_at: float, now: float) -> None:
        """Forget every token expired by `now` and keep this one, in one transaction."""
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM listener_tokens WHERE expires_at <= ?", (now,))
            await conn.execute("INSERT INTO listener_tokens (token_hash, job_key, expires_at, created_at) "
                               "VALUES (?, ?, ?, ?)", (token_hash, job_key, expires_at, now))

    async def get(self, token_hash: str) -> Any:
        """The token's row (token_hash, expires_at), or None."""
        return await self.db.fetchone("SELECT token_hash, expires_at FROM listener_tokens WHERE token_hash = ?",
                                      (token_hash,))

    async def revoke(self, job_key: str) -> None:
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM listener_tokens WHERE job_key = ?", (job_key,))


# -- durable facts ------------------------------------------------------------------------------------

_FACT_COLUMNS = ("f.id, f.fact, f.quote, f.assertion_turn, f.speaker, f.confirmation_turn, f.confirmed_by, "
                 "f.created_at, f.guild_id, f.call_id, t.conversation_id, t.received_at")


# A Discord call's facts stay in its server; phone-call facts (the user's own) only where the caller says.
def _in_scope(phone: bool) -> str:
    return "(f.guild_id IS NULL OR f.guild_id = ?)" if phone else "f.guild_id = ?"


class FactRepository:
    """Durable facts (`listener_facts`, indexed in `listener_facts_fts` by triggers), each from an
    archived phone call (`transcript_id`) or a Discord call (`guild_id`, `call_id`), and the Discord
    calls debriefed (`listener_debriefs`). Rows of `newest`, `search` and `of_discord_call` carry the
    fact's columns and, for a phone call's, its conversation_id and received_at (NULL for a Discord
    call's). `assertion_turn`/`confirmation_turn` are 0-based turn indexes: a Discord call turn's is
    its seq - 1."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def save(self, transcript_id: int, facts: Sequence[Fact], clock: Callable[[], float]) -> int:
        """Store a call's facts (one already known is skipped) and mark its memory done, in one
        transaction; returns how many are new. Each fact is stamped `clock()` as it is written."""
        added = 0
        async with self.db.transaction() as conn:
            for fact in facts:
                cursor = await conn.execute(
                    "INSERT INTO listener_facts (transcript_id, fact, quote, assertion_turn, speaker, "
                    "confirmation_turn, confirmed_by, confirmation_quote, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (transcript_id, fact) DO NOTHING",
                    (transcript_id, fact.text, fact.quote, fact.assertion_turn, fact.speaker, fact.confirmation_turn,
                     fact.confirmed_by, fact.confirmation_quote, clock()))
                added += cursor.rowcount
            await conn.execute("UPDATE transcripts SET memory_status = 'done' WHERE id = ?", (transcript_id,))
        return added

    async def save_call(self, guild_id: int, call_id: int, facts: Sequence[Fact], *, rejected: int,
                        clock: Callable[[], float]) -> int | None:
        """Store a Discord call's facts and its `listener_debriefs` row in one transaction; returns how
        many facts are new, or None (nothing written) when the call has its row already."""
        added = 0
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT 1 FROM listener_debriefs WHERE call_id = ?", (call_id,)) as cursor:
                if await cursor.fetchone() is not None:
                    return None
            for fact in facts:
                cursor = await conn.execute(
                    "INSERT INTO listener_facts (guild_id, call_id, fact, quote, assertion_turn, speaker, "
                    "confirmation_turn, confirmed_by, confirmation_quote, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (call_id, fact) DO NOTHING",
                    (guild_id, call_id, fact.text, fact.quote, fact.assertion_turn, fact.speaker,
                     fact.confirmation_turn, fact.confirmed_by, fact.confirmation_quote, clock()))
                added += cursor.rowcount
            await conn.execute("INSERT INTO listener_debriefs (call_id, guild_id, facts, rejected, debriefed_at) "
                               "VALUES (?, ?, ?, ?, ?)", (call_id, guild_id, added, rejected, clock()))
        return added

    async def debriefed(self, call_id: int) -> bool:
        return await self.db.fetchone("SELECT 1 FROM listener_debriefs WHERE call_id = ?", (call_id,)) is not None

    async def newest(self, limit: int, *, guild_id: int | None = None, phone: bool = True) -> list[Any]:
        """The newest facts of `guild_id`'s Discord calls and, with `phone`, of phone calls."""
        return await self.db.fetchall(
            f"SELECT {_FACT_COLUMNS} FROM listener_facts f LEFT JOIN transcripts t ON t.id = f.transcript_id "
            f"WHERE {_in_scope(phone)} ORDER BY f.created_at DESC, f.id DESC LIMIT ?", (guild_id, limit))

    async def search(self, match: str, *, limit: int, offset: int, guild_id: int | None = None,
                     phone: bool = True) -> list[Any]:
        """Facts matching the FTS5 query `match`, best first, `limit` rows from `offset`; of `guild_id`'s
        Discord calls and, with `phone`, of phone calls."""
        return await self.db.fetchall(
            f"SELECT {_FACT_COLUMNS} FROM listener_facts_fts JOIN listener_facts f ON f.id = listener_facts_fts.rowid "
            f"LEFT JOIN transcripts t ON t.id = f.transcript_id WHERE listener_facts_fts MATCH ? AND {_in_scope(phone)} "
            "ORDER BY bm25(listener_facts_fts), f.id LIMIT ? OFFSET ?", (match, guild_id, limit, offset))

    async def of_call(self, transcript_id: int) -> list[Any]:
        """The phone call's facts in the order learned: fact, assertion_turn, confirmation_turn."""
        return await self.db.fetchall("SELECT fact, assertion_turn, confirmation_turn FROM listener_facts WHERE "
                                      "transcript_id = ? ORDER BY id", (transcript_id,))

    async def of_discord_call(self, call_id: int) -> list[Any]:
        """The Discord call's facts in the order learned."""
        return await self.db.fetchall(
            f"SELECT {_FACT_COLUMNS} FROM listener_facts f LEFT JOIN transcripts t ON t.id = f.transcript_id "
            "WHERE f.call_id = ? ORDER BY f.id", (call_id,))


# -- read-only, through a synchronous connection (`switchboard doctor`) -------------------------------


def callback_switches(conn: sqlite3.Connection) -> list[tuple[str, bool]]:
    """(id, enabled) of every callback, the review's included."""
    return [(cid, bool(enabled)) for cid, enabled in conn.execute("SELECT id, enabled FROM listener_callbacks")]


def last_failed_post(conn: sqlite3.Connection) -> tuple[str, str] | None:
    """(label, delivered) of the newest job whose result post failed, or None."""
    row = conn.execute("SELECT label, delivered FROM listener_jobs WHERE delivered LIKE 'post failed%' "
                       "ORDER BY created_at DESC LIMIT 1").fetchone()
    return None if row is None else (row[0], row[1])


def results_waiting(conn: sqlite3.Connection) -> int:
    """How many results wait for their call's card."""
    (waiting,) = conn.execute("SELECT COUNT(*) FROM listener_jobs WHERE delivered = ?", (WAITING,)).fetchone()
    return int(waiting)
