"""Per-client memory of the registry: flat arrays, no Python container objects per client.

The issues' figures (<= 256 B per registered client at 100k-1M clients, issue 3; <= 200 B at 1M, issue 15) is measured by
bench/bench_registry.py::test_bytes_per_registered_client; this test guards the structure at a smaller scale.
"""
import gc
import tracemalloc

from engine.codec.enums import LanguageCode
from engine.registry.client_registry import ClientRegistry, RegistryConfig
from engine.registry.store import Store
from test_registry_model import hb

N = 20_000


def make_clients(n):
    return [(object(), f"10.0.{i >> 8 & 255}.{i & 255}:{40000 + i % 20000}",
             hb(f"10.0.{i >> 8 & 255}.{i & 255}@{i}#1234567890123", consumers=[(f"CID_{i % 20}", ["TopicTest"])],
                producers=["CLIENT_INNER_PRODUCER"]))
            for i in range(n)]


def register(clients, capacity):
    reg = ClientRegistry(RegistryConfig(initial_capacity=capacity), clock=lambda: 0, store=Store(None))
    for ch, addr, data in clients:
        reg.open_channel(ch, addr)
        reg.heartbeat(ch, data, LanguageCode.JAVA, 479)
    return reg


def test_no_python_container_objects_per_client():
    clients = make_clients(N)
    register(clients[:100], N)  # warm up caches of the modules involved
    gc.collect()
    before = len(gc.get_objects())
    reg = register(clients, N)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert reg.stats()["consumer_memberships"] == N
    assert grown < 500, f"{grown} gc-tracked objects for {N} clients"


def test_bytes_per_client_bound():
    clients = make_clients(N)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        reg = register(clients, N)
        gc.collect()
        per_client = (tracemalloc.get_traced_memory()[0] - base) / N
    finally:
        tracemalloc.stop()
    if type(reg.channel_table).__module__ == "engine.registry._channel_table":
        assert reg.nbytes() / N < 190  # ~183 B: columns, the channel index, member arrays, pool arrays
        assert per_client < 215, per_client  # ~205 B here; 192-195 B at 100k-1M (bench)
    else:  # the twin keeps its channel -> slot map in a dict (~65 B a channel more)
        assert reg.nbytes() / N < 170
        assert per_client < 260, per_client  # ~246 B here


def test_departed_clients_leave_nothing_behind():
    clients = make_clients(2_000)
    reg = register(clients, 16)
    for ch, _, _ in clients:
        reg.close_channel(ch)
    s = reg.stats()
    assert (s["channels"], s["interned_strings"], s["interned_groups"], s["consumer_groups"]) == (0, 0, 0, 0)
    reg.check_invariants()
    capacity = s["slot_capacity"]
    for ch, addr, data in clients:  # a second generation reuses the freed slots and ids
        reg.open_channel(ch, addr)
        reg.heartbeat(ch, data, LanguageCode.JAVA, 479)
    assert reg.stats()["slot_capacity"] == capacity
    assert reg._pool.high_water <= 2_000
