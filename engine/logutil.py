"""Logging that untrusted clients cannot turn into a flood or a forgery: at most a few lines per kind per
interval, with a count of what was suppressed in between, and client texts with their control characters escaped
(a newline in a client id cannot start a line of its own in the log, an ESC cannot reach the operator's
terminal)."""
from __future__ import annotations

import logging
import re
import time

#: C0 and C1 control characters, DEL, and the Unicode line and paragraph separators (a terminal or a log viewer
#: may break a line at them)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: the same but for line ends and tabs, kept in text meant to span lines (a help text, a report)
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(m) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_text(value) -> str:
    """``value`` as text with every control character visibly escaped (``\\n``, ``\\r``, ``\\t``, ``\\x1b``,
    ``\\u2028``): what goes into a log line or onto a terminal from a client or a file. Text without control
    characters is returned unchanged (the common case costs one regex search)."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_escape_one, text) if _CONTROL.search(text) else text


def escape_args(args: tuple) -> tuple:
    """A log call's arguments with texts escaped (numbers kept as they are, for %d)."""
    return tuple(a if a is None or isinstance(a, (int, float)) else escape_text(a) for a in args)


class EscapingFormatter(logging.Formatter):
    """A formatter whose message has its control characters escaped (the traceback of ``exc_info`` keeps its
    lines): whatever a caller forgot to escape, one record is one line."""

    def formatMessage(self, record):
        record.message = escape_text(record.message)
        return super().formatMessage(record)

    def formatException(self, ei):
        """The traceback's lines, with their control characters but line ends escaped, and a line that starts
        with a digit (a log header's date: an exception's message may hold a client's text and newlines)
        indented, so it reads as part of the traceback, never as a record of its own."""
        text = super().formatException(ei)
        if _CONTROL_BUT_LINES.search(text):
            text = _CONTROL_BUT_LINES.sub(_escape_one, text)
        return "\n".join("  " + line if line[:1].isdigit() else line for line in text.split("\n"))


class EscapedWriter:
    """A text stream for the operator's terminal: control characters written through it are escaped.

    ``lines=False`` (for whole program output, help texts included): line ends and tabs pass, everything else
    (ESC, BEL, CR, ...) is escaped. ``lines=True`` (for ``print`` of lines that hold file or client data): a
    write that is exactly ``print``'s line end passes, every control character in any other write is escaped, so
    a newline in a client id cannot make a line of its own."""

    def __init__(self, stream, lines: bool = False):
        self._stream, self._lines = stream, lines

    def write(self, text) -> int:
        if self._lines:
            out = text if text == "\n" else escape_text(text)
        else:
            out = _CONTROL_BUT_LINES.sub(_escape_one, text) if _CONTROL_BUT_LINES.search(text) else text
        self._stream.write(out)
        return len(text)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, buffer...
        return getattr(self._stream, name)


class RateLimitedLog:
    """``log(level, kind, msg, *args)`` writes at most ``burst`` lines of a kind per ``interval_s`` window; the
    first line of the next window says how many were left out. Kinds are few (a fixed set chosen by the caller,
    never a client's input), so the table stays small. The arguments (addresses, reasons, errors: often a
    client's) are escaped and clipped to ``max_arg`` characters."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, burst: int = 1, clock=time.monotonic,
                 max_arg: int = 512):
        self.logger, self.interval_s, self.burst, self.clock = logger, interval_s, burst, clock
        self.max_arg = max_arg
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
        self.logger.log(level, msg, *(_clip(a, self.max_arg) for a in escape_args(args)), exc_info=exc_info)
        return True


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters ("..." marks a cut): untrusted names echoed in answers and in
    log lines (engine.codec.errors re-exports it)."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def _clip(value, limit: int):
    return clip(value, limit) if isinstance(value, str) else value
