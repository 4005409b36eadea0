"""Hearing health per member: whose audio keeps arriving but never becomes sound.

The channel-wide deaf detector (`deaf.py`) cannot see one broken member among others who are
heard: PCM keeps flowing, so it never fires, and that member talks into the void. This ledger
counts, per user id, the packets that reached them and failed (DAVE decrypt or Opus decode) and
the frames of theirs that became sound, and flags a member whose failures span `window_s`
seconds with nothing of theirs heard in between.

What counts (the receiver decides, see `Receiver`): only packets already attributed to a user
(op 5 / op 12 / DAVE identification); every `dave_fail:<reason>` and `opus_fail`. No DAVE reason
is exempt by name: a client in a diverged MLS group or sending corrupted frames fails with
`NoValidCryptorFound`, one missing from ours with `NoDecryptorForUser`, one that never encrypts
with `UnencryptedWhenPassthroughDisabled` — the very names that also show up briefly around joins
and epoch changes. Brevity is judged by time instead: a streak must span the whole window, and a
single frame of theirs heard ends it. The unencrypted Opus silence frame (`f8 ff fe`, sent after
every utterance and never DAVE-encrypted) is not "heard": it would end a broken member's streak
at the end of every sentence.

Sans-I/O and not locked: counted per packet (`heard`, `failed`), time enters only through
`poll(now)`. The receiver calls it under its own lock.
"""

from __future__ import annotations

OK, FAILING, UNHEARD = "ok", "failing", "unheard"


class _Member:
    __slots__ = ("ok", "failed", "reason", "ok_seen", "failed_seen", "since", "last", "unheard", "reported")

    def __init__(self) -> None:
        self.ok = 0  # packets of theirs decoded to sound (silence frames excluded)
        self.failed = 0  # packets of theirs that failed DAVE or Opus
        self.reason: str | None = None  # the latest failure's counter name
        self.ok_seen = 0  # counts as of the last poll
        self.failed_seen = 0
        self.since: float | None = None  # poll that first saw the current streak of failures
        self.last = 0.0  # poll that last saw it grow
        self.unheard = False
        self.reported = False


class MemberHearing:
    """Per-member "their packets arrive and fail, nothing of theirs is heard" over `window_s` seconds.

    Callers may rely on:
    * `poll(now)` returns each member once per episode, in the poll where their failures have
      spanned `window_s` seconds (failures first seen at one poll, still growing at a poll
      `window_s` later) with no frame of theirs heard in between;
    * a frame of theirs heard ends the episode (the next breakage is reported again); `forget`
      drops them entirely;
    * `poll(now, hold=True)` keeps episodes unreported (they are returned by a later poll without
      `hold`), for when the whole channel is deaf and one message covers everyone.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._members: dict[int, _Member] = {}

    def heard(self, user_id: int) -> None:
        """One packet of `user_id`'s decoded to sound (not the silence frame)."""
        member = self._members.get(user_id)
        if member is None:
            member = self._members[user_id] = _Member()
        member.ok += 1

    def failed(self, user_id: int, reason: str) -> None:
        """One packet attributed to `user_id` was dropped; `reason` is its counter name."""
        member = self._members.get(user_id)
        if member is None:
            member = self._members[user_id] = _Member()
        member.failed += 1
        member.reason = reason

    def ever_heard(self, user_id: int) -> bool:
        """Whether a frame of theirs ever decoded to sound on this connection."""
        member = self._members.get(user_id)
        return member is not None and member.ok > 0

    def forget(self, user_id: int) -> None:
        self._members.pop(user_id, None)

    def poll(self, now: float, *, hold: bool = False) -> list[int]:
        """User ids that have just become unheard (each once per episode), in first-seen order."""
        reported = []
        for user_id, m in self._members.items():
            if m.ok != m.ok_seen:  # something of theirs was heard: any streak ends here
                m.ok_seen, m.failed_seen = m.ok, m.failed
                m.since, m.unheard, m.reported = None, False, False
                continue
            if m.failed != m.failed_seen:
                m.failed_seen = m.failed
                if m.since is None:
                    m.since = now
                m.last = now
            if m.since is not None and not m.unheard and m.last - m.since >= self.window_s:
                m.unheard = True
            if m.unheard and not m.reported and not hold:
                m.reported = True
                reported.append(user_id)
        return reported

    def health(self) -> dict[int, dict]:
        """user id -> {"state": "ok"|"failing"|"unheard", "ok": n, "failed": n, "reason": str|None}.

        `state` is as of the last poll ("failing": a streak has started but not yet lasted the
        window); the counts are live.
        """
        return {
            user_id: {
                "state": UNHEARD if m.unheard else FAILING if m.since is not None else OK,
                "ok": m.ok,
                "failed": m.failed,
                "reason": m.reason,
            }
            for user_id, m in self._members.items()
        }
