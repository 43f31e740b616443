"""I/O worker processes: client sockets live in worker processes, the broker logic stays in the core process.

Why: one process may hold at most RLIMIT_NOFILE descriptors (20,000 here, not raisable), and one event loop does
all socket I/O on one core. With ``ioWorkers=N`` the broker (core) process keeps its listening sockets and accepts
connections itself; each accepted socket is handed to the least-loaded worker with SCM_RIGHTS and the core closes
its copy, so the core holds no client descriptors and the connection count scales with N x a worker's limit.
With ``ioCoreConnections=M`` the core first serves up to M connections itself (in-process I/O; the relay costs
about as much CPU per heartbeat again as the broker's own work) and hands only the rest to the workers: on a host
whose RLIMIT_NOFILE is 20,000, ``ioWorkers=1 ioCoreConnections=19744`` holds 20k clients at in-process cost.

A worker relays bytes only, nothing is decoded there. Core and worker talk over one stream socketpair of
length-prefixed records (:data:`HEADER`: payload length, kind, connection id), and each side writes what one loop
iteration produced in one ``send`` (the batching is what makes the relay cheap):

    core -> worker   NEW(id, port/peer/sock names; the socket rides along as SCM_RIGHTS), WRITE(id, bytes),
                     CLOSE(id, abort), PAUSE(id) / RESUME(id) reading, SHUTDOWN
    worker -> core   HELLO(pid, capacity), DATA(id, bytes), LOST(id, reason), WPAUSE / WRESUME / WBUF(id,
                     bytes buffered in the worker's transport)

In the core a :class:`VirtualTransport` per connection stands in for the asyncio transport and drives the
unchanged :class:`engine.broker.server.Connection`, so limits, the slowloris / idle / write-stall sweep, ACL, the
recorder, NOTIFY and metrics work as with in-process I/O. Its ``get_write_buffer_size`` is what is really
pending: bytes written but still in the core's link buffer plus what the worker last reported buffered for the
socket; the worker reports on pause_writing / resume_writing and, while paused, after every batch of writes.

Failure: a worker that dies is logged once; its connections are lost (the registry drops their clients at once,
NOTIFYs go out as for any close) and a replacement is started. A worker whose link reaches EOF (the core died)
closes its sockets and exits. Workers ignore SIGINT/SIGTERM: they live exactly as long as the core's link.

Run as ``python -m engine.broker.ioworker --link-fd FD --index I`` (the core does this). ``ENGINE_IOWORKER_NOFILE``
sets a worker's soft RLIMIT_NOFILE (tests use it to show connections beyond one worker's descriptor limit).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from array import array
from collections import deque

log = logging.getLogger("engine.broker.ioworker")

#: record header: payload length, kind, connection id
HEADER = struct.Struct("=IBQ")
_HDR = HEADER.size
_U64 = struct.Struct("=Q")

# core -> worker
NEW, WRITE, CLOSE, PAUSE, RESUME, SHUTDOWN = 1, 2, 3, 4, 5, 6
# worker -> core
HELLO, DATA, LOST, WPAUSE, WRESUME, WBUF = 11, 12, 13, 14, 15, 16

#: Linux SCM_MAX_FD: descriptors one sendmsg may carry
MAX_FDS_PER_SEND = 253
#: descriptors a worker keeps free below its RLIMIT_NOFILE (its loop, the link, the interpreter's own files)
WORKER_FD_RESERVE = 32
#: bytes read from a link per readiness
RECV_SIZE = 1 << 20
#: a worker stops reading its clients while this much is queued for the core, and resumes below LINK_LOW
LINK_HIGH = 32 << 20
LINK_LOW = 4 << 20
#: accepts per readiness of a listening socket
ACCEPT_BATCH = 256


class _Link:
    """One end of a core-worker link: records out (coalesced into one send per loop iteration), records in."""

    def __init__(self, loop, sock: socket.socket, on_record, on_lost, *, recv_fds=False, on_batch=None,
                 on_drain=None):
        self.loop, self.sock = loop, sock
        sock.setblocking(False)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)  # capped by the kernel's wmem/rmem_max
            except OSError:
                pass
        self.fileno = sock.fileno()
        self.on_record, self.on_lost, self.on_batch, self.on_drain = on_record, on_lost, on_batch, on_drain
        self.recv_fds = recv_fds
        self.wbuf = bytearray()
        self.wfds: deque = deque()  # (fd, stream offset of the end of its NEW record), not yet sent
        self.sent = 0  # stream offset of wbuf[0]
        self.rbuf = bytearray()  # a record split across reads
        self.fdq: deque = deque()  # descriptors received, in the order of their NEW records
        self.dirty: list = []  # VirtualTransports with bytes in wbuf (their count is cleared once wbuf drains)
        self.closed = False
        self._scheduled = False
        self._writing = False
        loop.add_reader(self.fileno, self._readable)

    # ---- out ----
    def record(self, kind: int, cid: int, payload=b"") -> None:
        if self.closed:
            return
        wbuf = self.wbuf
        wbuf += HEADER.pack(len(payload), kind, cid)
        if payload:
            wbuf += payload
        if not self._scheduled and not self._writing:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def record_fd(self, kind: int, cid: int, payload: bytes, fd: int) -> None:
        """A record with a descriptor: it goes out attached to bytes at or before the record, never after."""
        self.record(kind, cid, payload)
        self.wfds.append((fd, self.sent + len(self.wbuf)))

    def _flush(self) -> None:
        self._scheduled = False
        if not self._writing and not self.closed:
            self._send()

    def _send(self) -> None:
        wbuf = self.wbuf
        try:
            while wbuf:
                wfds = self.wfds
                if wfds:
                    k = min(len(wfds), MAX_FDS_PER_SEND)
                    fds = array("i", (wfds[i][0] for i in range(k)))
                    limit = len(wbuf) if k == len(wfds) else wfds[k - 1][1] - self.sent
                    n = self.sock.sendmsg([wbuf[:limit] if limit < len(wbuf) else wbuf],
                                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    for _ in range(k):  # the kernel holds its own references now
                        os.close(wfds.popleft()[0])
                else:
                    n = self.sock.send(wbuf)
                del wbuf[:n]
                self.sent += n
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self._lost(e)
            return
        if wbuf:
            if not self._writing:
                self._writing = True
                self.loop.add_writer(self.fileno, self._send)
        else:
            if self._writing:
                self._writing = False
                self.loop.remove_writer(self.fileno)
            if self.dirty:
                for vt in self.dirty:
                    vt.unflushed = 0
                self.dirty.clear()
        if self.on_drain is not None and len(wbuf) < LINK_LOW:
            self.on_drain()

    # ---- in ----
    def _readable(self) -> None:
        try:
            if self.recv_fds:
                data, fds, flags, _ = socket.recv_fds(self.sock, RECV_SIZE, MAX_FDS_PER_SEND)
                if fds:
                    self.fdq.extend(fds)
                if flags & getattr(socket, "MSG_CTRUNC", 0):
                    log.error("descriptors lost in transit on the core link (control data truncated)")
            else:
                data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        if not data:
            self._lost(None)
            return
        on_record = self.on_record
        if self.rbuf:
            # finish the record split across reads first, then parse the rest straight from this read
            buf = self.rbuf
            if len(buf) < _HDR:
                take = _HDR - len(buf)
                buf += data[:take]
                data = data[take:]
                if len(buf) < _HDR:
                    return
            n, kind, cid = HEADER.unpack_from(buf)
            want = _HDR + n - len(buf)
            if want > 0:
                buf += data[:want]
                data = data[want:]
                if len(buf) < _HDR + n:
                    return
            self.rbuf = bytearray()
            self._handle(kind, cid, bytes(buf[_HDR:]))
        pos, end = 0, len(data)
        unpack = HEADER.unpack_from
        while end - pos >= _HDR:
            n, kind, cid = unpack(data, pos)
            start = pos + _HDR
            if end - start < n:
                break
            pos = start + n
            try:
                on_record(kind, cid, data[start:pos])
            except Exception:  # one record's failure must not drop the rest of the read (the stream would desync)
                log.exception("handling a link record (kind %d, connection %d) failed", kind, cid)
        if pos < end:
            self.rbuf = bytearray(data[pos:])
        if self.on_batch is not None:
            self.on_batch()

    def _handle(self, kind, cid, payload) -> None:
        try:
            self.on_record(kind, cid, payload)
        except Exception:
            log.exception("handling a link record (kind %d, connection %d) failed", kind, cid)

    def _lost(self, exc) -> None:
        if self.closed:
            return
        self.close()
        self.on_lost(exc)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fileno)
        if self._writing:
            self.loop.remove_writer(self.fileno)
            self._writing = False
        for fd, _ in self.wfds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.wfds.clear()
        for fd in self.fdq:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fdq.clear()
        self.sock.close()


# =================================================================================================================
# Core side


class VirtualTransport:
    """What :class:`engine.broker.server.Connection` uses of an asyncio transport, for a socket held by a worker."""

    __slots__ = ("worker", "cid", "conn", "extra", "unflushed", "worker_buffered", "lost", "_closing", "_aborted")

    def __init__(self, worker: "IOWorker", conn, peername, sockname):
        self.worker = worker
        self.cid = conn.id
        self.conn = conn
        self.extra = {"peername": peername, "sockname": sockname}
        self.unflushed = 0  # bytes written that are still in the core's link buffer
        self.worker_buffered = 0  # bytes the worker last reported buffered for the socket
        self.lost = False
        self._closing = False
        self._aborted = False

    def write(self, data) -> None:
        if self._closing or not data:
            return
        link = self.worker.link
        link.record(WRITE, self.cid, data)
        if not self.unflushed:
            link.dirty.append(self)
        self.unflushed += len(data)

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def get_write_buffer_size(self) -> int:
        return self.unflushed + self.worker_buffered

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            if not self.lost:
                self.worker.link.record(CLOSE, self.cid, b"\x00")

    def abort(self) -> None:
        if not self._aborted:
            self._closing = self._aborted = True
            if not self.lost:
                worker = self.worker
                worker.link.record(CLOSE, self.cid, b"\x01")
                # as asyncio's abort: connection_lost on the next loop iteration, not when the worker reports it
                worker.pool.loop.call_soon(worker._aborted, self)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if not self._closing:
            self.worker.link.record(PAUSE, self.cid)

    def resume_reading(self) -> None:
        if not self._closing:
            self.worker.link.record(RESUME, self.cid)

    def get_extra_info(self, name, default=None):
        return self.extra.get(name, default)

    def __repr__(self) -> str:
        return f"<VirtualTransport #{self.cid} on I/O worker {self.worker.index}>"


class IOWorker:
    """The core's handle on one worker process: its link, its connections, its capacity."""

    def __init__(self, pool: "IOWorkerPool", index: int):
        self.pool, self.index = pool, index
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.link: _Link | None = None
        self.conns: dict[int, VirtualTransport] = {}
        self.capacity = 0  # from the worker's HELLO (its RLIMIT_NOFILE minus a reserve)
        self.ready: asyncio.Future | None = None
        self.dead = False
        self.started_at = 0.0

    def spawn(self, loop) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout (engine/broker/..)
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "engine.broker.ioworker", "--link-fd", str(child.fileno()), "--index", str(self.index)],
                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, cwd=root)
        finally:
            child.close()
        self.pid = self.proc.pid
        self.started_at = time.monotonic()
        self.ready = loop.create_future()
        self.link = _Link(loop, parent, self._on_record, self._on_lost)

    @property
    def has_room(self) -> bool:
        return not self.dead and self.capacity > 0 and len(self.conns) < self.capacity

    def _on_record(self, kind: int, cid: int, payload: bytes) -> None:
        if kind == DATA:
            vt = self.conns.get(cid)
            if vt is not None:
                conn = vt.conn
                try:
                    conn.data_received(payload)
                except Exception:  # a bug in request handling must not take the whole worker's link down
                    log.exception("handling data from %s failed", conn.remote_addr)
                    conn.close("internal error while reading", abort=True)
        elif kind == LOST:
            vt = self.conns.pop(cid, None)
            if vt is not None:
                self._lose(vt, ConnectionError(payload.decode("utf-8", "replace")) if payload else None)
        elif kind in (WPAUSE, WRESUME, WBUF):
            vt = self.conns.get(cid)
            if vt is None:
                return
            vt.worker_buffered = _U64.unpack(payload)[0]
            conn = vt.conn
            if kind == WPAUSE:
                conn.pause_writing()
            elif kind == WRESUME:
                conn.resume_writing()
            bound = self.pool.server.config.max_write_buffer_bytes
            if not conn.closing and vt.get_write_buffer_size() > bound:
                conn.close(f"client does not read its responses ({vt.get_write_buffer_size()} bytes pending)",
                           abort=True)
        elif kind == HELLO:
            info = json.loads(payload)
            self.capacity = int(info["capacity"])
            if self.ready is not None and not self.ready.done():
                self.ready.set_result(info)
        else:
            log.error("I/O worker %d sent an unknown record kind %d", self.index, kind)

    def _aborted(self, vt: VirtualTransport) -> None:
        if self.conns.pop(vt.cid, None) is not None:  # the worker's LOST for it will find nothing
            self._lose(vt, None)

    def _lose(self, vt: VirtualTransport, exc) -> None:
        vt.lost = True
        vt._closing = True
        vt.unflushed = vt.worker_buffered = 0
        vt.conn.connection_lost(exc)

    def _on_lost(self, exc) -> None:
        """The link closed: the worker died (or is exiting at shutdown)."""
        self.dead = True
        pool = self.pool
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(RuntimeError(f"I/O worker {self.index} exited before it was ready"))
        conns, self.conns = self.conns, {}
        if not pool.stopping:
            log.error("I/O worker %d (pid %d) died (%s): %d connections lost, starting a replacement", self.index,
                      self.pid, exc or "link closed", len(conns))
        err = ConnectionError(f"I/O worker {self.index} died")
        for vt in conns.values():
            try:
                self._lose(vt, err)
            except Exception:
                log.exception("cleaning up %r failed", vt.conn)
        pool._worker_gone(self)

    def shutdown(self) -> None:
        if self.link is not None and not self.link.closed:
            self.link.record(SHUTDOWN, 0)

    def reap(self, timeout: float) -> None:
        """Wait for the process to exit (killed after ``timeout``)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class IOWorkerPool:
    """The core's accept path and worker processes for ``ioWorkers=N``."""

    #: seconds a worker has to start and say HELLO
    START_TIMEOUT = 30.0

    def __init__(self, server, n: int, core_connections: int = 0):
        #: the remoting server (engine.broker.server.RemotingServer); its ``new_connection(port_name)`` makes the protocol
        #: object of an accepted socket, so this module does not import engine.broker.server (which imports this one)
        self.server = server
        self.n = n
        #: connections the core serves in-process before handing off (``ioCoreConnections``)
        self.core_connections = core_connections
        self._core_accepting = 0  # accepted for the core, not yet made
        self.loop: asyncio.AbstractEventLoop | None = None
        self.workers: list[IOWorker] = []
        self.listeners: list[tuple[socket.socket, str]] = []
        self.stopping = False
        self.accept_errors = 0
        self.replacements = 0
        self._accept_paused_until = 0.0

    # ---- lifecycle ----
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.workers = [IOWorker(self, i) for i in range(self.n)]
        for w in self.workers:
            w.spawn(self.loop)
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready for w in self.workers)), self.START_TIMEOUT)
        except BaseException:
            await self.stop()
            raise
        log.info("%d I/O workers started (pids %s), %d connections each at most", self.n,
                 ", ".join(str(w.pid) for w in self.workers), min(w.capacity for w in self.workers))

    @property
    def capacity(self) -> int:
        """Connections the workers can hold together (a dead worker's share counts until it is replaced)."""
        return sum(w.capacity for w in self.workers)

    def listen(self, server_obj, port_name: str) -> None:
        """Accept on the sockets of an asyncio server created with start_serving=False (same binding and errors
        as in-process I/O); the server object keeps its own descriptor and is closed as before."""
        for ts in server_obj.sockets:
            sock = socket.socket(fileno=os.dup(ts.fileno()))
            sock.setblocking(False)
            sock.listen(4096)
            self.listeners.append((sock, port_name))
            self.loop.add_reader(sock.fileno(), self._accept, sock, port_name)

    def stop_accepting(self) -> None:
        for sock, _ in self.listeners:
            try:
                self.loop.remove_reader(sock.fileno())
            except (ValueError, OSError):
                pass
            sock.close()
        self.listeners.clear()

    async def stop(self, timeout: float = 5.0) -> None:
        """Close the links (workers close what is left and exit) and reap the processes."""
        self.stopping = True
        self.stop_accepting()
        for w in self.workers:
            w.shutdown()
        await asyncio.sleep(0)  # let the SHUTDOWN records go out
        loop = self.loop or asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.reap, timeout) for w in self.workers))
        for w in self.workers:
            if w.link is not None:
                w.link.close()

    # ---- accept path ----
    def _accept(self, lsock: socket.socket, port_name: str) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE/ENFILE/ENOBUFS: back off briefly instead of spinning on readiness
                self.accept_errors += 1
                if self.accept_errors == 1 or self.accept_errors % 1000 == 0:
                    log.warning("accept on the %s port failed: %s (%d times)", port_name, e, self.accept_errors)
                self.loop.remove_reader(lsock.fileno())
                self.loop.call_later(0.1, self._resume_accept, lsock, port_name)
                return
            try:
                self._hand_off(sock, peer, port_name)
            except OSError as e:
                log.warning("handing a connection from %s to an I/O worker failed: %s", peer, e)
                sock.close()

    def _resume_accept(self, lsock, port_name) -> None:
        if not self.stopping and any(s is lsock for s, _ in self.listeners):
            self.loop.add_reader(lsock.fileno(), self._accept, lsock, port_name)

    def _hand_off(self, sock: socket.socket, peer, port_name: str) -> None:
        server = self.server
        best = None
        if self.core_connections and self.core_count() < self.core_connections:
            pass  # the core serves it: in-process I/O costs about half the CPU of the relay
        else:
            for w in self.workers:
                if w.has_room and (best is None or len(w.conns) < len(best.conns)):
                    best = w
        if best is None:
            # the core's share, or every worker is full (or being replaced): serve it in-process; past the
            # connection limit the server answers it with the reason
            sock.setblocking(False)
            self._core_accepting += 1
            self.loop.create_task(self._serve_here(sock, port_name))
            return
        sockname = sock.getsockname()
        conn = server.new_connection(port_name)
        vt = VirtualTransport(best, conn, peer, sockname)
        best.conns[conn.id] = vt
        meta = f"{port_name}\n{peer[0]}\n{peer[1]}\n{sockname[0]}\n{sockname[1]}".encode()
        best.link.record_fd(NEW, conn.id, meta, sock.detach())
        conn.connection_made(vt)

    async def _serve_here(self, sock: socket.socket, port_name: str) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: self.server.new_connection(port_name), sock)
        except OSError:
            sock.close()
        finally:
            self._core_accepting -= 1

    def core_count(self) -> int:
        """Client connections served in-process by the core (being accepted included)."""
        return len(self.server.connections) - sum(len(w.conns) for w in self.workers) + self._core_accepting

    def _worker_gone(self, w: IOWorker) -> None:
        if self.stopping or self.loop is None or self.loop.is_closed():
            return
        # reap the dead process off the loop, then start its replacement in the same slot
        self.loop.run_in_executor(None, w.reap, 5.0)
        repl = IOWorker(self, w.index)
        try:
            repl.spawn(self.loop)
        except OSError as e:
            log.error("starting a replacement for I/O worker %d failed: %s", w.index, e)
            return
        self.replacements += 1
        self.workers[self.workers.index(w)] = repl

        def ready(fut):
            if fut.exception() is None:
                log.info("I/O worker %d replaced (pid %d)", repl.index, repl.pid)

        repl.ready.add_done_callback(ready)

    # ---- metrics ----
    def stats(self) -> list[dict]:
        return [{"worker": w.index, "pid": w.pid, "connections": len(w.conns), "capacity": w.capacity,
                 "alive": not w.dead} for w in self.workers]

    def render_metrics(self) -> str:
        p = "rocketmq_broker_io_worker_"
        lines = [f"# HELP {p}connections Client connections held by each I/O worker process.",
                 f"# TYPE {p}connections gauge"]
        lines += [f'{p}connections{{worker="{w.index}"}} {len(w.conns)}' for w in self.workers]
        lines += [f"# HELP {p}core_connections Client connections the core serves in-process (ioCoreConnections).",
                  f"# TYPE {p}core_connections gauge", f"{p}core_connections {self.core_count()}"]
        lines += [f"# HELP {p}capacity Connections an I/O worker may hold (its RLIMIT_NOFILE minus a reserve).",
                  f"# TYPE {p}capacity gauge"]
        lines += [f'{p}capacity{{worker="{w.index}"}} {w.capacity}' for w in self.workers]
        lines += [f"# HELP {p}replacements_total I/O workers started to replace one that died.",
                  f"# TYPE {p}replacements_total counter", f"{p}replacements_total {self.replacements}"]
        return "\n".join(lines) + "\n"


