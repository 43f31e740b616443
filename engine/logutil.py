"""Logging that untrusted clients cannot turn into a flood: one line per kind per interval, with a count of what
was suppressed in between."""
from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """``log(kind, msg, *args)`` writes the first event of a kind at once, then at most one line per ``interval_s``
    for that kind, saying how many were not written. Kinds are few (a fixed set chosen by the caller, never a
    client's input), so the table stays small."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, clock=time.monotonic):
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._next: dict = {}  # kind -> time of the next line allowed
        self._suppressed: dict = {}  # kind -> events not logged since the last line

    def log(self, level: int, kind, msg: str, *args, exc_info=None) -> bool:
        """Log or count one event; True when a line was written."""
        now = self.clock()
        if now < self._next.get(kind, 0.0):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._next[kind] = now + self.interval_s
        n = self._suppressed.pop(kind, 0)
        if n:
            msg += " (%d more like it in the last %.0f s not logged)"
            args = (*args, n, self.interval_s)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
