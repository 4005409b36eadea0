"""The runs package's tables and every SQL statement that touches them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from common.store import Migration, Store, Tx
from runs.core import (
    TERMINAL,
    Approval,
    Delivery,
    RunState,
    RunTicket,
    SteerReceipt,
    SteerState,
    StopRequest,
)

PACKAGE = "runs"

_STATES = ", ".join(f"'{s.value}'" for s in RunState)
_STEER_STATES = ", ".join(f"'{s.value}'" for s in SteerState)
_DELIVERY = ", ".join(f"'{d.value}'" for d in Delivery)

MIGRATIONS = (
    Migration(PACKAGE, 1, f"""
        CREATE TABLE runs (
            id              INTEGER PRIMARY KEY AUTOINCREMENT,
            lane            TEXT    NOT NULL,
            task            TEXT    NOT NULL,
            state           TEXT    NOT NULL CHECK (state IN ({_STATES})),
            requester_id    INTEGER,
            external_id     TEXT,
            owner           TEXT    NOT NULL,
            idempotency_key TEXT    NOT NULL UNIQUE,
            output          TEXT,
            output_cut      INTEGER NOT NULL DEFAULT 0,
            error           TEXT,
            progress        TEXT,
            approval        TEXT,
            stop_reason     TEXT,
            stop_kind       TEXT,
            stop_at         REAL,
            stop_by         INTEGER,
            created_at      REAL    NOT NULL,
            updated_at      REAL    NOT NULL,
            started_at      REAL,
            finished_at     REAL,
            delivery        TEXT    NOT NULL DEFAULT 'pending' CHECK (delivery IN ({_DELIVERY})),
            delivery_owner  TEXT,
            announced       INTEGER,
            delivered_at    REAL
        );
        CREATE INDEX runs_by_state ON runs (state);
        CREATE TABLE run_steers (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id       INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            token        TEXT    NOT NULL UNIQUE,
            note         TEXT    NOT NULL,
            state        TEXT    NOT NULL CHECK (state IN ({_STEER_STATES})),
            seen_pending INTEGER NOT NULL DEFAULT 0,
            created_at   REAL    NOT NULL,
            updated_at   REAL    NOT NULL
        );
        CREATE INDEX run_steers_by_run ON run_steers (run_id);
        CREATE TABLE run_events (
            id     INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            at     REAL    NOT NULL,
            kind   TEXT    NOT NULL,
            detail TEXT    NOT NULL DEFAULT ''
        );
        CREATE INDEX run_events_by_run ON run_events (run_id, id);
    """),
    # What started a run (a voice call's id), so a call's recap can list the runs it started.
    Migration(PACKAGE, 2, """
        ALTER TABLE runs ADD COLUMN origin TEXT;
        CREATE INDEX runs_by_origin ON runs (origin);
    """),
)

_TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in TERMINAL)


def _approval_json(approval: Approval | None) -> str | None:
    if approval is None:
        return None
    return json.dumps({"request_id": approval.request_id, "choices": list(approval.choices),
                       "description": approval.description, "asked_at": approval.asked_at,
                       "deadline": approval.deadline})


def _approval(raw: str | None) -> Approval | None:
    if not raw:
        return None
    data = json.loads(raw)
    return Approval(data.get("request_id"), tuple(data.get("choices") or ()), data.get("description", ""),
                    float(data["asked_at"]), float(data["deadline"]))


def _ticket(row: sqlite3.Row) -> RunTicket:
    stop = None
    if row["stop_kind"]:
        stop = StopRequest(row["stop_reason"] or "", row["stop_kind"], row["stop_at"], row["stop_by"])
    return RunTicket(
        id=row["id"], lane=row["lane"], task=row["task"], state=RunState(row["state"]),
        created_at=row["created_at"], updated_at=row["updated_at"], requester_id=row["requester_id"],
        external_id=row["external_id"], owner=row["owner"], idempotency_key=row["idempotency_key"],
        output=row["output"], output_cut=bool(row["output_cut"]), error=row["error"],
        progress=row["progress"], started_at=row["started_at"], finished_at=row["finished_at"],
        approval=_approval(row["approval"]), stop=stop, delivery=Delivery(row["delivery"]),
        announced=None if row["announced"] is None else bool(row["announced"]),
        delivered_at=row["delivered_at"], origin=row["origin"],
    )


def _receipt(row: sqlite3.Row) -> SteerReceipt:
    return SteerReceipt(row["id"], row["run_id"], row["token"], row["note"], SteerState(row["state"]),
                        row["created_at"], row["updated_at"], bool(row["seen_pending"]))


@dataclass(frozen=True)
class RunEvent:
    at: float
    kind: str
    detail: str


class RunRepository:
    """Run tickets, their steering receipts and their event log in the shared store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- tickets -----------------------------------------------------------------------------------

    async def create(self, *, lane: str, task: str, requester_id: int | None, owner: str,
                     idempotency_key: str, now: float, origin: str | None = None) -> RunTicket:
        """Insert and commit a `starting` ticket (before the lane is asked to start anything)."""
        run_id = await self.store.transact(
            lambda tx: _insert_starting(tx, lane, task, requester_id, owner, idempotency_key, now, origin))
        ticket = await self.get(run_id)
        assert ticket is not None
        return ticket

    async def create_once(self, *, lane: str, task: str, requester_id: int | None, owner: str,
                          idempotency_key: str, now: float, origin: str | None = None) -> tuple[RunTicket, bool]:
        """`create`, idempotent on `idempotency_key`: the ticket already recorded under that key (and
        False) when there is one — whichever task or process asked first — else a new one (and True).
        A start retried after a crash finds the run the first attempt recorded, never a second."""
        async def create(tx: Tx) -> tuple[int, bool]:
            row = await tx.fetchone("SELECT id FROM runs WHERE idempotency_key = ?", (idempotency_key,))
            if row is not None:
                return int(row[0]), False
            return await _insert_starting(tx, lane, task, requester_id, owner, idempotency_key, now, origin), True

        run_id, created = await self.store.transact(create)
        ticket = await self.get(run_id)
        assert ticket is not None
        return ticket, created

    async def by_idempotency_key(self, idempotency_key: str) -> RunTicket | None:
        row = await self.store.fetchone("SELECT * FROM runs WHERE idempotency_key = ?", (idempotency_key,))
        return _ticket(row) if row else None

    async def get(self, run_id: int) -> RunTicket | None:
        row = await self.store.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        return _ticket(row) if row else None

    async def active(self) -> list[RunTicket]:
        rows = await self.store.fetchall(f"SELECT * FROM runs WHERE state NOT IN ({_TERMINAL_SQL}) ORDER BY id")
        return [_ticket(r) for r in rows]

    async def count_by_state(self) -> dict[str, int]:
        """How many tickets are in each state (states with none are left out)."""
        rows = await self.store.fetchall("SELECT state, COUNT(*) FROM runs GROUP BY state")
        return {str(state): int(count) for state, count in rows}

    async def recent(self, limit: int = 20) -> list[RunTicket]:
        rows = await self.store.fetchall("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [_ticket(r) for r in rows]

    async def of_origin(self, origin: str) -> list[RunTicket]:
        """Every run recorded with exactly this `origin`, oldest first."""
        rows = await self.store.fetchall("SELECT * FROM runs WHERE origin = ? ORDER BY id", (origin,))
        return [_ticket(r) for r in rows]

    async def update(self, run_id: int, change: Callable[[RunTicket], RunTicket | None],
                     *, event: Callable[[RunTicket, RunTicket], tuple[str, str] | None] | None = None,
                     now: float = 0.0) -> tuple[RunTicket, RunTicket] | None:
        """Read, change and write one ticket inside one write transaction (no lost updates between
        processes). `change` returns the new ticket, or None to leave it. Returns (before, after)."""
        async def update(tx: Tx) -> tuple[RunTicket, RunTicket] | None:
            row = await tx.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
            if row is None:
                return None
            before = _ticket(row)
            after = change(before)
            if after is None or after == before:
                return before, before
            await tx.execute(
                "UPDATE runs SET state = ?, external_id = ?, owner = ?, output = ?, output_cut = ?, "
                "error = ?, progress = ?, approval = ?, stop_reason = ?, stop_kind = ?, stop_at = ?, "
                "stop_by = ?, updated_at = ?, started_at = ?, finished_at = ? WHERE id = ?",
                (after.state.value, after.external_id, after.owner, after.output, int(after.output_cut),
                 after.error, after.progress, _approval_json(after.approval),
                 after.stop.reason if after.stop else None, after.stop.kind if after.stop else None,
                 after.stop.at if after.stop else None, after.stop.by if after.stop else None,
                 after.updated_at, after.started_at, after.finished_at, run_id))
            logged = event(before, after) if event else None
            if logged:
                await tx.execute("INSERT INTO run_events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                                 (run_id, now or after.updated_at, logged[0], logged[1][:500]))
            return before, after

        return await self.store.transact(update)

    # -- delivery ----------------------------------------------------------------------------------

    async def claim(self, run_id: int, owner: str) -> bool:
        """Atomically take the right to deliver a finished run; True for exactly one caller."""
        changed = await self.store.execute(
            f"UPDATE runs SET delivery = 'claimed', delivery_owner = ? WHERE id = ? AND delivery = 'pending' "
            f"AND state IN ({_TERMINAL_SQL})", (owner, run_id))
        return changed == 1

    async def mark_delivered(self, run_id: int, owner: str, *, announced: bool, now: float) -> None:
        await self.store.execute(
            "UPDATE runs SET delivery = 'delivered', announced = ?, delivered_at = ? "
            "WHERE id = ? AND delivery = 'claimed' AND delivery_owner = ?", (int(announced), now, run_id, owner))

    async def release_claims(self, owners: list[str]) -> int:
        """Put back claims held by owners that died before delivering (the run is delivered again)."""
        released = 0
        for owner in owners:
            released += await self.store.execute(
                "UPDATE runs SET delivery = 'pending', delivery_owner = NULL "
                "WHERE delivery = 'claimed' AND delivery_owner = ?", (owner,))
        return released

    async def claim_owners(self) -> list[str]:
        rows = await self.store.fetchall(
            "SELECT DISTINCT delivery_owner FROM runs WHERE delivery = 'claimed' AND delivery_owner IS NOT NULL")
        return [r[0] for r in rows]

    async def undelivered(self) -> list[int]:
        rows = await self.store.fetchall(
            f"SELECT id FROM runs WHERE delivery = 'pending' AND state IN ({_TERMINAL_SQL}) ORDER BY id")
        return [r[0] for r in rows]

    # -- steering receipts -------------------------------------------------------------------------

    async def add_receipt(self, run_id: int, token: str, note: str, now: float) -> SteerReceipt:
        async def add(tx: Tx) -> int:
            receipt_id = await tx.insert(
                "INSERT INTO run_steers (run_id, token, note, state, created_at, updated_at) "
                "VALUES (?, ?, ?, 'queued', ?, ?)", (run_id, token, note, now, now))
            await tx.execute("INSERT INTO run_events (run_id, at, kind, detail) VALUES (?, ?, 'steer', ?)",
                             (run_id, now, f"note {token} queued"))
            return receipt_id

        receipt_id = await self.store.transact(add)
        return SteerReceipt(receipt_id, run_id, token, note, SteerState.QUEUED, now, now)

    async def receipts(self, run_id: int) -> list[SteerReceipt]:
        rows = await self.store.fetchall("SELECT * FROM run_steers WHERE run_id = ? ORDER BY id", (run_id,))
        return [_receipt(r) for r in rows]

    async def update_receipts(self, run_id: int,
                              change: Callable[[SteerReceipt], SteerReceipt]) -> list[SteerReceipt]:
        """Apply `change` to every receipt of the run in one transaction; returns those that changed."""
        async def update(tx: Tx) -> list[SteerReceipt]:
            changed: list[SteerReceipt] = []
            for row in await tx.fetchall("SELECT * FROM run_steers WHERE run_id = ? ORDER BY id", (run_id,)):
                before = _receipt(row)
                after = change(before)
                if after == before:
                    continue
                await tx.execute("UPDATE run_steers SET state = ?, seen_pending = ?, updated_at = ? WHERE id = ?",
                                 (after.state.value, int(after.seen_pending), after.updated_at, after.id))
                if after.state != before.state:
                    await tx.execute("INSERT INTO run_events (run_id, at, kind, detail) VALUES (?, ?, 'steer', ?)",
                                     (run_id, after.updated_at, f"note {after.token} {after.state.value}"))
                changed.append(after)
            return changed

        return await self.store.transact(update)

    # -- event log ---------------------------------------------------------------------------------

    async def log(self, run_id: int, kind: str, detail: str, now: float) -> None:
        await self.store.execute("INSERT INTO run_events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                                 (run_id, now, kind, detail[:500]))

    async def events(self, run_id: int, limit: int = 50) -> list[RunEvent]:
        rows = await self.store.fetchall(
            "SELECT at, kind, detail FROM (SELECT * FROM run_events WHERE run_id = ? ORDER BY id DESC LIMIT ?) AS newest "
            "ORDER BY id", (run_id, limit))
        return [RunEvent(r["at"], r["kind"], r["detail"]) for r in rows]


async def _insert_starting(tx: Tx, lane: str, task: str, requester_id: int | None, owner: str, idempotency_key: str,
                           now: float, origin: str | None = None) -> int:
    """A `starting` ticket and its `created` event, inside the caller's transaction; the new run id."""
    run_id = await tx.insert(
        "INSERT INTO runs (lane, task, state, requester_id, owner, idempotency_key, created_at, updated_at, origin) "
        "VALUES (?, ?, 'starting', ?, ?, ?, ?, ?, ?)",
        (lane, task, requester_id, owner, idempotency_key, now, now, origin))
    await tx.execute("INSERT INTO run_events (run_id, at, kind, detail) VALUES (?, ?, 'created', ?)",
                     (run_id, now, f"on {lane}"))
    return run_id


def last_post_event(conn: sqlite3.Connection) -> tuple[int, str, str] | None:
    """(run id, "posted" or "post_failed", detail) of the newest post of a run, or None; a plain read
    through a synchronous connection (`switchboard doctor` opens one read-only)."""
    row = conn.execute("SELECT run_id, kind, detail FROM run_events WHERE kind IN ('posted', 'post_failed') "
                       "ORDER BY id DESC LIMIT 1").fetchone()
    return None if row is None else (row[0], row[1], row[2])
