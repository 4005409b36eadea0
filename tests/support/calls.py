"""Phone calls for the listener's tests: a transcript builder, the facts a model proposes for the
dentist call (one the user said, one the other party planted), and a realistic dialogue repeated to
any size (Markdown or JSON) for the memory and size limits."""

from __future__ import annotations

import json

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


# A call as it sounds: short answers and long explanations, one speaker after the other (92
# characters a turn on average). `dialogue_markdown`/`dialogue_json` repeat it up to a size.
DIALOGUE = (
    ("TO", "Good morning, Dr. Patel's office, this is Erica speaking. How can I help you today?"),
    ("FROM", "Hi Erica, I'm calling to move my daughter's cleaning. Maya has a school trip on the fourteenth, "
             "so Tuesday won't work for us any more."),
    ("TO", "Of course. Let me pull up her file. Can you confirm her date of birth for me?"),
    ("FROM", "March third, two thousand sixteen."),
    ("TO", "Thank you. I have a few openings next week: Monday at nine, Wednesday at two thirty, or Friday at "
           "eleven. Does any of those work for you?"),
    ("FROM", "Wednesday at two thirty is best, I can pick her up from school early that day. And please note "
             "she's allergic to penicillin, in case that matters."),
    ("TO", "It's already on her chart, but thank you for mentioning it. You're all set for Wednesday at two "
           "thirty."),
    ("FROM", "Great, thanks so much."),
)


def _clock(ms: int) -> str:
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def dialogue_markdown(size: int) -> bytes:
    """The dialogue as Markdown blocks (numbered, timed), repeated to at most `size` bytes."""
    blocks, total, i = [], 0, 0
    while True:
        speaker, text = DIALOGUE[i % len(DIALOGUE)]
        block = f"{i + 1}\n[{_clock(i * 4000)} --> {_clock(i * 4000 + 3500)}]\n**{speaker}**: {text}\n\n".encode()
        if total + len(block) > size:
            return b"".join(blocks)
        blocks.append(block)
        total += len(block)
        i += 1


def dialogue_json(size: int, conversation_id: str = "call_long") -> bytes:
    """The dialogue as a JSON transcript (timestamps, turn ids), repeated to at most `size` bytes."""
    head = json.dumps({"conversation_id": conversation_id, "source": "bandwidth-call-recording",
                       "participants": {"TO": "TO", "FROM": "FROM"}})[:-1] + ', "turns": ['
    turns, total, i = [], len(head) + 2, 0
    while True:
        speaker, text = DIALOGUE[i % len(DIALOGUE)]
        turn = json.dumps({"speaker": speaker, "text": text, "timestamp": i * 4.0, "turn_id": f"t{i + 1}"})
        if total + len(turn) + 2 > size:
            return (head + ", ".join(turns) + "]}").encode()
        turns.append(turn)
        total += len(turn) + 2
        i += 1
