"""Logging that untrusted clients cannot turn into a flood: at most a few lines per kind per interval, with a
count of what was suppressed in between."""
from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """``log(level, kind, msg, *args)`` writes at most ``burst`` lines of a kind per ``interval_s`` window; the
    first line of the next window says how many were left out. Kinds are few (a fixed set chosen by the caller,
    never a client's input), so the table stays small."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, burst: int = 1, clock=time.monotonic):
        self.logger, self.interval_s, self.burst, self.clock = logger, interval_s, burst, clock
        self._windows: dict = {}  # kind -> [window start, lines written in it, events left out]

    def log(self, level: int, kind, msg: str, *args, exc_info=None) -> bool:
        """Log or count one event; True when a line was written."""
        now = self.clock()
        w = self._windows.get(kind)
        if w is None or now - w[0] >= self.interval_s:
            left_out = w[2] if w is not None else 0
            w = self._windows[kind] = [now, 0, 0]
            if left_out:
                msg += " (%d more like it in the last %.0f s not logged)"
                args = (*args, left_out, self.interval_s)
        if w[1] >= self.burst:
            w[2] += 1
            return False
        w[1] += 1
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
