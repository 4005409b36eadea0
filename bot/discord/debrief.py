"""After a Discord voice call: what the operators said becomes memory, under the phone calls' rules.

Read in the order it happens:

1. `call_transcript`: the call's turns (`voice.call.records.CallRecord`, its last turns, oldest
   first) become the listener's transcript model. A person's turn is labelled with their immutable
   user id (as text), their display name rides along as data only; the assistant's turns are
   labelled `assistant`; a turn nobody was attributed to is `unattributed`. A turn's number is its
   seq, so each fact's provenance is the call's own turn.
2. A call in which no operator spoke is not sent to the model: nothing in it could be accepted.
   Nor is a call already debriefed.
3. One structured request (`listener.extract.extract_facts` over the shared `TextModel`) proposes.
4. `listener.memory.validate` decides with the phone calls' rules, trusting exactly the operators'
   ids (`Trust.operators`): stated by an operator, or by someone else and confirmed by an operator
   in a later turn with no negation, each with a verbatim quote; never a display name.
5. `Memory.save_call` stores the accepted facts with their guild, call and turns, and records the
   call as debriefed in the same transaction: the next call starts knowing them (`known_facts`),
   `memory_search` finds them, and a second debrief adds nothing.

`debrief_call` never raises for the model's failure: the result says why (the caller logs it).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.text_model import TextModel
from listener.extract import ExtractionError, extract_facts
from listener.memory import Memory, Trust, validate
from listener.model import Transcript, Turn
from listener.repository import Database
from voice.call.records import CallRecord

ASSISTANT = "assistant"  # the assistant's speaker label: never an operator's (those are digits)
UNATTRIBUTED = "unattributed"  # a person's turn with no speaker id: never trusted
SOURCE = "discord call"


@dataclass(frozen=True)
class DebriefResult:
    """What one debrief did: `accepted` facts passed the rules, `added` of them were new in memory,
    `rejected` did not (one reason each in `reasons`, for the log). `skipped` says why the model was
    not asked; `error` why its answer could not be used (one line, no secrets)."""

    call_id: int
    accepted: int = 0
    rejected: int = 0
    added: int = 0
    reasons: tuple[str, ...] = ()
    skipped: str | None = None
    error: str | None = None

    @property
    def summary(self) -> str:
        if self.error is not None:
            return f"call {self.call_id}: no facts learned: {self.error}"
        if self.skipped is not None:
            return f"call {self.call_id}: not debriefed: {self.skipped}"
        return (f"call {self.call_id}: {self.added} fact{'s' * (self.added != 1)} learned, "
                f"{self.rejected} rejected")


def speaker_label(turn_role: str, speaker_id: int | None) -> str:
    """The label a call turn's speaker carries: the user id as text, or `assistant`/`unattributed`."""
    if turn_role != "user":
        return ASSISTANT
    return UNATTRIBUTED if speaker_id is None else str(speaker_id)


def call_transcript(record: CallRecord) -> Transcript:
    """The call's turns in the listener's model: turn number = seq (index seq - 1), speaker = label,
    display name as data."""
    return Transcript(f"discord-call-{record.id}", tuple(
        Turn(t.seq - 1, speaker_label(t.role, t.speaker_id), t.text, name=t.name) for t in record.turns),
        source=SOURCE)


async def debrief_call(record: CallRecord, *, operators: frozenset[int], model: TextModel,
                       store: Database) -> DebriefResult:
    """Learn the call's durable facts (see the module docstring); the result says what happened."""
    if not any(t.role == "user" and t.speaker_id is not None and t.speaker_id in operators for t in record.turns):
        return DebriefResult(record.id, skipped="no operator spoke in the call")
    memory = Memory(store)
    if await memory.debriefed(record.id):
        return DebriefResult(record.id, skipped="the call was debriefed already")
    transcript = call_transcript(record)
    trust = Trust.operators(str(o) for o in operators)
    try:
        answer = await extract_facts(model, transcript, trust)
    except ExtractionError as exc:
        return DebriefResult(record.id, error=str(exc)[:300])
    except Exception as exc:  # whatever the model's client did, the call's end goes on
        return DebriefResult(record.id, error=f"the text model could not be asked ({type(exc).__name__})")
    checked = validate(answer, transcript, trust)
    reasons = tuple(r.reason for r in checked.rejected)
    added = await memory.save_call(record.guild_id, record.id, checked.accepted, rejected=len(checked.rejected))
    if added is None:  # another debrief of this call finished while the model was thinking
        return DebriefResult(record.id, len(checked.accepted), len(checked.rejected), 0, reasons,
                             skipped="the call was debriefed already")
    return DebriefResult(record.id, len(checked.accepted), len(checked.rejected), added, reasons)
