# cython: boundscheck=False, wraparound=False
"""The connection core of the native gRPC transport, compiled: the twin ``engine.http2._core_py`` documents it and is
the reference (the same state, the same frames written, the same errors). What is compiled here is what every frame
passes through: the frame loop, the connection and stream windows both ways (flow control), the prepared path of a
unary call, and the accounting of request bytes; the state is C fields of the connection and of its calls. One
thing only the compiled core does: it reads a read's frames straight from its bytes and keeps a partial frame
itself (``_read``), where the twin takes the frame reader's list; the frames are the same, so are their effects."""
from engine._clock cimport monotonic as _monotonic
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize

from engine.http2 import _core_py as _py
from engine.http2 import _frames_py as _fp
from engine.http2._frames import frame, ping, settings, unary_answer, window_update
from engine.http2._frames import data_message as _data_message, parse_settings as _fp_parse_settings
from engine.http2.frames import apply_initial_window as _apply_initial_window
from engine.http2._frames_py import FrameError
from engine.http2._hpack_py import HpackError
from engine.http2._hpack cimport HpackDecoder

cdef long long STREAM_WINDOW = _py.STREAM_WINDOW
cdef long long CONNECTION_WINDOW = _py.CONNECTION_WINDOW
cdef double RESET_WINDOW_S = _py.RESET_WINDOW_S
cdef double CONTROL_WINDOW_S = _py.CONTROL_WINDOW_S
cdef long long MAX_WINDOW = _fp.MAX_WINDOW
cdef bytes RESPONSE_HEADERS = _py.RESPONSE_HEADERS
cdef bytes OK_TRAILERS = _py.OK_TRAILERS
cdef bytes PREFACE = _fp.PREFACE
cdef int UNARY_MAX_UPDATES = _py.UNARY_MAX_UPDATES

cdef enum:
    # frame types and flags (RFC 7540 §6)
    T_DATA = 0
    T_HEADERS = 1
    T_PRIORITY = 2
    T_RST_STREAM = 3
    T_SETTINGS = 4
    T_PUSH_PROMISE = 5
    T_PING = 6
    T_GOAWAY = 7
    T_WINDOW_UPDATE = 8
    T_CONTINUATION = 9
    F_END_STREAM = 0x1
    F_ACK = 0x1
    F_END_HEADERS = 0x4
    F_PADDED = 0x8
    F_PRIORITY = 0x20
    # error codes (§7)
    E_PROTOCOL = 0x1
    E_FLOW_CONTROL = 0x3
    E_STREAM_CLOSED = 0x5
    E_FRAME_SIZE = 0x6
    E_COMPRESSION = 0x9
    E_CALM = 0xB
    # grpc status codes
    S_INTERNAL = 13
    S_RESOURCE_EXHAUSTED = 8
    S_UNIMPLEMENTED = 12

assert (T_DATA, T_HEADERS, T_PRIORITY, T_RST_STREAM, T_SETTINGS, T_PUSH_PROMISE, T_PING, T_GOAWAY, T_WINDOW_UPDATE,
        T_CONTINUATION) == (_fp.DATA, _fp.HEADERS, _fp.PRIORITY, _fp.RST_STREAM, _fp.SETTINGS, _fp.PUSH_PROMISE,
                            _fp.PING, _fp.GOAWAY, _fp.WINDOW_UPDATE, _fp.CONTINUATION)
assert (F_END_STREAM, F_ACK, F_END_HEADERS, F_PADDED, F_PRIORITY) == (
    _fp.FLAG_END_STREAM, _fp.FLAG_ACK, _fp.FLAG_END_HEADERS, _fp.FLAG_PADDED, _fp.FLAG_PRIORITY)
assert (E_PROTOCOL, E_FLOW_CONTROL, E_STREAM_CLOSED, E_FRAME_SIZE, E_COMPRESSION, E_CALM) == (
    _fp.PROTOCOL_ERROR, _fp.FLOW_CONTROL_ERROR, _fp.STREAM_CLOSED, _fp.FRAME_SIZE_ERROR, _fp.COMPRESSION_ERROR,
    _fp.ENHANCE_YOUR_CALM)

cdef int UNARY_HEADERS_MASK = F_END_HEADERS | F_END_STREAM | F_PADDED | F_PRIORITY
cdef int UNARY_DATA_MASK = F_END_STREAM | F_PADDED


