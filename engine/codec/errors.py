"""Error hierarchy. Every decoding failure is a RemotingError *and* a ValueError, and says where it happened."""
from engine.logutil import clip  # noqa: F401  (re-exported: untrusted names clipped in answers and messages)

#: Longest piece of untrusted input an error message may echo.
MAX_ECHO = 32


class RemotingError(Exception):
    """Base of every error this package raises for bad wire input or protocol misuse."""


class FrameError(RemotingError, ValueError):
    """A remoting frame (length prefix, header word, JSON or ROCKETMQ header) is malformed."""


class HeartbeatError(RemotingError, ValueError):
    """A HeartbeatData body is malformed; the message names the JSON path or byte offset."""


def echo(data) -> str:
    """A short, safe rendering of untrusted input for error messages."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data[:MAX_ECHO])
        return repr(data) + ("..." if len(data) == MAX_ECHO else "")
    text = str(data)
    return repr(text[:MAX_ECHO]) + ("..." if len(text) > MAX_ECHO else "")
