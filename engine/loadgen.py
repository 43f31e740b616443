"""Load generator (`rmqhb loadgen`): thousands of simulated RocketMQ clients, each on its own connection,
heartbeating a broker: this one or any other RocketMQ 4.x/5.x broker's remoting port (the Java broker included).
RocketMQ 5.x SDK clients on a gRPC port: engine.loadgen_grpc (`rmqhb loadgen --protocol grpc`).

Each simulated client is the client side of MQClientInstance's heartbeat: a producer table and a consumer
table, ``prepareHeartbeatData`` (clientID, CLIENT_INNER_PRODUCER plus its producer groups, its consumers with
their subscriptions and the %RETRY% subscription of a CLUSTERING group), sent to every broker of its broker
table (masters only when it has no consumers), and UNREGISTER_CLIENT per group on shutdown. Frames are
pre-encoded with the engine's own encoder, so they are byte-for-byte what a Java 5.x client sends.

Scenarios (``rmqhb loadgen --help``):

* ``steady``: N connections register, then heartbeat for D seconds. ``--rate R`` is an open-loop offered load
  (R heartbeats/s spread over the connections, the way a fleet's 30 s timers are spread); ``--rate 0`` is closed
  loop (each connection sends its next heartbeat when the previous one is answered: the saturation throughput).
  ``--burst B`` (open loop) sends the offered load as bursts: each due connection writes B pipelined heartbeats
  (consecutive opaques) in one write, as a client sending async requests concurrently does (RocketMQ remoting
  multiplexes a connection by opaque); at one heartbeat per write every heartbeat costs a socket round trip on
  each side, which is what bounds the rate on a small machine. Every heartbeat's latency runs from its own send
  time (the burst's write) to the moment its answer is read; answers are checked against the opaque they answer
  and every non-SUCCESS answer counts as an error. Reports heartbeats/s answered and latency percentiles, and for
  open loop how late the sender's 1 ms ticks started (``tick_late_*``: the load generator's own loop stalls,
  which delay reading answers too) and how long its send work per tick took (``tick_work_*``). The window opens
  after a warm-up (``warmup_s``): open loop, the offered load is sent through it, at least 3 passes over the
  connections and until the answers have caught up, so the window measures the steady state and not the wave of
  every client's first heartbeats after registering.
* ``storm``: N clients connect at once and send their first heartbeat; reports the time until every one of them
  is registered (answered SUCCESS).

Bytes: by default every heartbeat of a client is the same frame but for its opaque (a broker's repeat route, if it
has one, serves all of them). ``--vary`` sends what a real Java client sends instead: its HashSet order changes
between heartbeats (producer groups, consumer groups, subscriptions and tags in another order: the same
registration as different bytes, which must not count as a change), and ``--subversion-every N`` gives every N-th
heartbeat of a consumer a newer subVersion (as a re-subscription does), so the full decode path is measured.

While it runs a progress line goes to stderr each second (``--quiet`` turns it off); the result is one JSON object
on stdout (``--out FILE`` writes it to a file too) with a per-second timeline, and ``--plot FILE.svg`` draws the
latency percentiles and the answered rate over time (a self-contained SVG).

The process raises RLIMIT_NOFILE to its hard limit; with ``--procs P`` the clients are split over P processes.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import multiprocessing as mp
import os
import queue
import resource
import signal
import stat
import sys
import time
from collections import deque

import engine
from engine.codec.heartbeat import build_subscription

CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------------------------------------------
# The client side of MQClientInstance


class SimClient:
    """One MQClientInstance: producer/consumer tables and its broker table (brokerName -> {brokerId: addr})."""

    def __init__(self, index: int, producers=(), consumers=(), ip="10.0.0.1"):
        self.client_id = f"{ip}@{40000 + index}#{index * 7919}"
        self.producer_table = list(producers)
        #: consumer table: (group, message model, [(topic, expression)])
        self.consumer_table = list(consumers)
        self.broker_addr_table: dict[str, dict[int, str]] = {}
        self.sub_version = int(time.time() * 1000)

    def prepare_heartbeat_data(self):
        producers = [engine.ProducerData(CLIENT_INNER_PRODUCER)] + [engine.ProducerData(g) for g in self.producer_table]
        consumers = []
        for group, model, subs in self.consumer_table:
            subscriptions = [build_subscription(t, e, self.sub_version) for t, e in subs]
            if model == engine.MessageModel.CLUSTERING:
                subscriptions.append(build_subscription(f"%RETRY%{group}", "*", self.sub_version))
            consumers.append(engine.ConsumerData(
                group, consume_type=engine.ConsumeType.CONSUME_PASSIVELY, message_model=model,
                consume_from_where=engine.ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, unit_mode=False,
                subscriptions=tuple(subscriptions)))
        return engine.HeartbeatData(client_id=self.client_id, producers=tuple(producers), consumers=tuple(consumers))

    def heartbeat_targets(self) -> list[str]:
        """sendHeartbeatToAllBroker: every address, or masters only when the heartbeat has no consumers."""
        out = []
        for table in self.broker_addr_table.values():
            for broker_id, addr in table.items():
                if broker_id != 0 and not self.consumer_table:
                    continue
                out.append(addr)
        return out

    def heartbeat_frame(self, opaque: int, hb=None) -> bytes:
        body = engine.encode_heartbeat(self.prepare_heartbeat_data() if hb is None else hb)
        return engine.RemotingCommand(engine.RequestCode.HEART_BEAT, opaque=opaque, ext_fields={}, body=body).encode()

    def heartbeat_variants(self, opaque: int, limit: int = 8) -> list[bytes]:
        """The heartbeat as a Java client sends it over time: its sets (producer groups, consumer groups, each
        consumer's subscriptions, each subscription's tags and codes) in other orders, the same registration as
        different bytes. At most ``limit`` distinct frames, the client's usual order first."""
        hb = self.prepare_heartbeat_data()

        def sub(s, flip):
            return engine.SubscriptionData(s.topic, s.sub_string, s.tags[::-1] if flip else s.tags,
                                           s.codes[::-1] if flip else s.codes, s.sub_version, s.expression_type,
                                           s.class_filter_mode)

        frames = []
        for flip_p, flip_c, flip_s, flip_t in itertools.product((False, True), repeat=4):
            consumers = tuple(
                engine.ConsumerData(c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode,
                                    tuple(sub(s, flip_t) for s in (c.subscriptions[::-1] if flip_s
                                                                    else c.subscriptions)))
                for c in (hb.consumers[::-1] if flip_c else hb.consumers))
            variant = engine.HeartbeatData(hb.client_id, hb.producers[::-1] if flip_p else hb.producers, consumers)
            frame = self.heartbeat_frame(opaque, variant)
            if frame not in frames:
                frames.append(frame)
            if len(frames) == limit:
                break
        return frames

    def unregister_frames(self, opaque: int) -> list[bytes]:
        """MQClientInstance.unregisterClient: one UNREGISTER_CLIENT per group."""
        frames = []
        for g in self.producer_table:
            frames.append(engine.RemotingCommand(engine.RequestCode.UNREGISTER_CLIENT, opaque=opaque,
                                                 ext_fields={"clientID": self.client_id, "producerGroup": g}).encode())
        for g, _, _ in self.consumer_table:
            frames.append(engine.RemotingCommand(engine.RequestCode.UNREGISTER_CLIENT, opaque=opaque,
                                                 ext_fields={"clientID": self.client_id, "consumerGroup": g}).encode())
        return frames