cdef inline Py_ssize_t _u24(const unsigned char* p) noexcept:
    """A frame header's length (24 bits, big-endian)."""
    return (<Py_ssize_t>p[0] << 16) | (<Py_ssize_t>p[1] << 8) | p[2]


cdef inline long long _u31(const unsigned char* p) noexcept:
    """A 31-bit big-endian field, the reserved bit cleared: a frame header's stream id, a WINDOW_UPDATE increment."""
    return (<long long>(p[0] & 0x7F) << 24) | (<long long>p[1] << 16) | (<long long>p[2] << 8) | p[3]


cdef class Call:
    """One HTTP/2 stream carrying one gRPC call (see the twin)."""

    cdef public long long sid
    cdef public object conn, method, headers, metadata, deadline, reader, inbox, messages, waiter, trailers, task
    cdef public object status, encoding, timer, coro
    cdef public list pending
    cdef public long long held, send_window, recv_window, pending_size
    cdef public bint headers_sent, remote_closed, closed, started

    def __init__(self, sid, conn, method, headers, send_window):
        self.sid = sid
        self.conn = conn
        self.method = method
        self.headers = headers
        self.metadata = None
        self.deadline = None
        self.reader = None
        self.inbox = None
        self.messages = []
        self.held = 0
        self.waiter = None
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW
        self.pending = []
        self.pending_size = 0
        self.trailers = None
        self.headers_sent = False
        self.remote_closed = False
        self.closed = False
        self.task = None
        self.coro = None
        self.status = None
        self.encoding = None
        self.timer = None
        self.started = False


