"""One user turn and the answer to it, as the call core times it: pure data, no I/O.

The core hands these out as `RecordTurn` actions; `voice.call.telemetry` (the shell's side) keeps and
writes them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TurnRecord:
    """Timestamps (seconds on the engine's clock) of one user turn and the answer to it."""

    turn: int
    speech_end: float | None = None
    commit: float | None = None
    response_created: float | None = None
    first_audio_delta: float | None = None
    first_audio_played: float | None = None
    response_done: float | None = None
    tool_ms: float = 0.0
    status: str = ""
    speakers: list[int] = field(default_factory=list)  # immutable user ids of who spoke the turn

    def latencies_ms(self) -> dict[str, float]:
        """Milliseconds from end of speech to each later mark (absent marks are omitted)."""
        if self.speech_end is None:
            return {}
        out = {}
        for name in ("commit", "response_created", "first_audio_delta", "first_audio_played", "response_done"):
            value = getattr(self, name)
            if value is not None:
                out[name] = round((value - self.speech_end) * 1000, 1)
        return out

    def to_json(self) -> dict:
        data = asdict(self)
        data["latency_ms"] = self.latencies_ms()
        return data