# =================================================================================================================
# Worker side


class _Relay(asyncio.Protocol):
    """One client socket in a worker: bytes in go to the core as DATA, WRITE records come back out."""

    __slots__ = ("w", "cid", "t", "pending", "close_req", "core_paused", "read_paused", "write_paused")

    def __init__(self, w: "Worker", cid: int):
        self.w, self.cid = w, cid
        self.t = None
        self.pending: list | None = None  # writes before the transport exists
        self.close_req: bool | None = None  # a CLOSE (abort flag) before the transport exists
        self.core_paused = False
        self.read_paused = False
        self.write_paused = False

    # ---- asyncio callbacks ----
    def connection_made(self, t) -> None:
        self.t = t
        if self.pending:
            for d in self.pending:
                t.write(d)
            self.pending = None
        self.sync_reading()
        if self.close_req is not None:
            t.abort() if self.close_req else t.close()

    def data_received(self, data: bytes) -> None:
        w = self.w
        w.link.record(DATA, self.cid, data)
        if not w.link_paused and len(w.link.wbuf) > LINK_HIGH:
            w.pause_all()

    def eof_received(self):
        return False  # the client half-closed: close, as the in-process server does

    def connection_lost(self, exc) -> None:
        w = self.w
        w.relays.pop(self.cid, None)
        if not w.link.closed:
            w.link.record(LOST, self.cid, b"" if exc is None else f"{type(exc).__name__}: {exc}"[:200].encode())

    def pause_writing(self) -> None:
        self.write_paused = True
        self.w.link.record(WPAUSE, self.cid, _U64.pack(self.t.get_write_buffer_size()))

    def resume_writing(self) -> None:
        self.write_paused = False
        self.w.link.record(WRESUME, self.cid, _U64.pack(self.t.get_write_buffer_size()))

    # ---- core's requests ----
    def write(self, data: bytes) -> None:
        t = self.t
        if t is None:
            if self.pending is None:
                self.pending = []
            self.pending.append(data)
            return
        t.write(data)
        if self.write_paused:
            self.w.report.add(self)

    def close(self, abort: bool) -> None:
        t = self.t
        if t is None:
            self.close_req = abort or bool(self.close_req)
        elif abort:
            t.abort()
        else:
            t.close()

    def sync_reading(self) -> None:
        t = self.t
        if t is None or t.is_closing():
            return
        want = self.core_paused or self.w.link_paused
        if want and not self.read_paused:
            self.read_paused = True
            t.pause_reading()
        elif not want and self.read_paused:
            self.read_paused = False
            t.resume_reading()


