"""The remoting server: asyncio, one protocol object per connection, a processor table keyed by request code.

Shape (NettyRemotingServer + BrokerController.registerProcessor, on one event loop):

* :class:`Connection` is the per-connection protocol. It feeds a :class:`engine.FrameDecoder`, dispatches every
  complete request, and writes the responses of one read in one ``transport.write``. It is also the channel key
  the registry files registrations under, so closing it removes the client at once. Two implementations:
  :class:`NativeConnection` (``data_received``, the repeat route and HEART_BEAT served straight from the registry
  in Cython, engine.broker._protocol; every other request through :meth:`RemotingServer.dispatch`) and its
  pure-Python twin :class:`PyConnection` (ENGINE_NO_EXTENSIONS=1); ``Connection`` is the one in use.
* The processor table maps a request code to (handler, executor). Executors stand in for the broker's thread
  pools: the heartbeat executor runs inline in the read callback (the shortest path, so heartbeats are answered in
  well under 3 s whatever else is queued); client-manage, consumer-manage, pull and admin work each go through a
  bounded queue drained a slice at a time between I/O callbacks. A full queue answers SYSTEM_BUSY
  "[OVERLOAD]system busy, start flow control for a while", as Netty does on RejectedExecutionException, and a
  request that waited in its queue past the fast-failure limit is answered SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]..."
  instead of late, as BrokerFastFailure does; both are counted per executor in the metrics.
* Limits: max connections and max per IP (refused with a SYSTEM_BUSY answer to the first request, then closed),
  max frame size (FrameDecoder), a timeout for an incomplete frame (slowloris), all-idle timeout (120 s), a
  bound on responses queued for a client that does not read them, and a bound on requests in flight per
  connection (reading pauses until they drain).
* A bad connection is closed with exactly one logged reason; nothing it did affects other connections.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import time

try:
    import resource
except ImportError:  # not POSIX
    resource = None
from collections import Counter, deque

from engine import FrameDecoder, FrameError, RemotingCommand, compiled_module
from engine.codec.enums import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode
from engine.codec.errors import RemotingError, clip
from engine.logutil import RateLimitedLog
from engine.broker.metrics import METRICS_MAX_CONNECTIONS
from engine.broker.repeat import CacheBudget, RepeatRoute
from engine.broker.shares import share_key

log = logging.getLogger("engine.broker.server")

OVERLOAD_REMARK = "[OVERLOAD]system busy, start flow control for a while"
#: descriptors kept free below RLIMIT_NOFILE for the store, metrics, name-server links and refused connections
FD_RESERVE = 256
#: refused connections held open at once to answer their first request; the rest are closed at once. Part of
#: FD_RESERVE, so the broker's own files keep at least FD_RESERVE - REFUSED_HELD descriptors.
REFUSED_HELD = 64
#: longest remark an answer carries (a longer one, e.g. echoing a client's huge group name, is clipped)
MAX_REMARK = 512
_FAILURE_TEXT = {
    "internal_error": "internal error",
    "answer_too_large": "the answer is larger than the frame limit",
    "encode_failed": "the answer could not be encoded",
}
#: BrokerFastFailure.cleanExpiredRequestInQueue: the answer to a request that waited in its queue too long.
TIMEOUT_CLEAN_QUEUE_REMARK = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: "
                              "%dms, size of queue: %d")


class ConnectionMethods(asyncio.Protocol):
    """What both implementations of a client connection share: everything but the state's layout and, in the
    native one, ``data_received`` (see :class:`PyConnection` and :class:`NativeConnection`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote_addr} {self.port_name}>"

    @property
    def repeat(self):
        """The repeat route's armed answer (HeartbeatRepeat), or None (a view of ``route.armed``)."""
        return self.route.armed

    @property
    def hb_body(self) -> bytes | None:
        """The body of the last heartbeat decoded in full here (a view of ``route.body``)."""
        return self.route.body

    # ---- asyncio callbacks ----
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.remote_ip, self.remote_port = peer[0], peer[1]
        self.remote_addr = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("sockname") or ("", 0)
        self.local_ip = sock[0]
        self.local_port = sock[1] if len(sock) > 1 else 0
        self.server._on_connection_made(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        server = self.server
        self.last_io = server.tick
        bad = None
        try:
            commands = self.decoder.feed(data)
        except FrameError as e:
            server.metrics.frame_errors += 1
            # as Netty, the requests completed before the bad frame are processed (an offset commit sent just
            # before it is not lost), and their answers flushed before the close
            bad, commands = e, getattr(e, "commands", None)
        if commands:  # dispatched here, not in a helper: one call less per heartbeat read
            self._out = out = []
            self._out_bytes = 0
            route = self.route
            replayed = full = False
            try:
                for cmd in commands:
                    if self.closing:
                        break
                    if type(cmd) is int:  # a repeat of the armed heartbeat: only its opaque
                        armed = route.armed
                        if armed is not None:
                            answer = armed.answer(self, cmd)
                            if answer is not None:
                                out.append(answer)
                                continue
                            route.armed = None
                        replayed = True  # the full path from here on; the read's later repeats too
                        cmd = self.decoder.repeat_command(cmd)
                    full = True
                    server.dispatch(self, cmd)
            except Exception:
                # a failure outside the handlers' own guard (server.run), e.g. in the repeat route or the ACL
                # check: answers already made go out, the connection closes, and the log gets one traceback a
                # minute, not asyncio's per-read "Fatal error" traceback (a free clause: the try is here anyway)
                server._dispatch_failed(self)
            finally:
                self._out = None
                if route.candidate is not None:
                    route.arm(self.closing, self.decoder)
                if replayed and route.armed is None:
                    route.disarm(self.decoder)
                if full:  # the read's heartbeat frame was only kept for arm(): not past the read
                    self.decoder.drop_watched()
                if out and not self.closing:
                    self._write(b"".join(out) if len(out) > 1 else out[0])
        if bad is not None:
            self.close(f"undecodable frame: {bad}", abort=False)
            return
        buffered = self.decoder.buffered
        if buffered != self.buffered and not self.closing:
            self._track_partial(buffered)

    def _track_partial(self, buffered: int) -> None:
        """Account the bytes this connection holds in a partial frame against the server-wide budget
        (maxPartialFrameBytesTotal); the connection that would pass it is closed."""
        server = self.server
        server.partial_bytes += buffered - self.buffered
        self.buffered = buffered
        if buffered:
            if self.partial_since is None:
                self.partial_since = server.tick
                server.partial.add(self)
            if server.partial_bytes > server.config.max_partial_frame_bytes_total:
                limit = server.config.max_partial_frame_bytes_total
                self.close(f"partial frames over budget ({buffered} bytes buffered here, "
                           f"maxPartialFrameBytesTotal={limit})")
        elif self.partial_since is not None:
            self.partial_since = None
            server.partial.discard(self)

    def _untrack_partial(self) -> None:
        server = self.server
        server.partial_bytes -= self.buffered
        self.buffered = 0
        self.partial_since = None
        server.partial.discard(self)

    def connection_lost(self, exc) -> None:
        self.closing = True
        if self.buffered:
            self._untrack_partial()
        self.route.release(self.decoder)  # its heartbeat bytes leave maxHeartbeatCacheBytesTotal
        for handle in self.held_pulls.values():
            handle.cancel()
        self.held_pulls.clear()
        self.server._on_connection_lost(self, exc)

    def pause_writing(self) -> None:
        # the transport's buffer is over its high-water mark: stop reading requests until the client catches up
        # (the sweep disconnects a client that stays stalled longer than writeStallTimeoutMs)
        self.write_paused_since = time.monotonic()
        self.server.stalled.add(self)
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self.server.stalled.discard(self)
        if self.inflight <= self.server.config.max_inflight_per_connection // 2:
            self._resume_reading()

    # ---- output ----
    def send(self, data: bytes) -> None:
        """Queue a whole encoded frame for the client (batched when called during a read)."""
        if self.closing:
            return
        if self._out is not None:
            self._out.append(data)
        else:
            self._write(data)

    def send_soon(self, data: bytes) -> None:
        """Queue a frame caused by another connection's request (NOTIFY_CONSUMER_IDS_CHANGED): what one loop
        iteration queues for this client goes out in one write after the iteration's reads, not one write each
        (a group's registration storm notifies every member once per joining client)."""
        if self.closing:
            return
        if self._out is not None:
            self._out.append(data)
        elif self._soon is not None:
            self._soon.append(data)
        else:
            self._soon = [data]
            self.server._queue_soon(self)

    def _flush_soon(self) -> None:
        out, self._soon = self._soon, None
        if out and not self.closing:
            self._write(b"".join(out) if len(out) > 1 else out[0])

    def send_command(self, cmd) -> None:
        self.send(cmd.encode())

    def _flush_out(self) -> None:
        """Write the read's batch now (its answers passed RemotingServer.out_flush_bytes); the read goes on
        batching."""
        out = self._out
        data = b"".join(out)
        out.clear()
        self._out_bytes = 0
        self._write(data)

    def _write(self, data: bytes) -> None:
        t = self.transport
        t.write(data)
        self.last_io = self.server.tick
        if t.get_write_buffer_size() > self.server.config.max_write_buffer_bytes:
            self.close(f"client does not read its responses ({t.get_write_buffer_size()} bytes pending)", abort=True)

    def close(self, reason: str, *, abort: bool = True, level=logging.WARNING) -> None:
        """Close with one logged reason (the first one wins); abort drops unsent output."""
        if self.closing:
            return
        if not abort and self.transport is not None:
            # frames queued for this client (notifications, answers batched in this read) go out before the close
            if self._soon:
                self.transport.write(b"".join(self._soon))
            if self._out:
                self.transport.write(b"".join(self._out))
                self._out.clear()
        self._soon = None
        self.closing = True
        self.close_reason = reason
        if self.buffered:  # a closing connection reads no more: its partial frame leaves the budget now
            self._untrack_partial()
        self.route.release(self.decoder)  # and so do its cached heartbeat bytes (maxHeartbeatCacheBytesTotal)
        kind = _reason_kind(reason)
        # one line per closed connection, but a client opening and breaking connections cannot flood the log
        self.server.client_log.log(level, kind, "closing %s (%s): %s", self.remote_addr, self.port_name, reason)
        self.server.metrics.connections_closed[kind] += 1
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def _pause_reading(self) -> None:
        if not self.reading_paused and not self.closing:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and not self.closing:
            self.reading_paused = False
            self.transport.resume_reading()


class PyConnection(ConnectionMethods):
    """One client connection; also the registry's channel key (hashable by identity). The pure-Python twin of
    :class:`NativeConnection` (engine.broker._protocol), used under ENGINE_NO_EXTENSIONS=1 or when it is not built."""

    __slots__ = ("server", "port_name", "id", "transport", "decoder", "remote_ip", "remote_port", "remote_addr",
                 "local_ip", "local_port", "closing", "close_reason", "rejected", "partial_since", "buffered",
                 "last_io", "inflight", "reading_paused", "write_paused_since", "serialize_type", "held_pulls",
                 "route", "_out", "_out_bytes", "_soon", "__weakref__")

    def __init__(self, server: "RemotingServer", port_name: str):
        self.server = server
        self.port_name = port_name
        self.id = server._next_conn_id()
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(server.config.max_frame_size)
        self.remote_ip = ""
        self.remote_port = 0
        self.remote_addr = ""
        self.local_ip = ""
        self.local_port = 0
        self.closing = False
        self.close_reason: str | None = None
        self.rejected: str | None = None  # limit that refused this connection, answered on its first request
        self.partial_since: float | None = None  # tick when the buffered partial frame started
        self.buffered = 0  # bytes of a partial frame held by the decoder, as counted in server.partial_bytes
        self.last_io = server.tick
        self.inflight = 0
        self.reading_paused = False
        self.write_paused_since: float | None = None  # the client stopped reading what we write
        self.serialize_type = "JSON"  # of the client's last request: NOTIFY goes out in the same form
        self.held_pulls: dict = {}  # opaque -> TimerHandle of a held PULL_MESSAGE
        # the repeat route (a heartbeat the client repeats: the decoder returns each repeat's opaque, answered by
        # the route's armed answer) and the cached decode of the last heartbeat body
        self.route = RepeatRoute(server.hb_cache)
        if server.repeats and server.hb_cache.limit:  # maxHeartbeatCacheBytesTotal 0: no route
            self.decoder.watch_code = RequestCode.HEART_BEAT
        self._out: list | None = None  # responses batched during one data_received
        self._out_bytes = 0  # of them, the bytes of the processors' answers (out_flush_bytes)
        self._soon: list | None = None  # frames from send_soon, written once this loop iteration's reads are done


_protocol = compiled_module("_protocol")
ProtocolCore = _protocol.ProtocolCore if _protocol is not None else None  # None: the twin serves
if ProtocolCore is not None:
    class NativeConnection(ProtocolCore, ConnectionMethods):
        """A client connection whose state and ``data_received`` are native (engine.broker._protocol); the rest is
        :class:`ConnectionMethods`, shared with the twin :class:`PyConnection`."""

        __slots__ = ()
else:
    NativeConnection = None

#: the implementation in use: the native one when built (and ENGINE_NO_EXTENSIONS is unset), else the twin
Connection = NativeConnection or PyConnection


def connection_capacity(max_connections: int) -> int:
    """maxConnections, lowered to RLIMIT_NOFILE - FD_RESERVE: a client over the descriptor limit would otherwise
    be dropped at accept with no answer, and the store could no longer open its files."""
    if resource is None:
        return max_connections
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


def listener_budget(cfg) -> dict[str, int]:
    """maxConnections split between the listeners of this process, so that together they never take the
    descriptors kept for the store, the recorder and the name-server links (FD_RESERVE): the gRPC port's share is
    grpcMaxConnections (at most half of what is left, so a flood there cannot shut the remoting port out), the
    metrics endpoint's METRICS_MAX_CONNECTIONS, the remoting ports (main and fast together) the rest.
    {"remoting", "grpc", "metrics"} -> connections; a listener that is off has 0 (grpc: its share all the same,
    for an endpoint started with an explicit port)."""
    own = connection_capacity(cfg.max_connections)
    metrics = METRICS_MAX_CONNECTIONS if cfg.metrics_port else 0
    grpc = max(1, min(cfg.grpc_max_connections, (own - metrics) // 2))
    others = metrics + (grpc if cfg.grpc_server_port else 0)
    return {"remoting": max(1, own - others), "grpc": grpc, "metrics": metrics}


#: accept failures by errno name (EMFILE, ENFILE, ENOBUFS, ENOMEM): what the loop reports as an exception
_ACCEPT_MESSAGES = ("socket.accept() out of system resource", "error status in uv_stream_t.listen callback")


def install_accept_error_handler(loop, metrics, errors_log) -> None:
    """Accept failures (the process is out of descriptors or memory) are counted per listener
    (accept_errors_total) and logged once a minute without a traceback; asyncio logs a traceback for each one
    (its loop then pauses that listener for a second), which a flood turns into a flood of the log. Any other
    exception goes to the handler that was there before (or the loop's default). The listener is named by its
    local port (``metrics.listener_ports``)."""
    previous = loop.get_exception_handler()

    def handler(loop, context):
        message = context.get("message") or ""
        exc = context.get("exception")
        if isinstance(exc, OSError) and message.startswith(_ACCEPT_MESSAGES):
            port = None
            sock = context.get("socket")
            try:
                port = sock.getsockname()[1] if sock is not None else None
            except (OSError, IndexError, TypeError):
                pass
            listener = metrics.listener_ports.get(port, "other")
            reason = errno.errorcode.get(exc.errno, "error")
            metrics.accept_errors[listener] += 1
            errors_log.log(logging.WARNING, ("accept", listener, reason),
                           "%s port: accepting a connection failed (%s); the listener retries (counted in "
                           "accept_errors_total)", listener, reason)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def _reason_kind(reason: str) -> str:
    for prefix, kind in (("undecodable", "frame_error"), ("incomplete frame", "incomplete_frame"),
                         ("idle", "idle"), ("client does not read", "write_buffer"), ("channel expired", "expired"),
                         ("too many", "limit"), ("broker shutting down", "shutdown"),
                         ("partial frames over budget", "partial_budget"), ("internal error", "internal_error")):
        if reason.startswith(prefix):
            return kind
    return "other"


# ---------------------------------------------------------------------------------------------------------------
# Executors


class InlineExecutor:
    """Runs the handler at once, inside the read callback, its answer in the read's one write: HEART_BEAT,
    UNREGISTER_CLIENT and GET_CONSUMER_LIST_BY_GROUP (processors.PROCESSOR_TABLE says why)."""

    def __init__(self, server: "RemotingServer", name: str):
        self.server, self.name = server, name

    def submit(self, conn: Connection, cmd, handler) -> None:
        self.server.run(conn, cmd, handler)

    def __len__(self) -> int:
        return 0


class QueueExecutor:
    """A bounded FIFO drained ``budget`` requests at a time between I/O callbacks (a thread pool's stand-in).

    Fast failure (BrokerFastFailure): a request that waited longer than ``max_wait_ms`` (0 = no limit) is not run
    but answered SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]..." when it reaches the head: its client gives up after its
    invoke timeout (3 s) and would only see a late answer, so the work is skipped and the client backs off.
    """

    #: expired requests answered per drain slice beyond the ``budget`` of requests run (answering is cheap)
    EXPIRE_BUDGET = 1024

    def __init__(self, server: "RemotingServer", name: str, capacity: int, budget: int = 64, max_wait_ms: int = 0):
        self.server, self.name, self.capacity, self.budget = server, name, capacity, budget
        self.max_wait = max_wait_ms / 1000.0
        self.queue: deque = deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self.queue)

    def submit(self, conn: Connection, cmd, handler) -> None:
        server = self.server
        if len(self.queue) >= self.capacity:
            server.metrics.overloaded[self.name] += 1
            if not cmd.is_oneway:
                conn.send_command(cmd.response(ResponseCode.SYSTEM_BUSY, remark=OVERLOAD_REMARK))
            return
        self.queue.append((conn, cmd, handler, time.monotonic()))
        conn.inflight += 1
        if conn.inflight > server.config.max_inflight_per_connection:
            conn._pause_reading()
        if not self._scheduled:
            self._scheduled = True
            server.loop.call_soon(self._drain)

    def _drain(self) -> None:
        server = self.server
        q = self.queue
        limit = server.config.max_inflight_per_connection // 2
        n = expired = 0
        max_wait, now = self.max_wait, time.monotonic()
        try:
            while q and n < self.budget and expired < self.EXPIRE_BUDGET:
                conn, cmd, handler, queued_at = q.popleft()
                try:
                    conn.inflight -= 1
                    # reading resumes once few requests wait, unless the client does not read its answers
                    # (resume_writing resumes it then)
                    if conn.reading_paused and conn.inflight <= limit and conn.write_paused_since is None:
                        conn._resume_reading()
                    if max_wait and now - queued_at > max_wait:
                        expired += 1
                        self._expire(conn, cmd, now - queued_at)
                        continue
                    # a request decoded before its connection closed still runs (an offset commit is not lost, as
                    # in Java's executors); its answer is dropped
                    server.run(conn, cmd, handler)
                except Exception:  # run() answers every failure itself: this is a last line of defence
                    server.metrics.request_errors["internal_error"] += 1
                    server.errors_log.log(logging.ERROR, ("drain", self.name), "executor %s: request %d failed",
                                          self.name, cmd.code, exc_info=True)
                n += 1
                if max_wait and n % 8 == 0:
                    now = time.monotonic()  # handlers take time: keep the clock of the wait check fresh
        finally:
            # whatever happened above, the queue keeps draining
            if q:
                server.loop.call_soon(self._drain)
            else:
                self._scheduled = False

    def _expire(self, conn: Connection, cmd, waited_s: float) -> None:
        self.server.metrics.queue_timeouts[self.name] += 1
        if not cmd.is_oneway and not conn.closing:
            remark = TIMEOUT_CLEAN_QUEUE_REMARK % (int(waited_s * 1000), len(self.queue))
            conn.send_command(cmd.response(ResponseCode.SYSTEM_BUSY, remark=remark))


# ---------------------------------------------------------------------------------------------------------------


class RemotingServer:
    """Listens on the main port and the fast port (main - 2) with one processor table; tracks connections."""

    #: the protocol class of client connections (tests set it per server to drive one implementation)
    connection_class = Connection
    #: the inline executor's class, for the native protocol's check of the heartbeat entry
    _inline_type = InlineExecutor
    #: the answers made during one read go out in one write; the processors' answers are counted (a consumer list
    #: is ~40 B per member of the group; the repeat route's templated heartbeat answers, smaller than their
    #: requests, are not), and past this many bytes the batch is written at once, so one read of small requests
    #: cannot build an unbounded write (the write-buffer limit then closes a client that does not read them)
    out_flush_bytes = 64 * 1024

    def __init__(self, config, metrics, *, on_close=None, acl=None, acl_exempt=frozenset()):
        self.config = config
        self.metrics = metrics
        self.loop: asyncio.AbstractEventLoop | None = None
        self.acl = acl
        self.acl_exempt = acl_exempt
        self.on_close = on_close  # callback(conn) after a connection is gone (registry cleanup)
        self.table: dict[int, tuple] = {}
        self.default: tuple | None = None
        self.executors: dict[str, object] = {}
        self.connections: set[Connection] = set()
        self.per_ip: Counter = Counter()
        self.servers: list[asyncio.AbstractServer] = []
        self.ports: dict[str, int] = {}
        self.tick = time.monotonic()
        self._conn_seq = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self._closing = False
        self._soon: list[Connection] = []  # connections with send_soon frames to flush
        # what the once-a-second sweep looks at: the few connections holding a partial frame or stalled on
        # writes, and a slice of the idle-check pass (so 20k connections never block the loop for a whole pass)
        self.partial: set[Connection] = set()
        self.partial_bytes = 0  # bytes held in partial frames across connections (maxPartialFrameBytesTotal)
        self.refused: set[Connection] = set()  # refused connections held open to answer their first request
        self.stalled: set[Connection] = set()
        self._idle_pass: list[Connection] = []
        self.max_connections = config.max_connections  # maxConnections, capped by the descriptor limit at start
        self.io_pool = None  # engine.broker.ioworker.IOWorkerPool when ioWorkers > 0: sockets live in worker processes
        #: repeated heartbeats take the short route (Connection.repeat): the Broker turns it on when no request
        #: must be seen whole (no ACL, no recording); a connection's decoder watches heartbeats only then
        self.repeats = False
        #: heartbeat bytes the connections keep after their reads (cached bodies, armed repeat patterns), together
        #: (maxHeartbeatCacheBytesTotal; 0: none kept, no repeat route)
        self.hb_cache = CacheBudget(config.max_heartbeat_cache_bytes_total)
        self.errors_log = RateLimitedLog(log)  # failed requests: one line per kind a minute
        #: what clients cause (closes, bad heartbeats, ACL refusals): at most 20 lines per kind a minute
        self.client_log = RateLimitedLog(log, burst=20)
        # the native protocol's cache: the HEART_BEAT table entry it last looked at and the Processors it serves
        # heartbeats with inline (None: every heartbeat through dispatch)
        self._hb_entry = None
        self._hb_procs = None

    def _queue_soon(self, conn: Connection) -> None:
        if not self._soon:
            if self.loop is None or not self.loop.is_running():
                conn._flush_soon()  # no loop iteration to wait for (embedding code driving a stopped server)
                return
            self.loop.call_soon(self._flush_soon)
        self._soon.append(conn)

    def _flush_soon(self) -> None:
        conns, self._soon = self._soon, []
        for conn in conns:
            conn._flush_soon()

    def new_connection(self, port_name: str) -> Connection:
        """The protocol object of a client connection accepted on ``port_name`` (asyncio's protocol factory, and
        the I/O worker pool's for the sockets it hands off)."""
        return self.connection_class(self, port_name)

    def _next_conn_id(self) -> int:
        self._conn_seq += 1
        return self._conn_seq

    # ---- processor table ----
    def executor(self, name: str, capacity: int | None = None):
        """The named executor (created on first use; capacity None = inline)."""
        ex = self.executors.get(name)
        if ex is None:
            ex = (InlineExecutor(self, name) if capacity is None
                  else QueueExecutor(self, name, capacity, max_wait_ms=self._max_wait_ms(name)))
            self.executors[name] = ex
        return ex

    def _max_wait_ms(self, name: str) -> int:
        """BrokerFastFailure's wait limit of an executor queue (waitTimeMillsInPullQueue for pulls)."""
        cfg = self.config
        if not cfg.broker_fast_failure_enable:
            return 0
        return cfg.wait_time_mills_in_pull_queue if name == "pull" else cfg.wait_time_mills_in_queue

    def register_processor(self, code: int, handler, executor) -> None:
        self.table[int(code)] = (handler, executor)

    def register_default_processor(self, handler, executor) -> None:
        self.default = (handler, executor)

    # ---- lifecycle ----
    async def start(self) -> dict[str, int]:
        self.loop = asyncio.get_running_loop()
        cfg = self.config
        # the remoting ports' share of the one budget of all listeners (the gRPC and metrics ports take theirs)
        budget = listener_budget(cfg)
        self.max_connections = budget["remoting"]
        others = connection_capacity(cfg.max_connections) - budget["remoting"]
        if self.max_connections < cfg.max_connections and not getattr(cfg, "io_workers", 0):
            log.info("maxConnections=%d: at most %d connections on the remoting ports (%d descriptors kept for the "
                     "broker's own files, %d connections for the gRPC and metrics ports)", cfg.max_connections,
                     self.max_connections, FD_RESERVE, others)
        self.metrics.listener_limits["remoting"] = self.max_connections
        self.metrics.listener_open["remoting"] = lambda: len(self.connections)
        if getattr(cfg, "io_workers", 0):
            from engine.broker.ioworker import IOWorkerPool

            # started once the ports are bound; the core keeps at most what its own descriptors allow
            self.io_pool = IOWorkerPool(self, cfg.io_workers, min(cfg.io_core_connections, budget["remoting"]))
        pooled = self.io_pool is not None  # then the pool accepts on the bound sockets and hands them off
        host = cfg.listen_host or None
        main = await self.loop.create_server(lambda: self.new_connection("main"), host, cfg.listen_port,
                                             reuse_address=True, backlog=4096, start_serving=not pooled)
        self.servers.append(main)
        self.ports["main"] = main.sockets[0].getsockname()[1]
        if cfg.fast_port_enable:
            fast_port = max(0, self.ports["main"] - 2) if cfg.listen_port else 0
            fast = await self.loop.create_server(lambda: self.new_connection("fast"), host, fast_port,
                                                 reuse_address=True, backlog=4096, start_serving=not pooled)
            self.servers.append(fast)
            self.ports["fast"] = fast.sockets[0].getsockname()[1]
        if pooled:
            try:
                await self.io_pool.start()
            except BaseException:
                for s in self.servers:
                    s.close()
                self.servers.clear()
                raise
            # client sockets are held by the workers and the core's share: the limit is what their descriptors allow
            self.max_connections = min(max(1, cfg.max_connections - others),
                                       self.io_pool.capacity + self.io_pool.core_connections)
            self.metrics.listener_limits["remoting"] = self.max_connections
            log.info("ioWorkers=%d, ioCoreConnections=%d: at most %d connections", cfg.io_workers,
                     self.io_pool.core_connections, self.max_connections)
            for s, name in zip(self.servers, ("main", "fast")):
                self.io_pool.listen(s, name)
        for port in self.ports.values():
            self.metrics.listener_ports[port] = "remoting"
        install_accept_error_handler(self.loop, self.metrics, self.errors_log)
        self._sweeper = self.loop.call_later(1.0, self._sweep)
        return dict(self.ports)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop listening, close every connection (flushing what was written), wait up to ``grace`` s."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for s in self.servers:
            s.close()
        if self.io_pool is not None:
            self.io_pool.stop_accepting()
        for conn in list(self.connections):
            conn.close("broker shutting down", abort=False, level=logging.DEBUG)
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for s in self.servers:
            await s.wait_closed()
        self.servers.clear()
        if self.io_pool is not None:
            await self.io_pool.stop()

    # ---- connections ----
    def _on_connection_made(self, conn: Connection) -> None:
        cfg = self.config
        self.metrics.connections_accepted += 1
        if self._closing:
            conn.close("broker shutting down", level=logging.DEBUG)
            return
        reason = None
        key = share_key(conn.remote_ip)  # maxConnectionsPerIp: an IPv6 client's /64, one host's, not 2^64 shares
        if len(self.connections) >= self.max_connections:
            reason = f"too many connections ({len(self.connections)}, maxConnections={self.max_connections})"
            self.metrics.connections_rejected["max_connections"] += 1
        elif cfg.max_connections_per_ip and self.per_ip[key] >= cfg.max_connections_per_ip:
            reason = (f"too many connections from {key} "
                      f"({self.per_ip[key]}, maxConnectionsPerIp={cfg.max_connections_per_ip})")
            self.metrics.connections_rejected["max_connections_per_ip"] += 1
        if reason is not None:
            self.metrics.connections_refused["remoting"] += 1
            # a few refused connections are kept just long enough to answer their first request with the reason
            # (the client then backs off instead of reconnecting at once); past REFUSED_HELD they are closed at
            # once, so a flood cannot take the descriptors kept for the broker's own files
            if len(self.refused) >= REFUSED_HELD:
                self.metrics.connections_rejected["closed_at_once"] += 1
                conn.close(reason, level=logging.DEBUG)
                return
            conn.rejected = reason
            self.refused.add(conn)
            self.loop.call_later(2.0, lambda: conn.close(reason, level=logging.DEBUG))
            return
        self.connections.add(conn)
        self.per_ip[key] += 1

    def _on_connection_lost(self, conn: Connection, exc) -> None:
        self.refused.discard(conn)
        self.partial.discard(conn)
        self.stalled.discard(conn)
        if conn in self.connections:
            self.connections.discard(conn)
            key = share_key(conn.remote_ip)
            n = self.per_ip[key] - 1
            if n > 0:
                self.per_ip[key] = n
            else:
                del self.per_ip[key]
            if conn.close_reason is None:
                self.metrics.connections_closed["peer" if exc is None else "error"] += 1
                log.debug("connection %s closed by peer%s", conn.remote_addr, f" ({exc})" if exc else "")
            if self.on_close is not None:
                self.on_close(conn)

    #: connections checked for idleness per sweep: a pass over N connections takes N / IDLE_SLICE seconds
    IDLE_SLICE = 2000

    def _sweep(self) -> None:
        """Once a second: the coarse clock, slowloris and write-stall checks, a slice of the idle check, the
        metrics rate sample. A failure in one pass is logged (once a minute) and the next pass still runs: the
        slowloris and idle limits must never stop."""
        try:
            self._sweep_once()
        except Exception:
            self.metrics.internal_errors["sweep_failed"] += 1
            self.errors_log.log(logging.ERROR, "sweep_failed", "connection sweep failed", exc_info=True)
        finally:
            if not self._closing:
                self._sweeper = self.loop.call_later(1.0, self._sweep)

    def _sweep_once(self) -> None:
        now = self.tick = time.monotonic()
        cfg = self.config
        partial_limit = cfg.incomplete_frame_timeout_ms / 1000.0
        idle_limit = cfg.server_channel_max_idle_time_seconds
        stall_limit = cfg.write_stall_timeout_ms / 1000.0
        for conn in list(self.partial):
            if conn.closing or conn.partial_since is None:
                self.partial.discard(conn)
            elif now - conn.partial_since > partial_limit:
                conn.close(f"incomplete frame for {now - conn.partial_since:.0f} s "
                           f"({conn.decoder.buffered} bytes buffered, limit {partial_limit:g} s)")
        for conn in list(self.stalled):
            if conn.closing or conn.write_paused_since is None:
                self.stalled.discard(conn)
            elif now - conn.write_paused_since > stall_limit:
                conn.close(f"client does not read its responses ({conn.transport.get_write_buffer_size()} bytes "
                           f"pending for {now - conn.write_paused_since:.1f} s)")
        todo = self._idle_pass
        if not todo:
            todo = self._idle_pass = list(self.connections)
        batch = todo[-self.IDLE_SLICE:]
        del todo[-self.IDLE_SLICE:]
        connections = self.connections
        for conn in batch:
            if (not conn.closing and now - conn.last_io > idle_limit and not conn.held_pulls and not conn.inflight
                    and conn in connections):
                conn.close(f"idle for {now - conn.last_io:.0f} s (serverChannelMaxIdleTimeSeconds={idle_limit})",
                           level=logging.INFO)
        self.metrics.sample()

    # ---- requests ----
    def dispatch(self, conn: Connection, cmd) -> None:
        if cmd.flag & FLAG_RESPONSE:
            log.debug("%s sent an unexpected response (code %d, opaque %d)", conn.remote_addr, cmd.code, cmd.opaque)
            return
        conn.serialize_type = cmd.serialize_type
        if conn.rejected is not None:
            if not cmd.is_oneway:
                conn.send_command(cmd.response(ResponseCode.SYSTEM_BUSY, remark=conn.rejected))
            conn.close(conn.rejected, abort=False)
            return
        code = cmd.code
        entry = self.table.get(code)
        if entry is not None:
            self.metrics.requests[code] += 1
        else:
            self.metrics.requests["other"] += 1  # one label for every code without a processor
            entry = self.default
        if entry is None:
            if not cmd.is_oneway:
                conn.send_command(cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                               remark=f" request type {code} not supported"))
            return
        if self.acl is not None and code not in self.acl_exempt:
            remark = self.acl.check(code, cmd.ext_fields, cmd.body, conn.remote_ip)
            if remark is not None:
                self.metrics.acl_denied += 1
                self.client_log.log(logging.INFO, "acl_denied", "NO_PERMISSION for request %d from %s: %s", code,
                                   conn.remote_addr, remark)
                if not cmd.is_oneway:
                    conn.send_command(cmd.response(ResponseCode.NO_PERMISSION, remark=remark))
                return
        handler, executor = entry
        if type(executor) is InlineExecutor:  # heartbeat, unregister, consumer list: one call less per request
            self.run(conn, cmd, handler)
        else:
            executor.submit(conn, cmd, handler)

    def run(self, conn: Connection, cmd, handler) -> None:
        """Call a handler; its response (if any, and if the request is not oneway) goes back to the client.

        Nothing a handler or an answer's encoding raises leaves this method: a bad request (RemotingError) is
        answered SYSTEM_ERROR with the error's short message, anything else (a bug, an answer too large to
        encode) with a remark that names the request and no exception text. Both are counted by kind and logged
        at most once a minute per kind, so a client cannot flood the log or stop an executor's queue."""
        try:
            response = handler(conn, cmd)
        except Exception as e:
            response = self._handler_failed(conn, cmd, e)
        if response is None or cmd.flag & FLAG_ONEWAY:
            return
        if type(response) is not bytes:
            response = self._encode_answer(conn, cmd, response)
        out = conn._out
        if out is not None and not conn.closing:
            out.append(response)  # Connection.send during a read, inlined (pipelined heartbeats)
            conn._out_bytes += len(response)
            if conn._out_bytes > self.out_flush_bytes:
                conn._flush_out()
        else:
            conn.send(response)

    def _handler_failed(self, conn, cmd, exc: Exception):
        """The answer to a request whose handler raised ``exc`` (called from the ``except`` clause): a bad request
        (RemotingError) is answered with the error's short message, anything else with a remark naming the
        request, its traceback logged."""
        if isinstance(exc, RemotingError):
            return self._failed(conn, cmd, "bad_request", clip(str(exc), MAX_REMARK))
        return self._failed(conn, cmd, "internal_error", None, exc_info=True)

    def _encode_answer(self, conn, cmd, response) -> bytes:
        """A handler's RemotingCommand answer as a frame: the remark clipped, an answer over the frame limit or one
        that does not encode replaced by a SYSTEM_ERROR that names the request."""
        remark = response.remark
        if remark is not None and len(remark) > MAX_REMARK:
            response.remark = clip(remark, MAX_REMARK)
        try:
            response = response.encode()
            if len(response) > self.config.max_frame_size:  # the client's decoder would refuse it
                response = self._failed(conn, cmd, "answer_too_large", None).encode()
        except Exception as e:  # a header over its limit, or a handler's value that does not encode
            kind = "answer_too_large" if "exceeds" in str(e) else "encode_failed"
            response = self._failed(conn, cmd, kind, None).encode()
        return response

    def _failed(self, conn: Connection, cmd, kind: str, remark, exc_info=None):
        """The SYSTEM_ERROR answer to a request that could not be served: ``remark`` (already short) or one
        that names the request; counted and logged (rate-limited) by kind."""
        self.metrics.request_errors[kind] += 1
        code = cmd.code
        level = logging.ERROR if kind == "internal_error" else logging.INFO
        self.errors_log.log(level, (kind, code if code in self.table else None),
                            "request %d from %s failed (%s)%s", code, conn.remote_addr, kind,
                            f": {remark}" if remark else "", exc_info=exc_info)
        if remark is None:
            remark = f"request code {code} failed: {_FAILURE_TEXT[kind]}"
        return cmd.response(ResponseCode.SYSTEM_ERROR, remark=remark)

    def _dispatch_failed(self, conn: Connection) -> None:
        """An unexpected error while dispatching a read's requests (called from its ``except``): counted,
        logged with its traceback at most once a minute, and the connection is closed after what was answered."""
        self.metrics.internal_errors["dispatch_failed"] += 1
        self.errors_log.log(logging.ERROR, "dispatch_failed", "dispatching requests from %s failed",
                            conn.remote_addr, exc_info=True)
        conn.close("internal error while dispatching requests", abort=False)

    def send_request(self, conn: Connection, code: int, ext_fields: dict, opaque: int) -> None:
        """A oneway request from the broker to a client (NOTIFY_CONSUMER_IDS_CHANGED)."""
        cmd = RemotingCommand(code, opaque=opaque, flag=FLAG_ONEWAY, ext_fields=ext_fields,
                              serialize_type=conn.serialize_type)
        conn.send(cmd.encode())
