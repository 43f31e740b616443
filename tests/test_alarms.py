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