class Worker:
    """The worker process's event-loop side: one link to the core, one relay per client socket."""

    def __init__(self, loop, sock: socket.socket, index: int, capacity: int):
        self.loop, self.index, self.capacity = loop, index, capacity
        self.relays: dict[int, _Relay] = {}
        self.report: set[_Relay] = set()  # write-paused relays written to in this batch: report their buffers
        self.link_paused = False
        self.done = loop.create_future()
        self.link = _Link(loop, sock, self._on_record, self._on_link_lost, recv_fds=True, on_batch=self._on_batch,
                          on_drain=self._on_drain)
        self.link.record(HELLO, 0, json.dumps({"pid": os.getpid(), "capacity": capacity}).encode())

    def _on_record(self, kind: int, cid: int, payload: bytes) -> None:
        if kind == WRITE:
            r = self.relays.get(cid)
            if r is not None:
                r.write(payload)
        elif kind == NEW:
            self._new(cid, payload)
        elif kind == CLOSE:
            r = self.relays.get(cid)
            if r is not None:
                r.close(payload == b"\x01")
        elif kind in (PAUSE, RESUME):
            r = self.relays.get(cid)
            if r is not None:
                r.core_paused = kind == PAUSE
                r.sync_reading()
        elif kind == SHUTDOWN:
            self.shutdown(graceful=True)
        else:
            log.error("I/O worker %d: unknown record kind %d from the core", self.index, kind)

    def _new(self, cid: int, meta: bytes) -> None:
        if not self.link.fdq:
            log.error("I/O worker %d: connection %d arrived without its socket", self.index, cid)
            self.link.record(LOST, cid, b"socket lost in transit")
            return
        sock = socket.socket(fileno=self.link.fdq.popleft())
        r = _Relay(self, cid)
        self.relays[cid] = r
        self.loop.create_task(self._attach(r, sock))

    async def _attach(self, r: _Relay, sock: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: r, sock)
        except Exception as e:
            sock.close()
            if self.relays.pop(r.cid, None) is not None and not self.link.closed:
                self.link.record(LOST, r.cid, f"{type(e).__name__}: {e}"[:200].encode())

    def _on_batch(self) -> None:
        if self.report:
            for r in self.report:
                if r.t is not None and r.write_paused:
                    self.link.record(WBUF, r.cid, _U64.pack(r.t.get_write_buffer_size()))
            self.report.clear()

    def pause_all(self) -> None:
        self.link_paused = True
        for r in self.relays.values():
            r.sync_reading()

    def _on_drain(self) -> None:
        if self.link_paused:
            self.link_paused = False
            for r in self.relays.values():
                r.sync_reading()

    def _on_link_lost(self, exc) -> None:
        # the core is gone (or asked us to stop and closed the link): drop every client socket and exit
        self.shutdown(graceful=False)

    def shutdown(self, graceful: bool) -> None:
        for r in list(self.relays.values()):
            if r.t is not None:
                r.t.close() if graceful else r.t.abort()
        if not self.done.done():
            self.done.set_result(graceful)


