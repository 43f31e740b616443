"""Timeouts that many objects share the loop's timers for: a held 5.x session's Telemetry wait and each native gRPC
connection's keepalive. A loop timer per object costs ~0.6 KB (uvloop's handle, its libuv timer, the callback's
arguments and context); an object due here costs one dict entry, and the objects due in the same tick share one
timer."""
import math

#: the alarms' resolution, s: an alarm is at least its delay late and at most this much more
TICK_S = 0.05


class Alarms:
    """``set(owner, delay)`` calls ``owner.alarm()`` once, ``delay`` s later (up to TICK_S more), and returns the
    tick to ``cancel(owner, tick)`` it by. An owner set again without a cancel is called for each tick it was set
    for; one whose ``alarm()`` raises is reported to ``on_error`` (called while the exception is handled) and the
    others of its tick are still called."""

    __slots__ = ("loop", "due", "on_error", "firing")

    def __init__(self, loop, on_error):
        self.loop = loop
        self.due: dict[int, dict] = {}  # tick -> {owner: None}, in the order they were set
        self.on_error = on_error
        self.firing = 0  # the tick whose owners are being called (0: none)

    def set(self, owner, delay: float) -> int:
        # an owner set while a tick fires goes to a later tick: an owner that sets itself again is not called twice
        tick = max(math.ceil((self.loop.time() + max(0.0, delay)) / TICK_S), self.firing + 1)
        owners = self.due.get(tick)
        if owners is None:
            owners = self.due[tick] = {}
            self.loop.call_at(tick * TICK_S, self._fire, tick)
        owners[owner] = None
        return tick

    def cancel(self, owner, tick: int) -> None:
        owners = self.due.get(tick)
        if owners is not None:
            owners.pop(owner, None)

    def _fire(self, tick: int) -> None:
        owners = self.due.get(tick)
        if owners is None:
            return
        # the tick stays in ``due`` while its owners are called: one that an owner called before it cancels is not
        # called
        self.firing = tick
        try:
            for owner in list(owners):
                if owner not in owners:
                    continue
                del owners[owner]
                try:
                    owner.alarm()
                except Exception:  # noqa: BLE001 - one owner's failure must not leave the others of its tick unwoken
                    self.on_error()
        finally:
            self.firing = 0
            del self.due[tick]
