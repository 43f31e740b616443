"""What a held 5.x session costs the broker on the native transport: its Telemetry stream waits with no task
besides its handler's (the pending read is a future), it keeps no decoded protobuf message, and its Python heap
stays within a stated bound (BENCHMARKS, "What a held 5.x session costs"). 100,000 sessions is grpcMaxSessions'
default: every KB here is ~100 MB there."""
import asyncio
import gc
import subprocess
import sys
import time
import tracemalloc

from conftest import require_module

require_module("grpc")
require_module("rocketmq.grpc_protocol")

from google.protobuf.message import Message  # noqa: E402
from test_loadgen_grpc import ROOT, start_broker  # noqa: E402

SESSIONS = 800
PER_CONNECTION = 8
#: measured 6.1-6.3 KB a session (13.1-13.4 KB before the Telemetry wait, its read, its timer, the stream's inbox and
#: its metadata were made lean)
HEAP_PER_SESSION = 7_500


def held_messages(session) -> list:
    """The protobuf messages a held session keeps: in its slots, and in its Telemetry handler's frame."""
    frame = session.stream.context.call.task.get_coro().cr_frame.f_locals["coro"].cr_frame  # the handler, in _rest
    kept = [(name, getattr(session, name, None)) for name in type(session).__slots__ if name != "__weakref__"]
    kept += list(frame.f_locals.items())
    return [name for name, value in kept if isinstance(value, Message)]


def test_a_held_session_costs_its_handlers_task_and_a_bounded_heap(tmp_path):
    b = start_broker(tmp_path, "native", grpc_max_sessions_per_ip=10_000)
    ep = b.grpc
    load = None
    try:
        tasks = lambda: len(asyncio.all_tasks())  # noqa: E731 - run on the broker's loop
        gc.collect()
        tracemalloc.start()
        heap0, tasks0 = tracemalloc.get_traced_memory()[0], b.call(tasks)
        load = subprocess.Popen(
            [sys.executable, "-m", "engine", "loadgen", "steady", "--protocol", "grpc", "--broker",
             f"127.0.0.1:{b.ports['grpc']}", "--clients", str(SESSIONS), "--sessions-per-connection",
             str(PER_CONNECTION), "--duration", "60", "--rate", "1", "--assignment-interval", "0",
             "--route-interval", "0", "--quiet"], cwd=str(ROOT), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while b.call(lambda: len(ep.sessions)) < SESSIONS:
            assert time.monotonic() < deadline and load.poll() is None, "the sessions did not register"
            time.sleep(0.2)
        time.sleep(1.0)  # the last Settings answered
        gc.collect()
        heap, held_tasks = tracemalloc.get_traced_memory()[0] - heap0, b.call(tasks) - tasks0
        decoded = b.call(lambda: [held_messages(x) for x in ep.sessions.values()])
    finally:
        tracemalloc.stop()
        if load is not None:
            load.kill()
            load.wait()
        b.stop()
    # protobuf messages live outside the Python heap (upb arenas, ~1.2 KB each): a held session keeps none, in
    # its handler's frame (the last command, its answer) or in itself (its Settings are kept encoded)
    assert decoded == [[]] * SESSIONS, decoded[:3]
    # the handler's task; none for its pending read, none for an asyncio.Event's wait
    assert held_tasks <= SESSIONS + 8, held_tasks
    assert heap / SESSIONS <= HEAP_PER_SESSION, f"{heap / SESSIONS:.0f} B a held session"
