"""The repeat route of one connection: its state in one object (issue 15: it was six attributes of Connection).

A client sends the same heartbeat every 30 s. The route answers such a repeat without decoding it or running the
registry's rules: the connection's :class:`engine.FrameDecoder`, once armed on the heartbeat's frame, hands back
only the opaque of a later frame equal to it but for the opaque and the order of its body's sets; the armed answer
(:class:`engine.broker.processors.HeartbeatRepeat`) refreshes the registry slot on its token and encodes the answer from a
template. Everything else about a heartbeat goes through the full path (``RemotingServer.dispatch`` ->
``Processors.heart_beat`` -> ``ClientRegistry.heartbeat``), which is also what offers the route its next arming.
"""
from __future__ import annotations

import sys

from engine.codec.errors import FrameError

__all__ = ["CacheBudget", "RepeatRoute", "decoded_cost"]

_sizeof = sys.getsizeof
#: what one code of a subscription's codeSet takes: an int object (28 bytes, 32 as allocated) and its tuple slot
_CODE_COST = 32
#: what the allocator adds to each tag's string on average (sizes are rounded up to 16 bytes)
_TAG_ROUNDING = 8


def decoded_cost(hb) -> int:
    """The bytes a decoded heartbeat (HeartbeatData, native or twin) holds: every object of it as ``sys.getsizeof``
    sees it (the data objects, their tuples, strings and codes), each counted as its own (strings or ints the
    decoder may share are counted anyway). Within a few percent of what tracemalloc measures for both decoders
    (tests/test_heartbeat_cache_budget.py); a 13.4 MB body of many small tags decodes to ~3-4 times its size.
    Linear in the tags, as the decode was."""
    n = _sizeof(hb) + _sizeof(hb.client_id) + _sizeof(hb.producers) + _sizeof(hb.consumers)
    for p in hb.producers:
        n += _sizeof(p) + _sizeof(p.group)
    for cd in hb.consumers:
        subs = cd.subscriptions
        n += _sizeof(cd) + _sizeof(cd.group) + _sizeof(subs)
        for sd in subs:
            tags, codes = sd.tags, sd.codes
            n += (_sizeof(sd) + _sizeof(sd.topic) + _sizeof(sd.sub_string) + _sizeof(sd.sub_version)
                  + _sizeof(sd.expression_type))
            if tags:  # an empty tuple is the shared one
                n += _sizeof(tags) + sum(map(_sizeof, tags)) + _TAG_ROUNDING * len(tags)
            if codes:
                n += _sizeof(codes) + _CODE_COST * len(codes)
    return n


