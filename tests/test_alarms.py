"""engine.alarms: timeouts that share the loop's timers (a held 5.x session's Telemetry wait, a native gRPC
connection's keepalive)."""
import asyncio
import sys

from engine.alarms import TICK_S, Alarms


class Owner:
    def __init__(self, calls, fail=False):
        self.calls, self.fail = calls, fail

    def alarm(self):
        self.calls.append((self, asyncio.get_running_loop().time()))
        if self.fail:
            raise RuntimeError("an owner's bug")


def test_owners_are_called_once_after_their_delay_and_share_a_timer_per_tick():
    async def go():
        loop = asyncio.get_running_loop()
        calls, errors = [], []
        alarms = Alarms(loop, lambda: errors.append(sys.exc_info()[1]))
        timers = []
        call_at = loop.call_at
        loop.call_at = lambda *a, **kw: timers.append(a) or call_at(*a, **kw)
        owners = [Owner(calls) for _ in range(1000)]
        start = loop.time()
        ticks = [alarms.set(o, 0.2) for o in owners]
        cancelled = owners[:10]
        for o, t in zip(cancelled, ticks):
            alarms.cancel(o, t)
        late = Owner(calls)
        alarms.set(late, 0.4)
        await asyncio.sleep(0.2 + 3 * TICK_S)
        assert [o for o, _ in calls] == owners[10:]  # in the order they were set, each once
        assert all(0.2 <= t - start <= 0.2 + 2 * TICK_S for _, t in calls)
        fired = [a for a in timers if a[1] == alarms._fire]  # (asyncio.sleep's timer aside)
        assert len(fired) <= 3  # the 1,000 owners' tick (or two, across a tick's edge) and the late one's
        await asyncio.sleep(0.2 + 2 * TICK_S)
        assert calls[-1][0] is late and len(calls) == 991 and not errors
        assert not alarms.due  # nothing kept once fired

    asyncio.run(go())


def test_a_failing_owner_is_reported_and_the_others_of_its_tick_are_still_called():
    async def go():
        calls, errors = [], []
        alarms = Alarms(asyncio.get_running_loop(), lambda: errors.append(sys.exc_info()[1]))
        owners = [Owner(calls), Owner(calls, fail=True), Owner(calls)]
        for o in owners:
            alarms.set(o, 0.0)
        twice = Owner(calls)  # set again without a cancel: called for both ticks
        alarms.set(twice, 0.0)
        alarms.set(twice, 0.1)
        await asyncio.sleep(0.1 + 3 * TICK_S)
        assert [o for o, _ in calls] == owners + [twice, twice]
        assert [str(e) for e in errors] == ["an owner's bug"]

    asyncio.run(go())


class Canceller(Owner):
    """Cancels another owner of its own tick when it is called."""

    def __init__(self, calls, alarms):
        super().__init__(calls)
        self.alarms, self.victim = alarms, None

    def alarm(self):
        super().alarm()
        if self.victim is not None:
            self.alarms.cancel(*self.victim)


def test_an_owner_cancelled_by_another_of_its_tick_is_not_called():
    async def go():
        calls = []
        alarms = Alarms(asyncio.get_running_loop(), lambda: None)
        a, b = Canceller(calls, alarms), Owner(calls)
        tick = alarms.set(a, 0.0)
        assert alarms.set(b, 0.0) == tick
        a.victim = (b, tick)
        await asyncio.sleep(3 * TICK_S)
        assert [o for o, _ in calls] == [a] and not alarms.due

    asyncio.run(go())


def test_an_owner_that_sets_itself_again_while_its_tick_fires_is_called_on_a_later_tick():
    class Again(Owner):
        def alarm(self):
            super().alarm()
            if len(self.calls) < 3:
                alarms.set(self, 0.0)

    async def go():
        nonlocal alarms
        calls = []
        alarms = Alarms(asyncio.get_running_loop(), lambda: None)
        alarms.set(Again(calls), 0.0)
        await asyncio.sleep(6 * TICK_S)
        assert len(calls) == 3 and calls[0][1] < calls[1][1] < calls[2][1] and not alarms.due

    alarms = None
    asyncio.run(go())