cdef class H2Core:
    """An HTTP/2 connection's state and its frames in (see the twin)."""

    cdef public object server, loop, transport, peer, preface, header_block, ping_sent, keepalive
    cdef public HpackDecoder decoder
    cdef public dict streams, blocked
    cdef public list _out, _later
    cdef public long long last_sid, send_window, recv_window, peer_initial_window, peer_max_frame, buffered, pending
    cdef public long long resets, control
    cdef public bint got_settings, settings_acked, fed, going_away, closed
    cdef public double settings_sent_at, stall_since, resets_since, control_since, last_recv
    cdef public long long max_streams, max_message, max_metadata, hard_metadata, max_held, max_pending
    cdef public long long max_resets, max_control, max_continuations, max_write_buffer
    cdef long long max_frame  # ours: a longer frame is a FRAME_SIZE_ERROR
    cdef Py_ssize_t room  # what a read's answers may still add to the write buffer (maxWriteBufferBytes)
    cdef bytearray rest  # the start of a frame a read ended in (at most one frame's worth), or None

    def __init__(self, server):
        self.server = server
        self.loop = None
        self.transport = None
        self.peer = ""
        self.preface = b""
        self.max_frame = _fp.DEFAULT_MAX_FRAME_SIZE
        self.rest = None
        self.decoder = HpackDecoder(4096, server.hard_metadata)
        self.streams = {}
        self.last_sid = 0
        self.send_window = _fp.DEFAULT_WINDOW
        self.recv_window = CONNECTION_WINDOW
        self.peer_initial_window = _fp.DEFAULT_WINDOW
        self.peer_max_frame = _fp.DEFAULT_MAX_FRAME_SIZE
        self.got_settings = False
        self.settings_acked = False
        self.settings_sent_at = 0.0
        self.header_block = None
        self.buffered = 0
        self.pending = 0
        self.blocked = {}
        self.stall_since = 0.0
        self.resets = 0
        self.resets_since = float("-inf")
        self.control = 0
        self.control_since = float("-inf")
        self.last_recv = 0.0
        self.ping_sent = None
        self.fed = False
        self.keepalive = None
        self.going_away = False
        self.closed = False
        self._out = None
        self._later = None
        buffered, pending, resets, control, continuations = server.limits()
        self.max_streams = server.max_streams
        self.max_message = server.max_message
        self.max_metadata = server.max_metadata
        self.hard_metadata = server.hard_metadata
        self.max_write_buffer = server.max_write_buffer
        self.max_held = buffered * server.max_message + STREAM_WINDOW
        self.max_pending = pending * server.max_message + STREAM_WINDOW
        self.max_resets = resets
        self.max_control = control
        self.max_continuations = continuations

    def new_call(self, sid, headers):
        return Call(sid, self, None, headers, self.peer_initial_window)

    # ------------------------------------------------------------------------------------------------ reading
    def data_received(self, data):
        cdef list out, later
        cdef bytearray rest
        cdef Py_ssize_t length
        if self.closed:
            return
        self.last_recv = _monotonic()
        if self.preface is not None:
            buf = self.preface + data
            if len(buf) < 24:
                if not PREFACE.startswith(buf):
                    return self.goaway(E_PROTOCOL, b"bad connection preface")
                self.preface = buf
                return
            if buf[:24] != PREFACE:
                return self.goaway(E_PROTOCOL, b"bad connection preface")
            self.preface = None
            data = buf[24:]
        rest = self.rest
        if rest is not None:
            # the start of a frame is kept: it grows in place until the frame is whole (a frame sent a byte at a time
            # costs linear work), then the read is its bytes with what came after it
            rest += data
            data = None
            if len(rest) >= 9:
                length = _u24(<const unsigned char*>PyByteArray_AS_STRING(rest))
                if length > self.max_frame or len(rest) >= 9 + length:
                    self.rest = None
                    data = bytes(rest)
        elif type(data) is not bytes:
            data = bytes(data)
        later = self._later
        self._later = None  # written before this read: they go first
        out = later if later else []
        self._out = out
        # the write buffer's budget, counted as the read's answers are made (see _emit)
        self.room = self.max_write_buffer - self.transport.get_write_buffer_size()
        for chunk in out:
            self.room -= len(chunk)
        try:
            if data is not None:  # (None: no frame is whole yet)
                self._read(<bytes>data)
        except FrameError as e:
            self.goaway(e.code, str(e).encode()[:200])
        except HpackError as e:
            self.goaway(E_COMPRESSION, str(e).encode("ascii", "replace")[:200])
        finally:
            self._out = None
            if out and not self.closed:
                self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        if not self.closed and self.transport.get_write_buffer_size() > self.max_write_buffer:
            self.abort()  # a peer that does not read what it asks for (pings, settings answers)

    cdef _read(self, bytes data):
        """A read's frames straight from its bytes (which start at a frame), as the twin's frame reader gives them:
        a frame longer than ours is its error before any frame of the read is taken; a partial frame at the end is
        kept (``rest``) for the next read."""
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, end, length, j, dlen
        cdef int ftype, flags, k
        cdef long long sid
        cdef long long increments[4]
        while n - pos >= 9:
            length = _u24(p + pos)
            if length > self.max_frame:
                raise FrameError(E_FRAME_SIZE, f"frame of {length} bytes past SETTINGS_MAX_FRAME_SIZE {self.max_frame}")
            if pos + 9 + length > n:
                break
            pos += 9 + length
        end = pos
        if end < n:
            self.rest = PyByteArray_FromStringAndSize(<const char*>p + end, n - end)
        pos = 0
        while pos < end:
            length = _u24(p + pos)
            ftype = p[pos + 3]
            flags = p[pos + 4]
            sid = _u31(p + pos + 5)
            # a unary call whole in this read: HEADERS (END_HEADERS only), WINDOW_UPDATEs of its stream (grpc C-core
            # sends one), then its DATA (END_STREAM only)
            if (ftype == T_HEADERS and flags & UNARY_HEADERS_MASK == F_END_HEADERS and self.header_block is None
                    and self.got_settings):
                j = pos + 9 + length
                k = 0
                while (j < end and k < UNARY_MAX_UPDATES and p[j + 3] == T_WINDOW_UPDATE
                       and _u31(p + j + 5) == sid):
                    dlen = _u24(p + j)
                    increments[k] = _u31(p + j + 9) if dlen == 4 else -1
                    k += 1
                    j += 9 + dlen
                if (j < end and p[j + 3] == T_DATA and _u31(p + j + 5) == sid
                        and p[j + 4] & UNARY_DATA_MASK == F_END_STREAM):
                    dlen = _u24(p + j)
                    if self._unary(sid, data, p + pos + 9, length, p + j + 9, dlen, increments, k):
                        pos = j + 9 + dlen
                        if self.closed:
                            return
                        continue
            self._frame(ftype, flags, sid, PyBytes_FromStringAndSize(<const char*>p + pos + 9, length))
            if self.closed:
                return
            pos += 9 + length

    # ------------------------------------------------------------------------------------------------ writing
    cdef inline _emit(self, data):
        if self.closed:
            return
        if self._out is not None:
            self._out.append(data)
        elif self._later is not None:
            self._later.append(data)
        else:
            self._later = [data]
            self.room = self.max_write_buffer - self.transport.get_write_buffer_size()
            self.loop.call_soon(self._write_later)
        # the write buffer's budget, counted as answers are made (a read's, or a loop pass's of handlers): past it,
        # what is batched goes to the socket now, and what the socket does not take is checked against the budget
        # as after a read (one read of thousands of small calls with large answers never builds a write many times
        # the budget)
        self.room -= len(data)
        if self.room < 0:
            self._spill()

    def write(self, data):
        self._emit(data)

    cdef _spill(self):
        batch = self._out if self._out is not None else self._later
        self.transport.write(b"".join(batch))
        del batch[:]  # (the read's or the loop pass's write finds nothing left)
        self.room = self.max_write_buffer - self.transport.get_write_buffer_size()
        if self.room < 0:
            self.abort()  # answers the peer does not read, past maxWriteBufferBytes

    def _write_later(self):
        later = self._later
        self._later = None
        if later and not self.closed:
            self.transport.write(b"".join(later) if len(later) > 1 else later[0])

    # ------------------------------------------------------------------------------------------------ frames in
    cdef _frame(self, int ftype, int flags, long long sid, bytes payload):
        if self.header_block is not None and ftype != T_CONTINUATION:
            raise FrameError(E_PROTOCOL, "a header block interrupted")
        if not self.got_settings and ftype != T_SETTINGS:
            raise FrameError(E_PROTOCOL, "the first frame is not SETTINGS")
        if ftype == T_DATA:
            self._data(flags, sid, payload)
        elif ftype == T_HEADERS:
            self._headers(flags, sid, payload)
        elif ftype == T_CONTINUATION:
            self._continuation(flags, sid, payload)
        elif ftype == T_WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == T_RST_STREAM:
            self._rst_stream(sid, payload)
        elif ftype == T_SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == T_PING:
            if sid:
                raise FrameError(E_PROTOCOL, "PING on a stream")
            if PyBytes_GET_SIZE(payload) != 8:
                raise FrameError(E_FRAME_SIZE, "PING of a length other than 8")
            if flags & F_ACK:
                self.ping_sent = None
            else:
                # a ping after a request frame is a client's flow-control (BDP) probe, as grpc counts them
                if self.fed:
                    self.fed = False
                else:
                    self._count_control()
                self._emit(ping(payload, ack=True))
        elif ftype == T_GOAWAY:
            if sid:
                raise FrameError(E_PROTOCOL, "GOAWAY on a stream")
            self.going_away = True  # the client opens no more streams; its calls go on
        elif ftype == T_PRIORITY:
            if not sid:
                raise FrameError(E_PROTOCOL, "PRIORITY on stream 0")
            if PyBytes_GET_SIZE(payload) != 5:
                raise FrameError(E_FRAME_SIZE, "PRIORITY of a length other than 5")
            self._count_control()
        elif ftype == T_PUSH_PROMISE:
            raise FrameError(E_PROTOCOL, "PUSH_PROMISE from a client")
        # other types: ignored (RFC 7540 §4.1)

    cdef _count_control(self):
        cdef double now = self.last_recv
        if now - self.control_since > CONTROL_WINDOW_S:
            self.control_since = now
            self.control = 0
        self.control += 1
        if self.control > self.max_control:
            raise FrameError(E_CALM, "too many control frames")

    cdef _settings(self, int flags, long long sid, bytes payload):
        if sid:
            raise FrameError(E_PROTOCOL, "SETTINGS on a stream")
        if flags & F_ACK:
            if PyBytes_GET_SIZE(payload):
                raise FrameError(E_FRAME_SIZE, "SETTINGS ACK with a payload")
            self.settings_acked = True
            return
        if self.got_settings:
            self._count_control()
        self.got_settings = True
        for key, value in _fp_parse_settings(payload):
            if key == _fp.SETTINGS_INITIAL_WINDOW_SIZE:
                self.peer_initial_window = _apply_initial_window(self.streams.values(), self.peer_initial_window,
                                                                 value)
            elif key == _fp.SETTINGS_MAX_FRAME_SIZE:
                if not _fp.DEFAULT_MAX_FRAME_SIZE <= value <= _fp.MAX_MAX_FRAME_SIZE:
                    raise FrameError(E_PROTOCOL, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == _fp.SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise FrameError(E_PROTOCOL, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # SETTINGS_HEADER_TABLE_SIZE: our answers use no dynamic table; the others do not bind a server
        self._emit(settings(ack=True))
        if self.blocked:
            self._flush()

    cdef _window_update(self, long long sid, bytes payload):
        if PyBytes_GET_SIZE(payload) != 4:
            raise FrameError(E_FRAME_SIZE, "WINDOW_UPDATE of a length other than 4")
        self._window_increment(sid, _u31(<const unsigned char*>PyBytes_AS_STRING(payload)))

    cdef _window_increment(self, long long sid, long long increment):
        cdef Call call
        if sid == 0:
            if not increment:
                raise FrameError(E_PROTOCOL, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise FrameError(E_FLOW_CONTROL, "connection window past 2^31-1")
        else:
            call = self.streams.get(sid)
            if call is None:
                if sid > self.last_sid:
                    raise FrameError(E_PROTOCOL, "WINDOW_UPDATE on an idle stream")
                return  # a closed stream's: ignored
            if not increment:
                return self._reset(call, E_PROTOCOL)
            call.send_window += increment
            if call.send_window > MAX_WINDOW:
                return self._reset(call, E_FLOW_CONTROL)
        if self.blocked:
            self._flush()

    cdef _rst_stream(self, long long sid, bytes payload):
        cdef double now
        cdef Call call
        if not sid:
            raise FrameError(E_PROTOCOL, "RST_STREAM on stream 0")
        if PyBytes_GET_SIZE(payload) != 4:
            raise FrameError(E_FRAME_SIZE, "RST_STREAM of a length other than 4")
        if sid > self.last_sid:
            raise FrameError(E_PROTOCOL, "RST_STREAM on an idle stream")
        now = self.last_recv
        if now - self.resets_since > RESET_WINDOW_S:
            self.resets_since = now
            self.resets = 0
        self.resets += 1
        if self.resets > self.max_resets:
            raise FrameError(E_CALM, "too many stream resets")
        call = self.streams.get(sid)
        if call is not None:
            call.closed = True
            self._drop(call)

    cdef _headers(self, int flags, long long sid, bytes payload):
        cdef Py_ssize_t pos = 0, end = PyBytes_GET_SIZE(payload)
        self.fed = True
        if not sid or not sid & 1:
            raise FrameError(E_PROTOCOL, "HEADERS on stream 0 or an even stream")
        if flags & F_PADDED:
            if not end:
                raise FrameError(E_PROTOCOL, "padded HEADERS without a pad length")
            pos = 1
            end -= (<const unsigned char*>PyBytes_AS_STRING(payload))[0]
        if flags & F_PRIORITY:
            pos += 5
        if end < pos:
            raise FrameError(E_PROTOCOL, "HEADERS padding past its payload")
        block = payload[pos:end] if pos or end != PyBytes_GET_SIZE(payload) else payload
        if flags & F_END_HEADERS:
            self._open(sid, flags, self.decoder.decode(block))  # always decoded: the HPACK table stays in sync
        else:
            if len(block) > self.hard_metadata:
                raise FrameError(E_CALM, "header block too large")
            self.header_block = [sid, flags, [block], len(block), 0]

    cdef _continuation(self, int flags, long long sid, bytes payload):
        hb = self.header_block
        if hb is None or hb[0] != sid:
            raise FrameError(E_PROTOCOL, "CONTINUATION without its HEADERS")
        hb[2].append(payload)
        hb[3] += PyBytes_GET_SIZE(payload)
        hb[4] += 1
        if hb[3] > self.hard_metadata or hb[4] > self.max_continuations:
            raise FrameError(E_CALM, "CONTINUATION flood")
        if flags & F_END_HEADERS:
            self.header_block = None
            self._open(sid, hb[1], self.decoder.decode(b"".join(hb[2])))

    cdef bint _unary(self, long long sid, object owner, const unsigned char* block, Py_ssize_t block_n,
                     const unsigned char* body, Py_ssize_t n, long long* increments, int updates) except -1:
        """The prepared path (see the twin's _unary): the header block and the body are read where they lie in the
        read (``owner``); ``increments``: those of the ``updates`` WINDOW_UPDATEs of the stream between its HEADERS
        and DATA (-1: one of a length other than 4). The header block is scanned, not made a list, unless the call
        takes the general path after all."""
        cdef long long stream_window, size
        cdef int k
        cdef object server = self.server
        cdef HpackDecoder decoder = self.decoder
        cdef Call call
        cdef bint fits
        if (not sid & 1 or sid <= self.last_sid or self.going_away or len(self.streams) >= self.max_streams
                or server.calls >= server.max_calls or n > self.recv_window or n > STREAM_WINDOW
                or self.buffered + n > self.max_held):
            return False  # (the last: the general path's answer to request bytes held past the budget)
        stream_window = self.peer_initial_window
        for k in range(updates):  # what _window_update would do on the open stream; its errors: the general path
            stream_window += increments[k]
            if increments[k] <= 0 or stream_window > MAX_WINDOW:
                return False
        self.fed = True
        # from here the frames are taken: the HPACK table has moved on
        decoder.scan_unary(owner, block, block_n, self.max_metadata)
        path = decoder.path
        # the path of a well-formed unary request whose body is one uncompressed message within the budgets
        if (n < 5 or body[0] or ((<long long>body[1] << 24) | (body[2] << 16) | (body[3] << 8) | body[4]) != n - 5
                or n - 5 > self.max_message):
            path = None
        method = None if path is None else server.methods.get(path)
        answer = None
        if method is not None:
            prepared = method.prepared
            if prepared is not None:
                try:
                    answer = prepared(PyBytes_FromStringAndSize(<const char*>body + 5, n - 5), decoder.client_id,
                                      self.peer)
                except Exception:  # a bug: the handler answers instead, as the general path would run it
                    server.ep.internal_error("native gRPC prepared answer")
        if answer is None:
            headers = decoder.fields()
            decoder.release()
            self._open(sid, F_END_HEADERS, headers)
            for k in range(updates):
                if not self.closed:
                    self._window_increment(sid, increments[k])
            if not self.closed:
                self._data(F_END_STREAM, sid, PyBytes_FromStringAndSize(<const char*>body, n))
            return True
        size = len(answer) + 5
        fits = (size <= self.send_window and size <= stream_window and size <= self.peer_max_frame
                and size - 5 <= self.max_message)
        headers = None if fits else decoder.fields()
        decoder.release()
        self.last_sid = sid
        self.recv_window -= n
        if self.recv_window < CONNECTION_WINDOW // 2:
            self._emit(window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        if fits:
            self.send_window -= size
            self._emit(unary_answer(sid, RESPONSE_HEADERS, answer, OK_TRAILERS, False))
        else:  # no window for it now: a call waiting for one, as _finish queues it
            call = Call(sid, self, method, headers, stream_window)
            call.remote_closed = call.started = True
            self.streams[sid] = call
            server.calls += 1
            self._finish(call, None, answer)
        return True

    cdef _data(self, int flags, long long sid, bytes payload):
        cdef Py_ssize_t n = PyBytes_GET_SIZE(payload), pad = 0
        cdef Call call
        if not sid:
            raise FrameError(E_PROTOCOL, "DATA on stream 0")
        self.recv_window -= n
        if self.recv_window < 0:
            raise FrameError(E_FLOW_CONTROL, "DATA past the connection window")
        if self.recv_window < CONNECTION_WINDOW // 2:
            self._emit(window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        if not n and not flags & F_END_STREAM:
            self._count_control()
        else:
            self.fed = True
        call = self.streams.get(sid)
        if call is None:
            if sid > self.last_sid:
                raise FrameError(E_PROTOCOL, "DATA on an idle stream")
            return  # a stream closed (reset or answered) while the client was sending: ignored
        if call.remote_closed:
            return self._reset(call, E_STREAM_CLOSED)
        call.recv_window -= n
        if call.recv_window < 0:
            return self._reset(call, E_FLOW_CONTROL)
        if flags & F_PADDED:
            if n:
                pad = (<const unsigned char*>PyBytes_AS_STRING(payload))[0]
            if not n or pad >= n:
                raise FrameError(E_PROTOCOL, "DATA padding past its payload")
            payload = payload[1:n - pad]
        if PyBytes_GET_SIZE(payload) and not self._receive(call, payload):
            return
        if call.recv_window < STREAM_WINDOW // 2 and (call.inbox is None or call.held < STREAM_WINDOW):
            self._emit(window_update(sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW
        if flags & F_END_STREAM:
            self._remote_end(call)

    cdef bint _receive(self, Call call, bytes payload) except -1:
        """gRPC messages out of a stream's DATA (see the twin's _receive)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
        call.held += n
        self.buffered += n
        if self.buffered > self.max_held:
            self._finish(call, (S_RESOURCE_EXHAUSTED, "too many request bytes held on this connection"))
            return False
        reader = call.reader
        for message in reader.feed(payload):
            if call.inbox is not None:
                call.inbox.append(message)
                waiter = call.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            else:
                call.messages.append(message)
                if len(call.messages) > 1:
                    self._finish(call, (S_UNIMPLEMENTED, "more than one request message for a unary call"))
                    return False
        if reader.error == _fp.MESSAGE_COMPRESSED:
            if call.encoding in (None, b"identity"):
                status = (S_INTERNAL, "Compressed message but no grpc-encoding (compressed flag set)")
            else:
                status = (S_UNIMPLEMENTED, "Compression is not supported by this server (grpc-encoding "
                          f"{call.encoding[:40].decode('ascii', 'replace')})")
            self._finish(call, status)
            return False
        if reader.error:
            self._finish(call, (S_RESOURCE_EXHAUSTED, f"Received message larger than max ({reader.error_length} vs. "
                                f"{self.max_message})"))
            return False
        return True

    def consumed(self, Call call, long long n):
        """A streaming call's message was read: its bytes are released, the stream's window reopens."""
        n += 5
        call.held -= n
        self.buffered -= n
        if (not call.remote_closed and not call.closed and call.recv_window < STREAM_WINDOW // 2
                and call.held < STREAM_WINDOW):
            self._emit(window_update(call.sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW

    # ------------------------------------------------------------------------------------------------ answers out
    def send_message(self, Call call, data):
        cdef Py_ssize_t n = len(data)  # bytes, or a subclass (a handler's answer)
        cdef long long size = n + 5
        if n > self.max_message:
            call.status = (S_RESOURCE_EXHAUSTED, f"Sent message larger than max ({n} vs. {self.max_message})")
            return
        out = [] if call.headers_sent else [frame(T_HEADERS, F_END_HEADERS, call.sid, RESPONSE_HEADERS)]
        call.headers_sent = True
        if (not call.pending and size <= self.send_window and size <= call.send_window
                and size <= self.peer_max_frame):
            self.send_window -= size
            call.send_window -= size
            out.append(_data_message(call.sid, data))
            self._emit(b"".join(out) if len(out) > 1 else out[0])
            return
        if out:
            self._emit(out[0])
        payload = b"\x00" + n.to_bytes(4, "big") + data
        call.pending.append(payload)
        call.pending_size += size
        self.pending += size
        if self.pending > self.max_pending:
            return self.goaway(E_FLOW_CONTROL, b"answers waiting for a window past the budget")
        if not self.blocked:
            self.stall_since = _monotonic()
            self._stalled()  # the stall is looked at within FLOW_STALL_MS
        self.blocked[call.sid] = call
        self._flush()

    def _flush_blocked(self):
        self._flush()

    cdef _flush(self):
        cdef bint progressed = False
        cdef Call call
        cdef long long n
        for sid, call in list(self.blocked.items()):
            while call.pending and self.send_window > 0 and call.send_window > 0:
                chunk = call.pending[0]
                n = min(len(chunk), self.send_window, call.send_window, self.peer_max_frame)
                if n < len(chunk):
                    call.pending[0] = chunk[n:]
                    chunk = chunk[:n]
                else:
                    call.pending.pop(0)
                self.send_window -= n
                call.send_window -= n
                call.pending_size -= n
                self.pending -= n
                self._emit(frame(T_DATA, 0, sid, chunk))
                progressed = True
            if not call.pending:
                del self.blocked[sid]
                if call.trailers is not None:
                    self._emit(call.trailers)
                    call.trailers = None
                    self._drop(call)
        if progressed:
            self.stall_since = _monotonic()