class CacheBudget:
    """maxHeartbeatCacheBytesTotal: the heartbeat bytes every connection of a server keeps after its reads, together.

    What a connection keeps (:class:`RepeatRoute`): the body of its last heartbeat decoded in full with its decode
    (counted as what the decoded objects hold, :func:`decoded_cost`: 3-4 times the body for one of many small tags),
    the body no longer offered the repeat route (``norepeat``) and the decoder's armed repeat pattern (counted as the
    armed frame's header and body), each distinct bytes object once. ``used`` is their sum over the connections,
    ``full`` the heartbeats whose body or arming did not fit (that heartbeat keeps nothing: no cached decode, no
    repeat route; its answer is the same). ``limit`` None: no limit (a route on its own, in tests).
    Invariant: ``0 <= used <= limit``; ``used`` is 0 once every connection has closed."""

    __slots__ = ("limit", "used", "full")

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.used = 0
        self.full = 0

    def __repr__(self) -> str:
        return f"<CacheBudget {self.used}/{self.limit} full={self.full}>"


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
       path (``decoder.repeat_command``). The decoder is armed with ``sets=True``: a frame whose body differs from
       the armed one only in the order of its sets (a Java client's HashSet order; ``body_digest``) is a repeat
       too, the same registration, which the rules read the same way; its replay carries the armed frame's order.
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
    7. Where the server runs no repeat route (ACL on, recording on, ``server.repeats`` False,
       maxHeartbeatCacheBytesTotal 0) the decoder watches no code, nothing is offered, and ``armed`` stays None;
       ``body`` / ``hb`` still cache the decode (within the budget).
    8. Budget (:class:`CacheBudget`): ``kept`` is what this route has charged to ``budget.used``, the bytes of
       ``body`` with its decode (``cost``, :func:`decoded_cost`), ``norepeat`` and the armed pattern it made (``pattern``: its body; ``head``: the rest, counted as the
       armed frame's header), each distinct object once. A new body (:meth:`keep`, :meth:`keep_norepeat`) or arming (:meth:`arm`) that would take ``used`` past
       the limit keeps nothing for that heartbeat (``budget.full`` += 1): no cached decode, not offered, not armed.
       :meth:`release` (the connection closes) drops everything and gives ``kept`` back; the route keeps nothing
       after it.
    """

    __slots__ = ("body", "hb", "cost", "norepeat", "candidate", "armed", "budget", "kept", "pattern", "head", "closed")

    def __init__(self, budget: CacheBudget | None = None):
        self.body: bytes | None = None
        self.hb = None
        self.cost = 0  # what ``hb`` holds (decoded_cost), charged with ``body``
        self.norepeat: bytes | None = None
        self.candidate: tuple | None = None
        self.armed = None
        self.budget = CacheBudget() if budget is None else budget
        self.kept = 0
        # the armed pattern's body when this route armed the decoder, and the bytes charged beside it (two slots, not a
        # tuple: an armed connection costs no object more; a header's length is mostly a cached small int)
        self.pattern: bytes | None = None
        self.head = 0
        self.closed = False

    def __repr__(self) -> str:
        state = "armed" if self.armed is not None else "candidate" if self.candidate is not None else "idle"
        return f"<RepeatRoute {state} body={None if self.body is None else len(self.body)}>"

    def _charge(self) -> int:
        """The bytes this route's state keeps: each distinct body once (the cached one with its decode), the pattern
        as its frame's header + body."""
        body, nr, pat = self.body, self.norepeat, self.pattern
        n = 0 if body is None else len(body) + self.cost
        if nr is not None and nr is not body:
            n += len(nr)
        if pat is not None:
            n += self.head
            if pat is not body and pat is not nr:
                n += len(pat)
        return n

    def _settle(self) -> None:
        """Charge the budget what the state keeps now (only ever less than before, or checked by _fits)."""
        n = self._charge()
        self.budget.used += n - self.kept
        self.kept = n

    def _fits(self) -> bool:
        """Whether the state as it is now fits in the budget (the other routes' bytes + this one's)."""
        limit = self.budget.limit
        return not self.closed and (limit is None or self.budget.used - self.kept + self._charge() <= limit)

    def keep(self, body: bytes, hb) -> bool:
        """Cache ``body`` / its decode ``hb`` (a heartbeat decoded in full whose body is not ``self.body``). False,
        with nothing cached (the previous body is dropped as well), when the budget cannot take it."""
        pat = self.pattern
        if pat is not None and pat == body:  # the armed pattern's body (a oneway copy of it, say): one copy
            body = pat
        self.body, self.hb, self.cost = body, hb, decoded_cost(hb)
        if self._fits():
            self._settle()
            return True
        self.body = self.hb = None
        self.cost = 0
        self._settle()
        if not self.closed:
            self.budget.full += 1
        return False

    def keep_norepeat(self, body: bytes) -> None:
        """A body that is decoded every time (a subscription without subVersion): no cached decode, and it is
        remembered as ``norepeat`` where the budget takes it (the caller does not offer it either way)."""
        self.body = self.hb = None
        self.cost = 0
        self.norepeat = body
        if not self._fits():
            self.norepeat = None
            if not self.closed:
                self.budget.full += 1
        self._settle()

    def disarm(self, decoder) -> None:
        """Disarm the decoder; the pattern's bytes leave the budget."""
        decoder.disarm_repeat()
        if self.pattern is not None:
            self.pattern = None
            self._settle()

    def release(self, decoder=None) -> None:
        """The connection closes: keep nothing from now on (the decoder's pattern and watched frame go too)."""
        self.closed = True
        self.body = self.hb = self.norepeat = self.candidate = self.armed = self.pattern = None
        self.cost = 0
        if decoder is not None:
            decoder.disarm_repeat()
            decoder.drop_watched()
        self._settle()

    def offer(self, answer, cmd) -> None:
        """The heartbeat processor's candidate: ``answer`` (HeartbeatRepeat) answers repeats of ``cmd``."""
        self.candidate = (answer, cmd)

    def arm(self, closing: bool, decoder) -> None:
        """Take the candidate at the end of a read: on the decoder's armed frame if that is the candidate's
        request (the registry re-armed after a change), else by arming the decoder on this read's last heartbeat
        frame if it is; a frame that cannot be armed is not offered again (``norepeat``)."""
        answer, cmd = self.candidate
        self.candidate = None
        if closing or self.closed:
            return
        if decoder.repeating and _stands_for(decoder, cmd):
            self.armed = answer
            return
        self.armed = None
        frame = decoder.watched
        if frame is None:
            return
        body = cmd.body
        shared = self.body == body  # then the pattern's body becomes the cached one (invariant 5)
        head = len(frame) - 8 - len(body)  # the pattern: the frame's header (less the opaque) and body
        # budget: the new pattern replaces the old one (arm_repeat does); checked before the work of arming
        old, old_head = self.pattern, self.head
        self.pattern, self.head = (self.body if shared else body), head
        fits = self._fits()
        self.pattern, self.head = old, old_head
        if not fits:
            self.disarm(decoder)
            self.budget.full += 1
            return
        if decoder.arm_repeat(frame, sets=True):
            if _stands_for(decoder, cmd):
                self.armed = answer
                self.pattern, self.head = decoder.repeat_body, head
                if shared:
                    self.body = decoder.repeat_body  # invariant 5
                self._settle()
                return
            decoder.disarm_repeat()
        self.pattern = None
        self.norepeat = self.body if shared else body  # the cached object where it is the same body: no copy
        if not self._fits():
            self.norepeat = None
            self.budget.full += 1
        self._settle()
