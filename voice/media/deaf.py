"""The deaf detector: audio arrives but nothing decodes — say so instead of sitting in silence."""

from __future__ import annotations


class DeafDetector:
    """Flags "packets or SPEAKING arrive, but no PCM comes out" lasting `window_s` seconds.

    Pure: fed counters and a time by `poll`, so the per-packet path reads no clock.
    """

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.deaf = False
        self._activity = 0
        self._pcm = 0
        self._since: float | None = None

    def poll(self, now: float, activity: int, pcm: int) -> bool:
        """Return True exactly when the receiver has just become deaf."""
        if pcm != self._pcm:
            self._pcm, self._activity, self._since, self.deaf = pcm, activity, None, False
            return False
        if activity != self._activity:
            self._activity = activity
            if self._since is None:
                self._since = now
        if self._since is not None and not self.deaf and now - self._since >= self.window_s:
            self.deaf = True
            return True
        return False
