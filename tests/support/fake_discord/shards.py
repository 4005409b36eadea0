"""Discord's sharding and session start limit, as the fake gateway applies them.

Facts (Discord's gateway docs, "Sharding", "Identifying", "Get Gateway Bot"):
- IDENTIFY may carry `shard: [shard_id, num_shards]`; a guild's events go to the sessions whose
  `shard_id == (guild_id >> 22) % num_shards`; DMs go to shard 0 only. Without `shard` a session is
  `[0, 1]`. A malformed shard closes with 4010 (invalid shard); a session that would hold more than
  2,500 guilds closes with 4011 (sharding required). Several sessions may hold the same shard; each
  receives its events.
- `GET /gateway/bot` answers `url`, the recommended `shards` and `session_start_limit`
  `{total, remaining, reset_after (ms), max_concurrency}`.
- At most `max_concurrency` IDENTIFYs per 5 s, one per bucket `shard_id % max_concurrency`; one over
  is answered with op 9 Invalid Session. Each session start takes one from `remaining` (RESUMEs are
  free); past the daily limit Discord ends every session and resets the token.

The identify rate is enforced only when `Sharding(enforce_identify_rate=True)`: the fake's default
serves one bot that restarts at will, as it always did. Every IDENTIFY is recorded either way
(`Sharding.identifies`), with whether it came too soon for its bucket.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

INVALID_SHARD, SHARDING_REQUIRED = 4010, 4011
IDENTIFY_WINDOW_S = 5.0
DAY_MS = 86_400_000


def shard_of(guild_id: int, num_shards: int) -> int:
    """The shard that receives `guild_id`'s events among `num_shards`."""
    return (guild_id >> 22) % num_shards


def parse_shard(value: Any) -> tuple[int, int] | None:
    """IDENTIFY's `shard` as (shard_id, num_shards); None when Discord would close with 4010."""
    if value is None:
        return 0, 1
    if not isinstance(value, list) or len(value) != 2:
        return None
    shard_id, num_shards = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        return None
    return shard_id, num_shards


@dataclass
class IdentifyRecord:
    """One IDENTIFY the gateway received (valid token and intents)."""

    at: float  # the fake's clock
    shard: tuple[int, int] | None  # None when the shard field was invalid
    bucket: int | None  # shard_id % max_concurrency
    too_soon: bool  # another IDENTIFY of this bucket was admitted less than 5 s before
    outcome: str  # "ready", "invalid_session" (op 9), "invalid_shard", "sharding_required", "limit_spent"


@dataclass
class Sharding:
    """What `GET /gateway/bot` answers and how the gateway admits IDENTIFYs (see the module text).

    `max_guilds_per_shard` is Discord's 2,500; a test lowers it to provoke 4011 with a few guilds."""

    recommended_shards: int = 1
    max_concurrency: int = 1
    total: int = 1000
    remaining: int = 1000
    max_guilds_per_shard: int = 2500
    enforce_identify_rate: bool = False
    clock: Callable[[], float] = time.monotonic
    identifies: list[IdentifyRecord] = field(default_factory=list)
    _bucket_last: dict[int, float] = field(default_factory=dict)
    _reset_at: float | None = None

    def gateway_bot(self, url: str) -> dict:
        self._roll_day()
        return {"url": url, "shards": self.recommended_shards, "session_start_limit": {
            "total": self.total, "remaining": self.remaining,
            "reset_after": max(0, int((self._reset_at - self.clock()) * 1000)),
            "max_concurrency": self.max_concurrency}}

    def admit(self, raw_shard: Any, guild_ids: list[int]) -> tuple[str, tuple[int, int] | None]:
        """Decide one IDENTIFY: ("ready", shard) or the outcome that refuses it (see IdentifyRecord)."""
        self._roll_day()
        now, shard = self.clock(), parse_shard(raw_shard)
        if shard is None:
            return self._record(now, None, None, False, "invalid_shard"), None
        bucket = shard[0] % self.max_concurrency
        last = self._bucket_last.get(bucket)
        too_soon = last is not None and now - last < IDENTIFY_WINDOW_S
        held = sum(1 for g in guild_ids if shard_of(g, shard[1]) == shard[0])
        if held > self.max_guilds_per_shard:
            return self._record(now, shard, bucket, too_soon, "sharding_required"), shard
        if too_soon and self.enforce_identify_rate:
            return self._record(now, shard, bucket, too_soon, "invalid_session"), shard
        if self.remaining <= 0:
            return self._record(now, shard, bucket, too_soon, "limit_spent"), shard
        self.remaining -= 1
        self._bucket_last[bucket] = now
        return self._record(now, shard, bucket, too_soon, "ready"), shard

    def bucket_violations(self) -> list[IdentifyRecord]:
        """Admitted IDENTIFYs that came less than 5 s after another of their bucket."""
        return [r for r in self.identifies if r.too_soon and r.outcome == "ready"]

    def _record(self, now: float, shard: tuple[int, int] | None, bucket: int | None, too_soon: bool,
                outcome: str) -> str:
        self.identifies.append(IdentifyRecord(now, shard, bucket, too_soon, outcome))
        return outcome

    def _roll_day(self) -> None:
        now = self.clock()
        if self._reset_at is None:
            self._reset_at = now + DAY_MS / 1000
        elif now >= self._reset_at:
            self.remaining, self._reset_at = self.total, now + DAY_MS / 1000