def make_fleet(n: int, offset: int, groups: int, consumer_share: float) -> list[SimClient]:
    """n clients: a share are push consumers of one of ``groups`` groups (CLUSTERING), the rest producers."""
    fleet = []
    for i in range(offset, offset + n):
        g = i % groups
        if (i % 100) < consumer_share * 100:
            c = SimClient(i, consumers=[(f"CID_load_{g}", engine.MessageModel.CLUSTERING,
                                         [(f"TopicLoad{g % 7}", "TagA || TagB")])])
        else:
            c = SimClient(i, producers=[f"PID_load_{g}"])
        fleet.append(c)
    return fleet



# ---------------------------------------------------------------------------------------------------------------
# Connections

#: Opaques are sent with a fixed width of 10 digits, so a pre-encoded JSON frame is patched without re-encoding.
OPAQUE_BASE = 1_000_000_000
_OPAQUE_SPAN = 1_000_000_000


class FrameTemplate:
    """A pre-encoded request (JSON header) whose opaque is the only thing rewritten per send (and, for a heartbeat
    with ``sub_version``, its subscriptions' subVersion when asked: same digit count, so the length stays)."""

    __slots__ = ("head", "tail", "sub_version")

    def __init__(self, frame: bytes, sub_version: int | None = None):
        marker = b'"opaque":%d' % OPAQUE_BASE
        i = frame.find(marker)
        if i < 0:
            raise ValueError("the frame was not encoded with opaque OPAQUE_BASE")
        i += len(marker) - 10
        self.head, self.tail = frame[:i], frame[i + 10:]
        self.sub_version = sub_version if sub_version is not None and b'"subVersion":%d' % sub_version in frame \
            else None

    def build(self, seq: int, sub_version: int | None = None) -> bytes:
        frame = b"%s%d%s" % (self.head, OPAQUE_BASE + seq % _OPAQUE_SPAN, self.tail)
        if sub_version is not None and self.sub_version is not None:
            new = b'"subVersion":%d' % sub_version
            old = b'"subVersion":%d' % self.sub_version
            if len(new) != len(old):
                raise ValueError("a subVersion patch must keep the digit count")
            frame = frame.replace(old, new)
        return frame

    def build_many(self, seq: int, count: int) -> bytes:
        """``count`` frames with opaques from ``seq`` on, in one buffer (one join instead of one format each)."""
        return self.head + (self.tail + self.head).join(
            [b"%d" % (OPAQUE_BASE + (seq + i) % _OPAQUE_SPAN) for i in range(count)]) + self.tail


class AnswerPattern:
    """A SUCCESS answer as the broker sent it, with its 10-digit opaque cut out: a read holding only answers of this
    shape to the expected opaques equals the pattern filled with them, so it is checked with one comparison instead
    of being parsed frame by frame (anything else, a NOTIFY or another code or opaque, takes the parser)."""

    __slots__ = ("head", "mid", "tail", "size")

    def __init__(self, frame: bytes, i: int):
        self.head, self.tail = frame[:i], frame[i + 10:]
        self.mid = self.tail + self.head
        self.size = len(frame)

    def expected(self, acked: int, count: int) -> bytes:
        return self.head + self.mid.join(
            [b"%d" % (OPAQUE_BASE + (acked + j) % _OPAQUE_SPAN) for j in range(count)]) + self.tail


#: longest open-loop warm-up before the window opens whether or not the answers have caught up
WARMUP_LIMIT_S = 30.0
#: steady: longest wait after the window for the answers in flight, and again for the UNREGISTER_CLIENT answers
#: (what is still unanswered then is counted: ``unanswered_after_drain``, ``unregistered_connections``)
DRAIN_GRACE_S = 30.0
#: open loop: longest a send tick goes on sending before it lets the loop read answers and check the clock (what
#: is due past it waits for the next tick: an offered rate beyond what the process can send must not keep one tick
#: going past the run's end)
TICK_SEND_BUDGET_S = 0.01
#: open loop: a connection with this much unsent in its write buffer (the broker not reading) is skipped, its due
#: heartbeats counted in ``offered_not_sent`` instead of queued in memory without end
MAX_WRITE_BUFFER = 4 << 20


def _new_stats() -> dict:
    return {"answered": 0, "ok": 0, "errors": 0, "opaque_mismatch": 0, "lost": 0, "connect_retries": 0,
            "connect_failed": 0, "notifies": 0, "sent": 0, "offered_not_sent": 0}


