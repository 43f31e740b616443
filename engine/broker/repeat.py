"""The repeat route of one connection: its state in one object (issue 15: it was six attributes of Connection).

A client sends the same heartbeat every 30 s. The route answers such a repeat without decoding it or running the
registry's rules: the connection's :class:`engine.FrameDecoder`, once armed on the heartbeat's frame, hands back
only the opaque of a later frame equal to it but for the opaque; the armed answer
(:class:`engine.broker.processors.HeartbeatRepeat`) refreshes the registry slot on its token and encodes the answer from a
template. Everything else about a heartbeat goes through the full path (``RemotingServer.dispatch`` ->
``Processors.heart_beat`` -> ``ClientRegistry.heartbeat``), which is also what offers the route its next arming.
"""
from __future__ import annotations

from engine.codec.errors import FrameError

__all__ = ["RepeatRoute"]


def _stands_for(decoder, cmd) -> bool:
    """Whether the decoder's armed frame, carrying ``cmd``'s opaque, is the request ``cmd``. The armed frame may be
    another request's: with a longer opaque (up to 10 more digits) it can be over the frame limit, which the decoder
    refuses (FrameError); ``cmd`` itself was decoded within the limit, so that frame is not ``cmd``."""
    try:
        return decoder.repeat_command(cmd.opaque) == cmd
    except FrameError:
        return False


class RepeatRoute:
    """The repeat route's state for one connection (``Connection.route``).

    Attributes:

    * ``body`` / ``hb``: the body of the last heartbeat decoded in full on this connection and its decoded
      (immutable) HeartbeatData, reused when the next full-path heartbeat carries the same bytes.
    * ``norepeat``: a body the route is not offered again: its frame could not be armed, or it has a subscription
      without subVersion (Java stamps such a subscription anew at every heartbeat: decoded every time).
    * ``candidate``: ``(armed answer, command)`` offered by the heartbeat processor during a read (the registry
      gave a token for that heartbeat); taken by :meth:`arm` once the read's requests are dispatched.
    * ``armed``: the armed answer (HeartbeatRepeat) that answers the decoder's repeats, or None.

    Invariants (what the connection, the heartbeat processor and the tests rely on):

    1. ``body is None`` if and only if ``hb is None``; when set, ``hb`` is ``decode_heartbeat(body)``.
    2. ``armed is not None`` implies the decoder is repeating, and the decoder's armed frame, decoded with any
       opaque, is the request the armed answer was made for (with that opaque). The converse does not hold: a
       decoder left repeating with ``armed`` None hands back opaques that the connection replays through the full
       path (``decoder.repeat_command``).
    3. ``armed`` answers only while the registry's token holds (``ClientRegistry.heartbeat_repeat``); the first
       repeat it cannot answer clears ``armed``, and that repeat and the rest of the read take the full path. A
       read that replayed a repeat and ends without a new arming disarms the decoder.
    4. ``candidate`` never outlives the read that set it: :meth:`arm` clears it before anything else; a closing
       connection arms nothing.
    5. Once armed on the frame of the cached heartbeat, ``body`` is the decoder's ``repeat_body`` (one copy of the
       body per connection, not two).
    6. A oneway heartbeat (flag bit ONEWAY) is never offered: the armed answer answers every repeat, and a oneway
       request is never answered. The flag is in the frame outside the opaque, so a route armed on an answered
       heartbeat never takes a oneway frame as its repeat: those take the full path (which answers nothing).
    7. Where the server runs no repeat route (ACL on, recording on, ``server.repeats`` False) the decoder watches
       no code, nothing is offered, and ``armed`` stays None; ``body`` / ``hb`` still cache the decode.
    """

    __slots__ = ("body", "hb", "norepeat", "candidate", "armed")

    def __init__(self):
        self.body: bytes | None = None
        self.hb = None
        self.norepeat: bytes | None = None
        self.candidate: tuple | None = None
        self.armed = None

    def __repr__(self) -> str:
        state = "armed" if self.armed is not None else "candidate" if self.candidate is not None else "idle"
        return f"<RepeatRoute {state} body={None if self.body is None else len(self.body)}>"

    def offer(self, answer, cmd) -> None:
        """The heartbeat processor's candidate: ``answer`` (HeartbeatRepeat) answers repeats of ``cmd``."""
        self.candidate = (answer, cmd)

    def arm(self, closing: bool, decoder) -> None:
        """Take the candidate at the end of a read: on the decoder's armed frame if that is the candidate's
        request (the registry re-armed after a change), else by arming the decoder on this read's last heartbeat
        frame if it is; a frame that cannot be armed is not offered again (``norepeat``)."""
        answer, cmd = self.candidate
        self.candidate = None
        if closing:
            return
        if decoder.repeating and _stands_for(decoder, cmd):
            self.armed = answer
            return
        self.armed = None
        frame = decoder.watched
        if frame is None:
            return
        if decoder.arm_repeat(frame):
            if _stands_for(decoder, cmd):
                self.armed = answer
                if self.body == cmd.body:
                    self.body = decoder.repeat_body  # invariant 5
                return
            decoder.disarm_repeat()
        self.norepeat = cmd.body
