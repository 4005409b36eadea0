"""A store with a row in every domain's tables, written through the real repositories (a run and its
events, an archived phone call with its turns, a learned fact, a callback and the review, a claimed
ledger job and step, a Discord call with its turns), and what reading it back must show: for the
tests of the commands that only read, and of `switchboard store copy`."""

from __future__ import annotations

from dataclasses import dataclass

from listener.archive import Archive
from listener.callbacks import Callbacks, MutationTokens
from listener.ledger import ExecutionLedger
from listener.memory import Memory
from listener.model import Fact, Transcript, Turn
from runs.repository import RunRepository
from voice.call.records import CallRecords
from voice.call.usage import CallUsage

AT = 1_765_000_000.0
TASK = "summarise the quarterly logs"
CALLBACK = "weekly-digest"
REVIEW = "Note who called and what they want"
FACT = "The office closes at six on Fridays."
TURNS = ("Hi, it's José from the depot about order 48213.", "Thanks José, I'll note it.",
         "The delivery is booked for Friday.")


@dataclass(frozen=True)
class Filled:
    """The ids the repositories gave what was written."""

    run_id: int
    transcript_id: int
    conversation_id: str
    call_id: int
    calls: int  # archived phone calls


async def fill(store, *, calls: int = 3) -> Filled:
    """Write one of everything (and `calls` archived phone calls) through the repositories."""
    runs = RunRepository(store)
    ticket = await runs.create(lane="command", task=TASK, requester_id=4242, owner="host:1:bot",
                               idempotency_key="fill-1", now=AT, origin="call-7")
    await runs.log(ticket.id, "note", "started for the test", AT + 1)
    await runs.add_receipt(ticket.id, "steer-1", "also check the errors", AT + 1)
    archive = Archive(store)
    first = None
    for n in range(calls):
        turns = tuple(Turn(i, "FROM" if i % 2 == 0 else "TO", text) for i, text in enumerate(TURNS))
        done = await archive.archive(Transcript(f"conv-{n:04d}", turns, source="test", direction="inbound",
                                                from_number="+15550001", to_number="+15550002"),
                                     "{}", received_at=AT + n, user_label="TO")
        first = first or done
    await Memory(store, clock=lambda: AT).save(first.transcript_id, [Fact(FACT, "closes at six", 2, "TO")])
    callbacks = Callbacks(store, clock=lambda: AT)
    await callbacks.register(CALLBACK, "Weekly digest", "Add the call to the weekly digest")
    await callbacks.set_review(REVIEW)
    ledger = ExecutionLedger(store)
    await ledger.claim_job(key=f"{first.transcript_id}:review", transcript_id=first.transcript_id, kind="review", label="review",
                           deliver="archive")
    await ledger.started(f"{first.transcript_id}:review", "run-1")
    await ledger.claim_step(first.transcript_id, "card")
    records = CallRecords(store)
    call_id = await records.start(guild_id=77, voice_channel_id=88, text_channel_id=99, started_by=4242,
                                  mode="always", captions=True, at=AT)
    await records.add_turn(call_id, "user", 4242, "Ana", "what runs are going?", AT + 2)
    await records.add_turn(call_id, "assistant", None, "Switchboard", "one run is going", AT + 3)
    await records.set_totals(call_id, {4242: 1500.0}, CallUsage(responses=1, input_tokens=693, output_tokens=46))
    await records.end(call_id, "everyone left", AT + 4)
    await Memory(store, clock=lambda: AT).save_call(77, call_id, [Fact("Ana owns the deploy.", "I own it", 0, "Ana")])
    await MutationTokens(store, clock=lambda: AT + 10**9).issue(f"{first.transcript_id}:command")
    return Filled(ticket.id, first.transcript_id, "conv-0000", call_id, calls)