class LoadConn(asyncio.Protocol):
    """A client connection: sends pre-encoded frames with patched opaques and matches the answers.

    One connection is answered in order, so answers are matched FIFO and each answer's opaque is checked against
    the request it answers (a wrong one counts as ``opaque_mismatch``). ``auto`` keeps ``depth`` heartbeats in
    flight (closed loop); ``on_first_answer`` is called when the first answer arrives.
    """

    __slots__ = ("template", "transport", "seq", "acked", "buf", "lat", "pending", "stats", "closed", "ok",
                 "auto", "on_first_answer", "bye", "answer", "variants", "sub_every", "paused")

    def __init__(self, template: FrameTemplate, stats: dict, lat: list, on_first_answer=None,
                 variants: list | None = None, sub_every: int = 0):
        self.template = template
        #: --vary: the frames sent in turn (the heartbeat's set orders); --subversion-every: every sub_every-th
        #: heartbeat carries a newer subVersion (the template's + 1 per such heartbeat)
        self.variants = variants if variants and len(variants) > 1 else None
        self.sub_every = sub_every
        self.transport = None
        self.seq = 0  # opaques sent: OPAQUE_BASE + 0 .. seq-1
        self.acked = 0  # answers received
        self.buf = b""
        self.lat = lat
        self.pending = deque()  # send times, oldest first
        self.stats = stats
        self.closed = asyncio.get_running_loop().create_future()
        self.ok = 0
        self.auto = False
        self.on_first_answer = on_first_answer
        self.bye = False  # closed by us: not counted as lost
        self.answer: AnswerPattern | None = None  # the shape of this connection's SUCCESS answers, once seen
        self.paused = False  # more than MAX_WRITE_BUFFER unsent (the transport's flow control)

    def connection_made(self, transport):
        self.transport = transport
        if hasattr(transport, "set_write_buffer_limits"):
            transport.set_write_buffer_limits(high=MAX_WRITE_BUFFER)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False

    def send(self, now: float, template: FrameTemplate | None = None, count: int = 1) -> None:
        """Send ``count`` requests in one write (a client pipelining several), each with the next opaque. A
        connection the server has closed (a broker past its connection budget closes new ones at accept) sends
        nothing: its end is counted as lost."""
        if self.transport.is_closing():
            return
        tpl = template or self.template
        seq = self.seq
        if template is None and (self.variants is not None or self.sub_every):
            data = b"".join([self._varied(seq + k) for k in range(count)])
        else:
            data = tpl.build(seq) if count == 1 else tpl.build_many(seq, count)
        self.pending.extend([now] * count)
        self.seq = seq + count
        self.stats["sent"] += count
        self.transport.write(data)

    def _varied(self, seq: int) -> bytes:
        tpl = self.template if self.variants is None else self.variants[seq % len(self.variants)]
        sub = None
        if self.sub_every and tpl.sub_version is not None:
            sub = tpl.sub_version + seq // self.sub_every
        return tpl.build(seq, sub)

    def data_received(self, data: bytes) -> None:
        if self.buf:
            data = self.buf + data
        n = len(data)
        now = time.perf_counter()
        pending = self.pending
        lat = self.lat
        ans = self.answer
        if ans is not None and n % ans.size == 0 and n // ans.size <= len(pending) \
                and data == ans.expected(self.acked, n // ans.size):
            # the common read: only SUCCESS answers, in order, to the opaques sent
            answered = ok = n // ans.size
            self.acked += answered
            popleft = pending.popleft
            lat.extend([now - popleft() for _ in range(answered)])
            self.buf = b""
        else:
            answered, ok = self._parse(data, now)
        if answered:
            stats = self.stats
            stats["answered"] += answered
            stats["ok"] += ok
            stats["errors"] += answered - ok
            self.ok += ok
            if self.on_first_answer is not None and self.acked == answered:
                self.on_first_answer(self)
            if self.auto:
                self.send(now, count=answered)

    def _parse(self, data: bytes, now: float) -> tuple[int, int]:
        """Frame by frame: count NOTIFYs, check each answer's opaque, learn the SUCCESS answer's shape."""
        n = len(data)
        pos = 0
        answered = ok = 0
        stats = self.stats
        pending = self.pending
        lat = self.lat
        while n - pos >= 8:
            start = pos
            end = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
            if end > n:
                break
            h0 = pos + 8
            h1 = h0 + (int.from_bytes(data[pos + 4:pos + 8], "big") & 0xFFFFFF)
            pos = end
            if data.find(b'"flag":1', h0, h1) < 0:  # a request from the broker (NOTIFY_CONSUMER_IDS_CHANGED)
                stats["notifies"] += 1
                continue
            i = data.find(b'"opaque":', h0, h1) + 9
            success = data.startswith(b'{"code":0,', h0)
            if i < 9 or data[i:i + 10] != b"%d" % (OPAQUE_BASE + self.acked % _OPAQUE_SPAN):
                stats["opaque_mismatch"] += 1
            elif success and self.answer is None:
                self.answer = AnswerPattern(data[start:end], i - start)
            self.acked += 1
            if success:
                ok += 1
            answered += 1
            if pending:
                lat.append(now - pending.popleft())
        self.buf = data[pos:] if pos < n else b""
        return answered, ok

    def connection_lost(self, exc):
        if not self.bye:
            self.stats["lost"] += 1
        if not self.closed.done():
            self.closed.set_result(exc)


#: LOADGEN_SOURCE_IPS=K: connect from 127.0.0.2 .. 127.0.0.(K+1), round-robin. Loopback connections to one broker
#: port share one source address's ephemeral ports (28k here), so 50k clients connected at once need K >= 2.
_SOURCE_IPS = [f"127.0.0.{2 + k}" for k in range(int(os.environ.get("LOADGEN_SOURCE_IPS") or 0))]
_source_seq = 0


def _local_addr():
    global _source_seq
    if not _SOURCE_IPS:
        return None
    _source_seq += 1
    return (_SOURCE_IPS[_source_seq % len(_SOURCE_IPS)], 0)


async def _connect(loop, host, port, factory, stats, attempts=20, backoff=0.05):
    for attempt in range(attempts):
        try:
            return (await loop.create_connection(factory, host, port, local_addr=_local_addr()))[1]
        except OSError:
            stats["connect_retries"] += 1
            await asyncio.sleep(backoff * (attempt + 1))
    stats["connect_failed"] += 1
    return None


async def _connect_all(loop, host, port, templates, stats, lat, concurrency=512, variants=None, sub_every=0):
    conns = [None] * len(templates)
    sem = asyncio.Semaphore(concurrency)

    async def one(i):
        async with sem:
            conns[i] = await _connect(loop, host, port, lambda: LoadConn(
                templates[i], stats, lat, variants=variants[i] if variants else None, sub_every=sub_every), stats)

    await asyncio.gather(*(one(i) for i in range(len(templates))))
    return [c for c in conns if c is not None]


def _percentiles(lat: list) -> dict:
    if not lat:
        return {}
    s = sorted(lat)

    def q(p):
        return s[min(len(s) - 1, int(p * len(s)))] * 1000

    return {"p50_ms": round(q(0.50), 3), "p90_ms": round(q(0.90), 3), "p99_ms": round(q(0.99), 3),
            "max_ms": round(s[-1] * 1000, 3)}


# ---------------------------------------------------------------------------------------------------------------
# CPU accounting (Linux /proc): who used the 2 cores during the measured window


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_split_s(pid: int) -> tuple[float, float] | None:
    """(utime, stime) of a process (all its threads), seconds; None when they cannot be read. stime is the kernel's
    share: on loopback it includes delivering the broker's answers into the load generator's sockets."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), seconds; None when it cannot be read."""
    split = proc_cpu_split_s(pid)
    return None if split is None else split[0] + split[1]


def machine_cpu_s() -> tuple[float, float, float, float] | None:
    """(busy, total, niced, steal) CPU seconds of the whole machine since boot, from /proc/stat (busy includes
    niced: background jobs at nice 19 still take cycles and caches, but yield the cores to the measured processes;
    steal: time the hypervisor ran something else on our virtual CPUs, invisible to every process here)."""
    try:
        with open("/proc/stat", "rb") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        steal = v[7] if len(v) > 7 else 0
        return (sum(v[:8]) - idle) / _CLK_TCK, sum(v[:8]) / _CLK_TCK, v[1] / _CLK_TCK, steal / _CLK_TCK
    except (OSError, ValueError):
        return None


class GcWatch:
    """Garbage-collector passes of this process while it measures (each one pauses its loop)."""

    def __init__(self):
        self.count = [0, 0, 0]
        self.max_s = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.max_s = max(self.max_s, time.perf_counter() - self._t0)

    def close(self) -> dict:
        gc.callbacks.remove(self._cb)
        return {"loadgen_gc_passes": self.count, "loadgen_gc_max_s": self.max_s}


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (a broker's I/O workers), from /proc; [] when they cannot be read."""
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


class Window:
    """Counters at the start of the measured window and their deltas at its end (the broker's CPU, and its child
    processes' - I/O workers - apart)."""

    def __init__(self, stats: dict, server_pid: int | None):
        self.stats, self.server_pid = stats, server_pid
        self.t0 = time.perf_counter()
        self.mono0 = time.monotonic()  # the machine's clock: another process's samples are placed in the window
        self.s0 = dict(stats)
        self.cpu0 = time.process_time()
        self.srv0 = proc_cpu_split_s(server_pid) if server_pid else None
        self.children0 = {c: proc_cpu_s(c) for c in child_pids(server_pid)} if server_pid else {}
        self.m0 = machine_cpu_s()

    def close(self) -> dict:
        out = {"seconds": time.perf_counter() - self.t0, "loadgen_cpu_s": time.process_time() - self.cpu0,
               "window_monotonic_s": [self.mono0, time.monotonic()]}
        for k, v in self.stats.items():
            out[k] = v - self.s0.get(k, 0)
        if self.srv0 is not None:
            srv1 = proc_cpu_split_s(self.server_pid)
            out["server_cpu_s"] = None if srv1 is None else sum(srv1) - sum(self.srv0)
            out["server_sys_s"] = None if srv1 is None else srv1[1] - self.srv0[1]
            if self.children0:
                out["server_children_cpu_s"] = sum((proc_cpu_s(c) or c0) - c0
                                                   for c, c0 in self.children0.items() if c0 is not None)
        m1 = machine_cpu_s()
        if self.m0 and m1:
            out["machine_busy_s"], out["machine_total_s"] = m1[0] - self.m0[0], m1[1] - self.m0[1]
            out["machine_niced_s"] = m1[2] - self.m0[2]
            out["machine_steal_s"] = m1[3] - self.m0[3]
        return out


# ---------------------------------------------------------------------------------------------------------------
# Scenarios (one process)


def _templates(fleet, vary: bool, sub_every: int):
    """Each client's heartbeat template and, with ``vary``, its variants (None without)."""
    if not vary:
        return [FrameTemplate(c.heartbeat_frame(OPAQUE_BASE), c.sub_version) for c in fleet], None
    variants = [[FrameTemplate(f, c.sub_version) for f in c.heartbeat_variants(OPAQUE_BASE)] for c in fleet]
    return [v[0] for v in variants], variants


#: the fields of a worker's progress slot (shared with the parent, which prints the progress line)
PROGRESS_FIELDS = ("sent", "answered", "errors", "notifies")


class Progress:
    """Every second: the worker's counters into its slot of a shared array (the parent's progress line), and,
    inside the measured window, a timeline mark (seconds since the window opened, answers so far in ``lat``)."""

    def __init__(self, stats: dict, lat: list, slot=None, fields=PROGRESS_FIELDS):
        self.stats, self.lat, self.slot, self.fields = stats, lat, slot, fields
        self.marks: list = []
        self.window_t0 = None
        self.task = asyncio.get_running_loop().create_task(self._run())

    def open_window(self) -> None:
        self.window_t0 = time.perf_counter()
        self.marks = [(0.0, 0)]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.publish()
            if self.window_t0 is not None:
                self.marks.append((round(time.perf_counter() - self.window_t0, 3), len(self.lat)))

    def publish(self) -> None:
        if self.slot is not None:
            for k, name in enumerate(self.fields):
                self.slot[k] = self.stats.get(name, 0)

    def close(self) -> list:
        self.task.cancel()
        self.publish()
        return self.marks


async def _together(barrier) -> None:
    """Wait for every worker process to reach this point (the event loop keeps serving meanwhile)."""
    if barrier is not None:
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 900)


async def steady(host, port, n, offset, duration, rate, groups, consumer_share, warmup=2.0, depth=1,
                 server_pid=None, barrier=None, burst=1, vary=False, sub_every=0, slot=None) -> dict:
    loop = asyncio.get_running_loop()
    fleet = make_fleet(n, offset, groups, consumer_share)
    addr = f"{host}:{port}"
    for c in fleet:
        c.broker_addr_table = {"broker-a": {0: addr}}
    templates, variants = _templates(fleet, vary, sub_every)
    stats = _new_stats()
    lat: list = []
    progress = Progress(stats, lat, slot)
    closed_loop = rate <= 0
    conns = await _connect_all(loop, host, port, templates, stats, lat, variants=variants, sub_every=sub_every)
    # registration round: every client's first heartbeat
    t0 = time.perf_counter()
    for c in conns:
        c.send(t0)
    while stats["answered"] + stats["lost"] < len(conns) and time.perf_counter() - t0 < 120:
        await asyncio.sleep(0.01)
    registered_s = time.perf_counter() - t0
    await _together(barrier)  # every process registered: the windows overlap and see no registration traffic
    # the fleet, its frames and connections live until the end: frozen, the collector's passes skip them (a full
    # pass over 10k connections' objects would pause this loop for tens of ms and show up as broker latency)
    gc.freeze()
    if closed_loop:
        now = time.perf_counter()
        for c in conns:
            c.auto = True
            c.send(now, count=depth)
    # warm-up: at least ``warmup`` s, so the consequences of the registration round (NOTIFY fan-out, the broker
    # encoding the groups it auto-created at its next 1 s tick; the write itself is off its loop) stay out of the
    # steady-state window. The open loop sends at the offered rate through it, for at least 3 passes over the
    # connections: a connection's first heartbeats after registering cost the broker more (the no-op run that arms
    # its fast path, the decoder arming its repeat), so the window opens on the steady state, not on that wave.
    # Then it goes on until the answers have caught up (at most 20 ms of offered load outstanding, or
    # WARMUP_LIMIT_S in all) and every process is there; ``warmup_s`` reports how long it took
    burst = max(1, int(burst))
    warm = warmup if closed_loop else max(warmup, 3 * len(conns) * burst / rate)
    if closed_loop:
        await asyncio.sleep(warm)
        lat.clear()
        win = Window(stats, server_pid)
        progress.open_window()
        gc_watch = GcWatch()
        await asyncio.sleep(duration)
    else:
        # open loop: every millisecond send the heartbeats due, round-robin over the connections, ``burst`` per
        # connection and write (the remainder of a tick waits for the next one, so every write is a full burst)
        i = sent = 0
        nconn = len(conns)
        late, work = [], []  # per tick: how late it started (the loop's stalls), how long its sends took
        clock = time.perf_counter
        start = clock()
        wake = start
        win = synced = None
        window_start = float("inf")
        answered0 = stats["answered"]  # the registration round's
        while True:
            now = time.perf_counter()
            late.append(now - wake)
            elapsed = now - start
            if win is None:
                if synced is None and elapsed >= warm and (
                        sent - (stats["answered"] - answered0) <= rate * 0.02 or elapsed >= WARMUP_LIMIT_S):
                    synced = loop.run_in_executor(None, barrier.wait, 900) if barrier is not None else True
                if synced is True or (synced is not None and synced.done()):
                    # the window opens: what came before was warm-up
                    lat.clear()
                    late.clear()
                    work.clear()
                    win = Window(stats, server_pid)
                    progress.open_window()
                    gc_watch = GcWatch()
                    window_start = elapsed
                    warm = elapsed
                    backlog_open = int(elapsed * rate) - sent
            if elapsed >= window_start + duration:
                break
            bursts = (int(elapsed * rate) - sent) // burst
            done = 0
            while done < bursts:
                c = conns[i]
                if c.paused:  # the broker is not reading it: not queued without end
                    stats["offered_not_sent"] += burst
                else:
                    # stamped at its own write: a tick's later writes are not charged the earlier ones' syscalls
                    c.send(clock(), count=burst)
                i += 1
                if i == nconn:
                    i = 0
                done += 1
                if not done & 63 and clock() - now > TICK_SEND_BUDGET_S:
                    break  # the rest is due at the next tick, after the clock is checked
            sent += done * burst
            wake = time.perf_counter()
            work.append(wake - now)
            wake += 0.001
            await asyncio.sleep(0.001)
    res = win.close()
    if not closed_loop:  # and what was due but not yet sent when the window closed (the tick budget's backlog)
        res["offered_not_sent"] = max(0, res["offered_not_sent"] + int(elapsed * rate) - sent - backlog_open)
    res["timeline_marks"] = list(progress.marks) + [(round(time.perf_counter() - progress.window_t0, 3), len(lat))]
    res.update(gc_watch.close())
    if not closed_loop:
        res["tick_late"], res["tick_work"] = late, work
    for c in conns:
        c.auto = False
    await _together(barrier)  # nobody unregisters while another process is still measuring
    window_lat = list(lat)
    # drain what is in flight (late answers still count for latency: a slow answer must not vanish)
    t1 = time.perf_counter()
    while any(c.pending for c in conns) and time.perf_counter() - t1 < DRAIN_GRACE_S:
        await asyncio.sleep(0.01)
    window_lat += lat[len(window_lat):] if not closed_loop else []
    backlog = sum(len(c.pending) for c in conns)
    # shutdown: UNREGISTER_CLIENT per group, then close
    for c, sim in zip(conns, fleet):
        for f in sim.unregister_frames(OPAQUE_BASE):
            c.send(time.perf_counter(), FrameTemplate(f))
    t2 = time.perf_counter()
    while any(c.pending for c in conns) and time.perf_counter() - t2 < DRAIN_GRACE_S:
        await asyncio.sleep(0.01)
    unregistered = sum(1 for c in conns if not c.pending)
    for c in conns:
        c.bye = True
        c.transport.close()
    progress.close()
    res.update(connections=len(conns), registered_s=round(registered_s, 3), warmup_s=round(warm, 3),
               unanswered_after_drain=backlog,
               unregistered_connections=unregistered, connect_failed=stats["connect_failed"], latencies=window_lat)
    return res


async def storm(host, port, n, offset, groups, consumer_share, max_open=0, pending=1024, server_pid=None,
                answer_timeout=120.0, barrier=None, slot=None) -> dict:
    """Clients connect and send their first heartbeat; time until every one is registered (answered SUCCESS).

    At most ``pending`` clients per process are connecting or waiting for their first answer at a time. A storm
    that arrives faster than the broker accepts only overflows the kernel's accept queue (somaxconn, 4096 here):
    the dropped handshakes then stall those clients for the kernel's retransmission timeouts (seconds to minutes),
    which measures TCP, not the broker. ``max_open`` > 0 is a churn storm: each client disconnects once answered
    and at most ``max_open`` are connected at a time (to drive more clients than one process has descriptors for).
    """
    loop = asyncio.get_running_loop()
    fleet = make_fleet(n, offset, groups, consumer_share)
    templates, _ = _templates(fleet, False, 0)
    stats = _new_stats()
    stats["unanswered"] = 0
    lat: list = []
    progress = Progress(stats, lat, slot)
    progress.open_window()  # the storm is measured from its first connection
    conns = []
    in_flight = asyncio.Semaphore(pending)
    opened = asyncio.Semaphore(max_open) if max_open > 0 else None
    win = Window(stats, server_pid)

    async def one(i):
        if opened is not None:
            await opened.acquire()
        async with in_flight:
            answered = loop.create_future()

            def first(conn):
                if not answered.done():
                    answered.set_result(None)

            c = await _connect(loop, host, port, lambda: LoadConn(templates[i], stats, lat, first), stats, 50, 0.02)
            if c is None:
                if opened is not None:
                    opened.release()
                return
            c.send(time.perf_counter())
            done, _ = await asyncio.wait([answered, c.closed], timeout=answer_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if answered not in done:
                stats["unanswered"] += 1
        if opened is not None:
            c.bye = True
            c.transport.close()
            await c.closed
            opened.release()
        else:
            conns.append(c)

    await asyncio.gather(*(one(i) for i in range(n)))
    res = win.close()
    res["timeline_marks"] = progress.close() + [(round(time.perf_counter() - progress.window_t0, 3), len(lat))]
    await _together(barrier)  # no process leaves (notifying the others' groups) before all are registered
    for c in conns:
        c.bye = True
        c.transport.close()
    res.update(clients=n, registered=res["ok"], latencies=lat)
    return res


# ---------------------------------------------------------------------------------------------------------------
# Multi-process driver


class _Slot:
    """A worker's fields in the shared progress array."""

    __slots__ = ("array", "base")

    def __init__(self, array, index: int, width: int = len(PROGRESS_FIELDS)):
        self.array, self.base = array, index * width

    def __setitem__(self, k: int, value: int) -> None:
        self.array[self.base + k] = value


def _worker(args: dict, out, barrier=None, progress=None):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers, reports, exits 130
    raise_nofile()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    slot = None if progress is None else _Slot(progress, args["index"])
    try:
        if args["scenario"] == "steady":
            res = asyncio.run(steady(args["host"], args["port"], args["n"], args["offset"], args["duration"],
                                     args["rate"], args["groups"], args["consumer_share"], depth=args["depth"],
                                     server_pid=args["server_pid"], barrier=barrier, burst=args["burst"],
                                     vary=args["vary"], sub_every=args["sub_every"], slot=slot))
        else:
            res = asyncio.run(storm(args["host"], args["port"], args["n"], args["offset"], args["groups"],
                                    args["consumer_share"], args["max_open"], args["pending"],
                                    server_pid=args["server_pid"], barrier=barrier, slot=slot))
    except BaseException as e:  # the parent reports it instead of waiting for a result that never comes
        out.put({"worker_error": f"{type(e).__name__}: {e}"[:500]})
        raise
    out.put(res)


def _timeline(results: list) -> list:
    """Per second of the measured window, over all workers: answers, their latency percentiles (ms)."""
    seconds: dict = {}
    for r in results:
        marks, lat = r.get("timeline_marks") or [], r.get("latencies") or []
        for k in range(1, len(marks)):
            t, end = marks[k]
            entry = seconds.setdefault(k, {"t": t, "lat": []})
            entry["lat"].extend(lat[marks[k - 1][1]:end])
    out = []
    prev_t = 0.0
    for k in sorted(seconds):
        t, lat = seconds[k]["t"], sorted(seconds[k]["lat"])
        span = max(t - prev_t, 1e-9)
        prev_t = t
        row = {"t_s": round(t, 3), "answered": len(lat), "answered_per_s": round(len(lat) / span)}
        if lat:
            row.update(p50_ms=round(lat[len(lat) // 2] * 1e3, 3), p99_ms=round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 3),
                       max_ms=round(lat[-1] * 1e3, 3))
        out.append(row)
    return out


def _progress_line(scenario: str, elapsed: float, totals: list, last: list, dt: float) -> str:
    sent, answered, errors, notifies = totals
    rate = (answered - last[1]) / dt if dt > 0 else 0.0
    return (f"loadgen {scenario} {elapsed:5.0f} s: sent {sent:,}  answered {answered:,} ({rate:,.0f}/s)  "
            f"errors {errors:,}  notifies {notifies:,}")


class Interrupted(Exception):
    """Ctrl-C during a run: ``args[0]`` is the partial result (the counters of the progress line so far)."""


class _ReportSigint:
    """Ctrl-C once the workers have returned (the merge, which sorts every latency of the run, then the printing
    and the output files): the first one is noted, not raised, so the result of the finished measurement is still
    printed and written, and the exit status is 130; a second one stops at once with the counters so far
    (``partial``), as a Ctrl-C during the run does."""

    def __init__(self):
        self.partial = None  # set when armed: the counters when the workers returned
        self.interrupted = False
        self.previous = None

    def arm(self, partial: dict) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread; elsewhere Ctrl-C is not ours to defer
        self.partial = partial
        self.previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True

    def disarm(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


#: the report in progress (run_and_print), which run_workers arms when the measurement is over
_report: _ReportSigint | None = None


def probe(host: str, port: int, timeout: float = 5.0) -> str | None:
    """Why no connection can be made to the broker (one line), or None: checked before the workers start, so a
    wrong address fails at once instead of sending nothing for the whole duration."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as e:
        return f"cannot resolve {host}: {e.strerror}"
    except socket.timeout:
        return f"cannot connect to {host}:{port}: no answer within {timeout:g} s"
    except OSError as e:
        return f"cannot connect to {host}:{port}: {e.strerror or e} (is a broker listening there?)"
    return None


def window_cpu(results: list) -> dict:
    """The broker's and the machine's CPU in the measured window, from the workers' longest window."""
    out = {}
    longest = max(results, key=lambda r: r["seconds"])
    if longest.get("server_cpu_s") is not None:
        out["server_cpu_s"] = round(longest["server_cpu_s"], 3)
        out["server_sys_s"] = round(longest["server_sys_s"], 3)
    if longest.get("server_children_cpu_s") is not None:
        out["io_workers_cpu_s"] = round(longest["server_children_cpu_s"], 3)
    if longest.get("machine_total_s"):
        out["machine_busy_pct"] = round(100 * longest["machine_busy_s"] / longest["machine_total_s"], 1)
        out["machine_niced_pct"] = round(100 * longest["machine_niced_s"] / longest["machine_total_s"], 1)
        out["machine_steal_pct"] = round(100 * longest["machine_steal_s"] / longest["machine_total_s"], 2)
    return out


def merge_measures(merged: dict, results: list, lat: list, ticks: dict, scenario: str, target: str) -> None:
    """What both load generators merge alike from their workers' results: latency percentiles, the open loop's tick
    lateness and work, the load generator's CPU and collector passes, the window's CPU, the target."""
    merged.update(_percentiles(lat))
    for k, v in ticks.items():
        if v:
            v.sort()
            merged[f"{k}_p99_ms"] = round(v[int(0.99 * (len(v) - 1))] * 1000, 3)
            merged[f"{k}_max_ms"] = round(v[-1] * 1000, 3)
    # CPU: the workers' windows overlap; the broker's and the machine's figures come from the longest window
    merged["loadgen_cpu_s"] = round(sum(r.get("loadgen_cpu_s") or 0 for r in results), 3)
    if scenario == "steady":
        merged["loadgen_gc_passes"] = [sum(r["loadgen_gc_passes"][g] for r in results) for g in range(3)]
        merged["loadgen_gc_max_ms"] = round(1000 * max(r["loadgen_gc_max_s"] for r in results), 3)
    merged.update(window_cpu(results))
    # where the window was on the machine's monotonic clock: where every worker measured at once
    windows = [r.pop("window_monotonic_s") for r in results if "window_monotonic_s" in r]
    if windows:
        merged["window_monotonic_s"] = [round(max(w[0] for w in windows), 6), round(min(w[1] for w in windows), 6)]
    merged["target"] = target


def per_heartbeat(merged: dict, work: int, seconds: float) -> dict:
    """CPU per unit of ``work`` (heartbeats answered, clients registered) of the load generator and the broker."""
    out = {}
    if work:
        out["loadgen_us_per_hb"] = round(1e6 * merged["loadgen_cpu_s"] / work, 2)
        if "server_cpu_s" in merged:
            out["server_us_per_hb"] = round(1e6 * merged["server_cpu_s"] / work, 2)
            out["server_sys_us_per_hb"] = round(1e6 * merged["server_sys_s"] / work, 2)
            out["server_cpu_pct"] = round(100 * merged["server_cpu_s"] / seconds, 1)
    return out


def run_workers(worker, args: list, fields: tuple, line, partial: dict, timeout: float, progress=None) -> list:
    """Run ``worker(args[i], queue, barrier, shared)`` in one forked process per entry of ``args`` and return their
    results. Each second the sum of the workers' ``fields`` (their slots of ``shared``) is printed to ``progress`` as
    ``line(elapsed, totals, last_totals, dt)``. Ctrl-C stops the workers and raises :class:`Interrupted` with
    ``partial`` and the counters so far."""
    procs = len(args)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    barrier = ctx.Barrier(procs) if procs > 1 else None
    width = len(fields)
    shared = ctx.Array("q", procs * width, lock=False)
    ps = []
    for a in args:
        p = ctx.Process(target=worker, args=(a, q, barrier, shared), daemon=True)
        p.start()
        ps.append(p)

    def sums():
        return [sum(shared[i * width + k] for i in range(procs)) for k in range(width)]

    results = []
    started = last_t = time.monotonic()
    last = [0] * width
    while len(results) < len(ps):
        try:
            try:
                results.append(q.get(timeout=1.0))
            except KeyboardInterrupt:
                for p in ps:
                    p.terminate()
                raise Interrupted({**partial, "interrupted": True, "seconds": round(time.monotonic() - started, 3),
                                   **dict(zip(fields, sums()))}) from None
        except queue.Empty:  # a second passed
            now = time.monotonic()
            if now - started > timeout:
                raise TimeoutError("loadgen workers did not finish")
            if not any(p.is_alive() for p in ps) and q.empty():
                raise RuntimeError("loadgen workers exited without a result")
            totals = sums()
            if progress is not None:
                print(line(now - started, totals, last, now - last_t), file=progress, flush=True)
            last, last_t = totals, now
            continue
        if "worker_error" in results[-1]:
            raise RuntimeError(f"a loadgen worker failed: {results[-1]['worker_error']}")
    if _report is not None:  # the measurement is over: a Ctrl-C from here on is the report's (run_and_print)
        _report.arm({**partial, "interrupted": True, "seconds": round(time.monotonic() - started, 3),
                     **dict(zip(fields, sums()))})
    for p in ps:
        p.join(10)
    return results


def run(scenario: str, host: str, port: int, clients: int, procs: int = 1, duration: float = 5.0,
        rate: float = 0.0, groups: int = 100, consumer_share: float = 0.5, depth: int = 1, max_open: int = 0,
        server_pid: int | None = None, pending: int = 1024, burst: int = 1, vary: bool = False,
        sub_every: int = 0, progress=None) -> dict:
    """Run a scenario over ``procs`` processes and merge their results.

    With ``server_pid`` (the broker's process) the result also gives the broker's CPU seconds in the window and
    per heartbeat; ``loadgen_cpu_s`` is the load generator's own, ``machine_busy_s`` everything on the machine.
    ``progress``: a file (stderr) for a progress line each second, or None.
    """
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    args, off = [], 0
    for i, n in enumerate(per):
        args.append(dict(scenario=scenario, host=host, port=port, n=n, offset=off, duration=duration,
                          rate=rate / procs, groups=groups, consumer_share=consumer_share, depth=depth,
                          max_open=max(1, max_open // procs) if max_open else 0, server_pid=server_pid,
                          pending=max(1, pending // procs), burst=burst, vary=vary, sub_every=sub_every, index=i))
        off += n
    results = run_workers(_worker, args, PROGRESS_FIELDS,
                          lambda elapsed, totals, last, dt: _progress_line(scenario, elapsed, totals, last, dt),
                          {"scenario": scenario, "target": f"{host}:{port}"}, 900 + duration, progress)
    timeline = _timeline(results)
    lat = [x for r in results for x in r.pop("latencies")]
    ticks = {k: [x for r in results for x in r.pop(k, ())] for k in ("tick_late", "tick_work")}
    seconds = max(r["seconds"] for r in results)
    total = lambda k: sum(r.get(k) or 0 for r in results)  # noqa: E731
    merged = {"scenario": scenario, "procs": procs}
    if scenario == "steady":
        merged.update(connections=total("connections"), depth=depth, registered_s=max(r["registered_s"] for r in results),
                      warmup_s=max(r["warmup_s"] for r in results),
                      offered_rate=rate or "closed-loop", burst=burst if rate else None, sent=total("sent"),
                      offered_not_sent=total("offered_not_sent") if rate else None,
                      answered=total("answered"),
                      seconds=round(seconds, 3), heartbeats_per_s=round(total("answered") / seconds) if seconds else 0,
                      errors=total("errors"), opaque_mismatch=total("opaque_mismatch"),
                      notifies=total("notifies"), unanswered_after_drain=total("unanswered_after_drain"),
                      unregistered_connections=total("unregistered_connections"),
                      connect_failed=total("connect_failed"))
    else:
        merged.update(clients=total("clients"), max_open=max_open or "all", pending=pending,
                      registered=total("registered"), seconds=round(seconds, 3),
                      registered_per_s=round(total("registered") / seconds) if seconds else 0,
                      errors=total("errors"), opaque_mismatch=total("opaque_mismatch"),
                      unanswered=total("unanswered"), lost=total("lost"), notifies=total("notifies"),
                      connect_retries=total("connect_retries"), connect_failed=total("connect_failed"))
    merge_measures(merged, results, lat, ticks, scenario, f"{host}:{port}")
    if scenario == "steady":
        merged["vary"] = {"set_orders": vary, "subversion_every": sub_every or None}
    merged["timeline"] = timeline
    merged.update(per_heartbeat(merged, total("answered") if scenario == "steady" else total("registered"), seconds))
    return merged


# ---------------------------------------------------------------------------------------------------------------
# Output files (--out, --plot) of both load generators: never written through a symbolic link


class OutputError(Exception):
    """An output file that is not written: one line for the user."""


def check_output(path: str) -> str | None:
    """Why ``path`` cannot take an output file (a symbolic link, something other than a regular file), or None:
    checked before the run, so a mistake costs no run (exit status 2)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        # a new file: its directory must be there (and writable) now, not found missing after the whole run
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            return f"cannot write {path}: no such directory {parent}"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot write {path}: the directory {parent} is not writable"
        return None
    except OSError as e:
        return f"cannot write {path}: {e.strerror}"
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link; give the file itself (an output file is never written through a link)"
    if not stat.S_ISREG(mode):
        return f"{path} exists and is not a regular file"
    return None


def write_output(path: str, text: str) -> None:
    """``text`` into ``path`` (created 0644, or truncated): O_NOFOLLOW, so a symbolic link planted since the check
    is refused, not followed; O_NONBLOCK, so a FIFO cannot hang the open; anything but a regular file is refused
    (OutputError) before a byte is written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        raise OutputError(check_output(path) or f"cannot write {path}: {e.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"{path} exists and is not a regular file")
        os.set_blocking(fd, True)
        f.write(text)


def check_outputs(a) -> int:
    """Before the run: --out and --plot can be written (0), else one line and exit status 2."""
    for path in (a.out, a.plot):
        why = path and check_output(path)
        if why:
            print(f"rmqhb loadgen: {why}", file=sys.stderr)
            return 2
    return 0


def write_outputs(a, text: str, res: dict) -> int:
    """After the run (its result printed): --out gets the JSON result, --plot the SVG; 0, or one line and exit
    status 1 when one cannot be written (swapped for a link or a FIFO during the run, a full disk)."""
    try:
        if a.out:
            write_output(a.out, text + "\n")
        if a.plot:
            write_output(a.plot, plot_svg(res))
    except (OutputError, OSError) as e:
        print(f"rmqhb loadgen: {e if isinstance(e, OutputError) else f'cannot write: {e.strerror}'}",
              file=sys.stderr)
        return 1
    return 0


def run_and_print(a, run_fn) -> tuple:
    """Both load generators' run: its JSON result on stdout, then --out and --plot; (exit status, result). Ctrl-C
    during the run: the counters so far on stdout as a result would be, then one line (130, None). Ctrl-C after the
    run (merging, printing, writing): the result is finished, printed and written all the same, then one line
    (130, result); a second Ctrl-C there: the counters, unless the result was being printed already (130, None)."""
    global _report
    report = _report = _ReportSigint()
    printed = False
    try:
        try:
            res = run_fn()
        except Interrupted as e:
            print(json.dumps(e.args[0]))
            print(f"rmqhb loadgen: interrupted after {e.args[0]['seconds']:.1f} s (partial result above)",
                  file=sys.stderr)
            return 130, None
        text = json.dumps(res)
        printed = True
        print(text)
        status = write_outputs(a, text, res)
    except KeyboardInterrupt:
        if report.partial is None:
            raise  # before the workers returned: not ours (rmqhb's one line, 130)
        if not printed:
            print(json.dumps(report.partial))
        what = "the result above may be cut short" if printed else "partial result above: the counters only"
        print(f"rmqhb loadgen: interrupted twice after the run ({what})", file=sys.stderr)
        return 130, None
    finally:
        report.disarm()
        _report = None
    if report.interrupted:
        print(f"rmqhb loadgen: interrupted after the run ({res.get('seconds', 0):.1f} s measured): the result above "
              "is complete", file=sys.stderr)
        return 130, res
    return status, res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rmqhb loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=["steady", "storm"])
    p.add_argument("--protocol", choices=["remoting", "grpc"], default="remoting",
                   help="remoting: 4.x/5.x clients' remoting heartbeats (these options); grpc: RocketMQ 5.x SDK "
                        "sessions on a gRPC port (rmqhb loadgen steady --protocol grpc -h)")
    p.add_argument("--broker", required=True, metavar="HOST:PORT",
                   help="the broker's remoting address (required: the load goes wherever it points)")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=0.0, help="offered heartbeats/s (0 = closed loop)")
    p.add_argument("--depth", type=int, default=1, help="closed loop: heartbeats in flight per connection")
    p.add_argument("--burst", type=int, default=1,
                   help="open loop: heartbeats each due connection pipelines in one write (default 1)")
    p.add_argument("--max-open", type=int, default=0,
                   help="storm: churn mode, at most this many clients connected at once (each leaves once registered)")
    p.add_argument("--pending", type=int, default=1024,
                   help="storm: clients connecting or awaiting their first answer at a time (all processes)")
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--consumer-share", type=float, default=0.5)
    p.add_argument("--server-pid", type=int, help="the broker's pid (same machine): report its CPU use in the window")
    p.add_argument("--vary", action="store_true",
                   help="steady: send each client's heartbeat in its other set orders in turn, as a Java client does")
    p.add_argument("--subversion-every", type=int, default=0, metavar="N",
                   help="steady: every N-th heartbeat of a consumer carries a newer subVersion (0: never)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--plot", help="write latency and answered rate over time to this SVG file")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    a = p.parse_args(argv)
    if a.protocol != "remoting":  # rmqhb loadgen hands --protocol grpc to engine.loadgen_grpc (engine.cli)
        p.error("--protocol grpc is run as rmqhb loadgen --protocol grpc (engine.loadgen_grpc)")
    host, _, port = a.broker.rpartition(":")
    if not host or not port.isdigit() or a.clients < 1 or a.procs < 1 or a.subversion_every < 0:
        p.error("--broker HOST:PORT, --clients >= 1, --procs >= 1, --subversion-every >= 0")
    if not (math.isfinite(a.duration) and math.isfinite(a.rate)):
        p.error("--duration and --rate take finite numbers (not inf or nan)")
    if not int(port) < 65536 or not a.duration > 0 or a.rate < 0 or a.groups < 1 or a.depth < 1 or a.burst < 1 \
            or a.pending < 1 or a.max_open < 0 or not 0 <= a.consumer_share <= 1:
        p.error("a port below 65536, --duration > 0, --rate >= 0, --groups, --depth, --burst, --pending >= 1, "
                "--max-open >= 0, --consumer-share from 0 to 1")
    host = host.strip("[]")
    if check_outputs(a):
        return 2
    unreachable = probe(host, int(port))
    if unreachable:
        print(f"rmqhb loadgen: {unreachable}", file=sys.stderr)
        return 1
    status, _ = run_and_print(a, lambda: run(
        a.scenario, host, int(port), a.clients, a.procs, a.duration, a.rate, a.groups, a.consumer_share, a.depth,
        a.max_open, a.server_pid, a.pending, a.burst, vary=a.vary, sub_every=a.subversion_every,
        progress=None if a.quiet else sys.stderr))
    return status


def plot_svg(res: dict, width: int = 900, height: int = 520) -> str:
    """Latency percentiles (p50, p99, max; ms) and the answered rate per second over the measured window, as a
    self-contained SVG (no scripts, no external references)."""
    from html import escape

    rows = res.get("timeline") or []
    left, right, top, mid, bottom = 70, 20, 40, height // 2 + 10, height - 40
    plot_w = width - left - right
    t_max = max((r["t_s"] for r in rows), default=1.0) or 1.0

    def x(t):
        return left + plot_w * t / t_max

    def panel(y0, y1, series, unit):
        v_max = max((r.get(k, 0) for r in rows for k, _ in series), default=0) or 1
        out = [f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{y1 - y0}" fill="none" stroke="#999"/>',
               f'<text x="{left - 6}" y="{y0 + 4}" text-anchor="end" font-size="11">{v_max:,.3g}</text>',
               f'<text x="{left - 6}" y="{y1}" text-anchor="end" font-size="11">0</text>',
               f'<text x="{left - 60}" y="{(y0 + y1) // 2}" font-size="11">{escape(unit)}</text>']
        for i, (key, color) in enumerate(series):
            pts = " ".join(f"{x(r['t_s']):.1f},{y1 - (y1 - y0) * r.get(key, 0) / v_max:.1f}" for r in rows if key in r)
            if pts:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
            out.append(f'<text x="{left + 10 + 90 * i}" y="{y0 + 14}" font-size="11" fill="{color}">{key}</text>')
        return out

    # the clients: a gRPC steady result's sessions, a storm's clients, a remoting steady result's connections (one
    # per client); a gRPC result's connections carry several sessions each, so they are given apart
    clients = next((res[k] for k in ("sessions", "clients", "connections") if k in res), "?")
    title = f"rmqhb loadgen {res.get('scenario')} against {res.get('target')}: {clients} clients"
    if res.get("protocol") == "grpc" and "connections" in res:
        title += f" on {res['connections']} connections"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>']
    parts += panel(top, mid - 20, [("p50_ms", "#1f77b4"), ("p99_ms", "#ff7f0e"), ("max_ms", "#d62728")], "latency ms")
    parts += panel(mid + 10, bottom, [("answered_per_s", "#2ca02c")], "answers/s")
    parts.append(f'<text x="{left}" y="{height - 15}" font-size="11">0 s</text>')
    parts.append(f'<text x="{left + plot_w}" y="{height - 15}" text-anchor="end" font-size="11">{t_max:.1f} s '
                 f'(measured window)</text>')
    if not rows:
        parts.append(f'<text x="{left + 20}" y="{top + 40}" font-size="13">no timeline: the window was shorter than '
                     f'a second</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
