"""Per-turn latency records: kept in memory for talk_status, optionally written as JSON lines.

The call core only builds `TurnRecord`s and hands them out as actions; the engine records them here.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path

from voice.call.turn_record import TurnRecord

log = logging.getLogger(__name__)

__all__ = ["Telemetry", "TurnRecord"]


class Telemetry:
    def __init__(self, keep: int = 50, path: Path | None = None) -> None:
        self.recent: deque[TurnRecord] = deque(maxlen=keep)
        self.count = 0  # every turn recorded, not just the `keep` most recent
        self._path = path

    def record(self, turn: TurnRecord) -> None:
        """Keep the record (and append it to the JSON-lines file, when there is one). Shell-side I/O."""
        self.count += 1
        self.recent.append(turn)
        if self._path is not None:
            try:
                with self._path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(turn.to_json()) + "\n")
            except OSError as exc:
                log.warning("could not write latency record to %s: %s", self._path, exc)

    def summary(self) -> dict:
        firsts = sorted(t.latencies_ms()["first_audio_delta"] for t in self.recent
                        if "first_audio_delta" in t.latencies_ms())
        return {"turns": len(self.recent),
                "median_first_audio_ms": firsts[len(firsts) // 2] if firsts else None}
