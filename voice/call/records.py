"""The voice package's tables — durable call rows and their recent turns — and every SQL statement on them.

A call is one `voice_calls` row from join to leave, in one of three states:

- `live`: the call is going on, or the process died without leaving (a crash leaves it so);
- `resume`: the process stopped on purpose (SIGTERM, SIGINT) while in the call, to rejoin at the next start;
  rejoining makes the same row `live` again (`mark_live`), so a call keeps one row across restarts;
- `ended`: the call was left (`end_reason` says why).

`voice_call_turns` keeps each call's last `KEEP_TURNS` lines of conversation — who spoke (the speaker's
immutable id, their display name as shown: untrusted), the transcription or the assistant's words —
text only, never audio; the oldest go in the same transaction that adds a newer one.
`voice_call_speakers` keeps how long each person has spoken in the call so far, and `voice_calls.usage`
what the provider reported (`CallUsage` as JSON) — both written with each person's turn, as usage is
reported, and at the end (`bot.discord.call_row`), so a recap after a restart still counts what came before it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.store import Migration, Store, Tx
from voice.call.usage import NO_USAGE, CallUsage

PACKAGE = "voice"
KEEP_TURNS = 500  # a long call (hours) whole for its recap and debrief; a new session gets only the last 20
STATES = ("live", "ended", "resume")
ROLES = ("user", "assistant")

_STATES = ", ".join(f"'{s}'" for s in STATES)
_ROLES = ", ".join(f"'{r}'" for r in ROLES)

MIGRATIONS = (
    Migration(PACKAGE, 1, f"""
        CREATE TABLE voice_calls (
            id               INTEGER PRIMARY KEY AUTOINCREMENT,
            guild_id         INTEGER NOT NULL,
            voice_channel_id INTEGER NOT NULL,
            text_channel_id  INTEGER,
            started_by       INTEGER,
            mode             TEXT    NOT NULL,
            captions         INTEGER NOT NULL DEFAULT 0,
            started_at       REAL    NOT NULL,
            ended_at         REAL,
            end_reason       TEXT,
            state            TEXT    NOT NULL DEFAULT 'live' CHECK (state IN ({_STATES}))
        );
        CREATE INDEX voice_calls_by_state ON voice_calls (state);
        CREATE TABLE voice_call_turns (
            call_id    INTEGER NOT NULL REFERENCES voice_calls (id) ON DELETE CASCADE,
            seq        INTEGER NOT NULL,
            at         REAL    NOT NULL,
            role       TEXT    NOT NULL CHECK (role IN ({_ROLES})),
            speaker_id INTEGER,
            name       TEXT    NOT NULL,
            text       TEXT    NOT NULL,
            PRIMARY KEY (call_id, seq)
        );
    """),
    Migration(PACKAGE, 2, """
        ALTER TABLE voice_calls ADD COLUMN usage TEXT;
        CREATE TABLE voice_call_speakers (
            call_id   INTEGER NOT NULL REFERENCES voice_calls (id) ON DELETE CASCADE,
            user_id   INTEGER NOT NULL,
            spoken_ms INTEGER NOT NULL CHECK (spoken_ms >= 0),
            PRIMARY KEY (call_id, user_id)
        );
    """),
)


@dataclass(frozen=True)
class CallTurn:
    seq: int
    at: float
    role: str  # "user" | "assistant"
    speaker_id: int | None  # the user turn's one speaker; None for the assistant (or an unattributed line)
    name: str  # as shown: untrusted
    text: str


@dataclass(frozen=True)
class CallRecord:
    id: int
    guild_id: int
    voice_channel_id: int
    text_channel_id: int | None
    started_by: int | None
    mode: str
    captions: bool
    started_at: float
    ended_at: float | None
    end_reason: str | None
    state: str
    turns: tuple[CallTurn, ...] = ()  # oldest first
    spoken_ms: dict[int, int] = field(default_factory=dict)  # user id -> ms spoken in the call so far
    usage: CallUsage = NO_USAGE  # what the provider reported over the call so far


class CallRecords:
    """Voice calls and their recent turns in the shared store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def start(self, *, guild_id: int, voice_channel_id: int, text_channel_id: int | None,
                    started_by: int | None, mode: str, captions: bool, at: float) -> int:
        """A new `live` call; its id."""
        return await self.store.insert(
            "INSERT INTO voice_calls (guild_id, voice_channel_id, text_channel_id, started_by, mode, captions, "
            "started_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'live')",
            (guild_id, voice_channel_id, text_channel_id, started_by, mode, int(captions), at))

    async def add_turn(self, call_id: int, role: str, speaker_id: int | None, name: str, text: str,
                       at: float) -> int:
        """Append a line to the call's turns, dropping all but the newest `KEEP_TURNS`; its seq."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        async def add(tx: Tx) -> int:
            row = await tx.fetchone("SELECT COALESCE(MAX(seq), 0) + 1 FROM voice_call_turns WHERE call_id = ?",
                                    (call_id,))
            seq = int(row[0])
            await tx.execute("INSERT INTO voice_call_turns (call_id, seq, at, role, speaker_id, name, text) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", (call_id, seq, at, role, speaker_id, name, text))
            await tx.execute("DELETE FROM voice_call_turns WHERE call_id = ? AND seq <= ?",
                             (call_id, seq - KEEP_TURNS))
            return seq

        return await self.store.transact(add)

    async def end(self, call_id: int, reason: str, at: float) -> bool:
        """The call was left: `ended`, with why. False when it had ended already."""
        return await self.store.execute(
            "UPDATE voice_calls SET state = 'ended', ended_at = ?, end_reason = ? WHERE id = ? AND state != 'ended'",
            (at, reason, call_id)) > 0

    async def mark_resume(self, call_id: int) -> bool:
        """The process stops on purpose during the call: rejoin it at the next start. False unless it was live."""
        return await self.store.execute("UPDATE voice_calls SET state = 'resume' WHERE id = ? AND state = 'live'",
                                        (call_id,)) > 0

    async def set_totals(self, call_id: int, spoken_ms: Mapping[int, float], usage: CallUsage) -> None:
        """How long each person has spoken in the call so far, and what the provider reported (totals, not
        additions)."""
        rows = [(call_id, int(user), max(0, int(ms))) for user, ms in spoken_ms.items() if user is not None]
        async def save(tx: Tx) -> None:
            await tx.execute("UPDATE voice_calls SET usage = ? WHERE id = ?", (json.dumps(usage.to_json()), call_id))
            if rows:
                await tx.executemany("INSERT INTO voice_call_speakers (call_id, user_id, spoken_ms) VALUES (?, ?, ?) "
                                     "ON CONFLICT (call_id, user_id) DO UPDATE SET spoken_ms = excluded.spoken_ms",
                                     rows)

        await self.store.transact(save)

    async def mark_live(self, call_id: int) -> bool:
        """The call was rejoined after a restart: `live` again, same row and turns. False if it had ended."""
        return await self.store.execute("UPDATE voice_calls SET state = 'live' WHERE id = ? AND state != 'ended'",
                                        (call_id,)) > 0

    async def get(self, call_id: int) -> CallRecord | None:
        row = await self.store.fetchone("SELECT * FROM voice_calls WHERE id = ?", (call_id,))
        return None if row is None else await self._load(row)

    async def live(self, *, guild_id: int | None = None) -> list[CallRecord]:
        """Calls not ended (`live` or `resume`), oldest first, each with its recent turns (oldest first)."""
        in_guild, params = ("", ()) if guild_id is None else (" AND guild_id = ?", (guild_id,))
        rows = await self.store.fetchall(
            f"SELECT * FROM voice_calls WHERE state IN ('live', 'resume'){in_guild} ORDER BY id", params)
        return [await self._load(row) for row in rows]

    async def _load(self, row) -> CallRecord:
        return _record(row, await self._turns(row["id"]), await self._spoken(row["id"]))

    async def _turns(self, call_id: int) -> tuple[CallTurn, ...]:
        rows = await self.store.fetchall("SELECT seq, at, role, speaker_id, name, text FROM voice_call_turns "
                                         "WHERE call_id = ? ORDER BY seq", (call_id,))
        return tuple(CallTurn(r["seq"], r["at"], r["role"], r["speaker_id"], r["name"], r["text"]) for r in rows)


    async def _spoken(self, call_id: int) -> dict[int, int]:
        rows = await self.store.fetchall("SELECT user_id, spoken_ms FROM voice_call_speakers WHERE call_id = ?",
                                         (call_id,))
        return {r["user_id"]: r["spoken_ms"] for r in rows}


def unfinished_calls(conn: sqlite3.Connection) -> dict[str, int]:
    """How many calls are `live` and `resume` (to be rejoined at the next start); a plain read through a
    synchronous connection (`switchboard doctor` opens one read-only). Empty before the tables exist."""
    try:
        rows = conn.execute("SELECT state, COUNT(*) FROM voice_calls WHERE state IN ('live', 'resume') "
                            "GROUP BY state").fetchall()
    except sqlite3.OperationalError:  # no such table: no call was ever recorded
        return {}
    return {state: count for state, count in rows}


def _record(row, turns: tuple[CallTurn, ...], spoken_ms: dict[int, int]) -> CallRecord:
    return CallRecord(id=row["id"], guild_id=row["guild_id"], voice_channel_id=row["voice_channel_id"],
                      text_channel_id=row["text_channel_id"], started_by=row["started_by"], mode=row["mode"],
                      captions=bool(row["captions"]), started_at=row["started_at"], ended_at=row["ended_at"],
                      end_reason=row["end_reason"], state=row["state"], turns=turns, spoken_ms=spoken_ms,
                      usage=_usage(row["usage"]))


def _usage(text: str | None) -> CallUsage:
    try:
        return CallUsage.from_json(json.loads(text)) if text else NO_USAGE
    except ValueError:
        return NO_USAGE