def worker_capacity() -> int:
    """Connections this worker may hold: its RLIMIT_NOFILE soft limit minus WORKER_FD_RESERVE."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(1, soft - WORKER_FD_RESERVE)


def _set_nofile() -> None:
    """The soft limit: ENGINE_IOWORKER_NOFILE when set (tests lower it), else raised to the hard limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = os.environ.get("ENGINE_IOWORKER_NOFILE")
        target = min(int(want), hard) if want else hard
        if target != soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as e:
        log.warning("could not set RLIMIT_NOFILE: %s", e)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (ENGINE_NO_UVLOOP=1 turns it off), else asyncio's. The broker uses it
    too; it lives here because a worker must not import the broker's modules (it relays bytes only)."""
    if not os.environ.get("ENGINE_NO_UVLOOP"):
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.broker.ioworker", description="an I/O worker of the broker")
    p.add_argument("--link-fd", type=int, required=True, help="this worker's end of the core link (a socketpair)")
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s io-worker-{args.index} %(levelname)s %(message)s")
    # the worker lives exactly as long as its link: ^C or a TERM to the process group is the core's to handle
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _set_nofile()
    sock = socket.socket(fileno=args.link_fd)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        w = Worker(loop, sock, args.index, worker_capacity())
        graceful = loop.run_until_complete(w.done)
        if graceful:
            # let closing transports flush what the core wrote before the SHUTDOWN (bounded)
            deadline = time.monotonic() + 2.0
            while w.relays and time.monotonic() < deadline:
                loop.run_until_complete(asyncio.sleep(0.01))
        for r in list(w.relays.values()):
            if r.t is not None:
                r.t.abort()
        loop.run_until_complete(asyncio.sleep(0))
        w.link.close()
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
