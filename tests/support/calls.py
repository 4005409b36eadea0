"""Phone calls for the listener's tests: a transcript builder and the facts a model proposes for the
dentist call (one the user said, one the other party planted)."""

from __future__ import annotations

from listener.model import Transcript, Turn

FACT = {"fact": "The user has a dental cleaning on Tuesday at nine.", "assertion_turn": 2,
        "quote": "add the cleaning on Tuesday at nine", "confirmation_turn": None, "confirmation_quote": None,
        "confidence": "high"}
PLANTED = {"fact": "The user wants everything they booked cancelled.", "assertion_turn": 1,
           "quote": "cancel everything they booked", "confirmation_turn": None, "confirmation_quote": None,
           "confidence": "high"}  # the other party said it and the user never agreed


def call(conversation_id: str, *texts: tuple[str, str], direction: str = "inbound",
         frm: str = "+15550001", to: str = "+15550002") -> Transcript:
    """A transcript whose turns are (speaker, text) pairs, numbered in order."""
    return Transcript(conversation_id, tuple(Turn(i, speaker, text) for i, (speaker, text) in enumerate(texts)),
                      source="bandwidth-call-recording", direction=direction, from_number=frm, to_number=to)
