"""The connection core of the native gRPC transport (engine.http2.server): an HTTP/2 connection's frames in, its
stream and connection windows both ways (flow control), the prepared path of unary calls, and gRPC's message framing
of request DATA. Pure-Python twin and reference of the compiled ``engine.http2._core`` (pyx/http2/_core.pyx): the same
state, the same frames written, the same errors. ``engine.http2.server.H2Connection`` is this core plus what waits
on the loop (the calls' handlers, deadlines, keepalive, GOAWAY and closing); the core calls those as methods of
``self`` (``_open``, ``_remote_end``, ``_finish``, ``_reset``, ``_drop``, ``goaway``, ``abort``, ``_stalled``).

The budgets a connection enforces here are read when it is made (the server's ``limits()``: engine.http2.server's
constants; the endpoint's grpcMax* properties).
"""
from __future__ import annotations

import time

from engine.http2 import frames as F
from engine.http2.frames import FrameError
from engine.http2 import HpackDecoder, HpackError

#: our receive window of one stream, bytes (SETTINGS_INITIAL_WINDOW_SIZE): what a client may send on a stream
#: before the server has read it (a Telemetry stream's unread commands are at most this)
STREAM_WINDOW = 1 << 20
#: our receive window of a connection, bytes (refilled as frames arrive: the streams' windows and
#: MAX_BUFFERED_MESSAGES bound what is held)
CONNECTION_WINDOW = 8 << 20
#: the windows of the rate budgets (engine.http2.server's MAX_RESETS_PER_WINDOW, MAX_CONTROL_FRAMES_PER_WINDOW)
RESET_WINDOW_S = 1.0
CONTROL_WINDOW_S = 1.0
#: the WINDOW_UPDATEs of a unary call's stream between its HEADERS and DATA that the prepared path takes (grpc C-core
#: sends one); a call with more takes the general path
UNARY_MAX_UPDATES = 4

_INTERNAL, _RESOURCE_EXHAUSTED, _UNIMPLEMENTED = 13, 8, 12  # grpc status codes

# response header blocks without the dynamic table (literals without indexing): the same bytes on every
# connection, no HPACK encoder state to keep
RESPONSE_HEADERS = (b"\x88"  # :status 200 (static index 8)
                    b"\x0f\x10\x10application/grpc")  # content-type (static name 31), not indexed
OK_TRAILERS = b"\x00\x0bgrpc-status\x010"  # grpc-status: 0, a literal without indexing, new name

#: HEADERS flags that keep a call off H2Core._unary's path (END_STREAM: no DATA follows; PADDED, PRIORITY:
#: a payload to cut) beside END_HEADERS, which it needs
_UNARY_HEADERS_MASK = F.FLAG_END_HEADERS | F.FLAG_END_STREAM | F.FLAG_PADDED | F.FLAG_PRIORITY
_UNARY_DATA_MASK = F.FLAG_END_STREAM | F.FLAG_PADDED  # its DATA: END_STREAM, unpadded
_DATA, _HEADERS, _WINDOW_UPDATE = F.DATA, F.HEADERS, F.WINDOW_UPDATE
_END_HEADERS, _END_STREAM = F.FLAG_END_HEADERS, F.FLAG_END_STREAM


class Call:
    """One HTTP/2 stream carrying one gRPC call."""

    __slots__ = ("sid", "conn", "method", "headers", "metadata", "deadline", "reader", "inbox",
                 "held", "waiter", "send_window", "recv_window", "pending", "pending_size", "trailers",
                 "headers_sent", "remote_closed", "closed", "task", "status", "encoding", "timer", "started",
                 "messages", "coro")

    def __init__(self, sid, conn, method, headers, send_window):
        self.sid = sid
        self.conn = conn
        self.method = method
        self.headers = headers
        self.metadata = None
        self.deadline = None
        self.reader = None  # its messages out of its DATA (F.MessageReader), once the call is taken
        self.inbox = None  # whole messages not yet read (a streaming call's)
        self.messages = []  # a unary call's messages
        self.held = 0  # bytes of partial and unread messages (the connection's buffered count)
        self.waiter = None
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW
        self.pending = []  # DATA payload waiting for a window
        self.pending_size = 0
        self.trailers = None  # trailers waiting behind pending
        self.headers_sent = False
        self.remote_closed = False
        self.closed = False
        self.task = None
        self.coro = None  # the handler while its task has not started
        self.status = None  # (code, message) set by abort
        self.encoding = None
        self.timer = None
        self.started = False


class H2Core:
    """An HTTP/2 connection's state and its frames in (see the module's docstring)."""

    # slots: a call touches a dozen of these; with thousands of connections each read finds its connection's state
    # cold, and a slotted object holds it in a few cache lines instead of a dict's table and entries
    __slots__ = ("server", "loop", "transport", "peer", "preface", "reader", "decoder", "streams", "last_sid",
                 "send_window", "recv_window", "peer_initial_window", "peer_max_frame", "got_settings",
                 "settings_acked", "settings_sent_at", "header_block", "buffered", "pending", "blocked", "stall_since",
                 "resets", "resets_since", "control", "control_since", "last_recv", "ping_sent", "fed", "keepalive",
                 "going_away", "closed", "_out", "_later", "max_streams", "max_message", "max_metadata",
                 "hard_metadata", "max_held", "max_pending", "max_resets", "max_control", "max_continuations",
                 "max_write_buffer", "room")

    def __init__(self, server):
        """``server``: the H2Server; its ``limits()`` are the budgets as they are when the connection is made."""
        self.server = server
        self.loop = None
        self.transport = None
        self.peer = ""
        self.preface = b""  # bytes of the preface received so far (until it is whole)
        self.reader = F.FrameReader(F.DEFAULT_MAX_FRAME_SIZE)
        self.decoder = HpackDecoder(4096, server.hard_metadata)
        self.streams = {}  # sid -> Call
        self.last_sid = 0
        self.send_window = F.DEFAULT_WINDOW
        self.recv_window = CONNECTION_WINDOW
        self.peer_initial_window = F.DEFAULT_WINDOW
        self.peer_max_frame = F.DEFAULT_MAX_FRAME_SIZE
        self.got_settings = False
        self.settings_acked = False
        self.settings_sent_at = 0.0
        self.header_block = None  # [sid, flags, [payloads], size, continuations] while CONTINUATION is expected
        self.buffered = 0  # bytes of partial and unread messages of all streams
        self.pending = 0  # bytes of answers waiting for a window
        self.blocked = {}  # sid -> Call with answers waiting for a window
        self.stall_since = 0.0
        # Rate windows start at their first event, not at connect: a burst that began late in a window opened at
        # connect would be split over two windows and pass under either budget.
        self.resets = 0
        self.resets_since = float("-inf")
        self.control = 0
        self.control_since = float("-inf")
        self.last_recv = 0.0
        self.ping_sent = None  # time.monotonic() of our keepalive ping waiting for its ACK
        self.fed = False  # a HEADERS or non-empty DATA frame came since the last PING
        self.keepalive = None
        self.going_away = False
        self.closed = False
        self._out = None  # frames written while a read is handled: one write at its end
        # frames written outside a read (by handlers in tasks: Telemetry's answers, unary calls that waited, the
        # keepalive): one write when the loop gets to it, however many streams wrote in between
        self._later = None
        buffered, pending, resets, control, continuations = server.limits()
        self.max_streams = server.max_streams
        self.max_message = server.max_message
        self.max_metadata = server.max_metadata
        self.hard_metadata = server.hard_metadata
        self.max_write_buffer = server.max_write_buffer
        # request bytes held (partial and unread messages) / answers waiting for a window, bytes
        self.max_held = buffered * server.max_message + STREAM_WINDOW
        self.max_pending = pending * server.max_message + STREAM_WINDOW
        self.max_resets = resets
        self.max_control = control
        self.max_continuations = continuations

    def new_call(self, sid, headers):
        """A call on stream ``sid`` (its method set once it is known), with the peer's initial window."""
        return Call(sid, self, None, headers, self.peer_initial_window)

    def data_received(self, data):
        if self.closed:
            return
        self.last_recv = time.monotonic()
        if self.preface is not None:
            buf = self.preface + data
            if len(buf) < 24:
                if not F.PREFACE.startswith(buf):
                    return self.goaway(F.PROTOCOL_ERROR, b"bad connection preface")
                self.preface = buf
                return
            if buf[:24] != F.PREFACE:
                return self.goaway(F.PROTOCOL_ERROR, b"bad connection preface")
            self.preface = None
            data = buf[24:]
        later, self._later = self._later, None  # written before this read: they go first
        self._out = out = later or []
        # the write buffer's budget, counted as the read's answers are made (see write)
        self.room = self.max_write_buffer - self.transport.get_write_buffer_size() - sum(map(len, out))
        try:
            frames = self.reader.feed(data)
            i, n = 0, len(frames)
            while i < n:
                ftype, flags, sid, payload = frames[i]
                i += 1
                # a unary call whole in this read: HEADERS (END_HEADERS only), WINDOW_UPDATEs of its stream (grpc
                # C-core sends one), then its DATA (END_STREAM only)
                if (ftype == _HEADERS and i < n and flags & _UNARY_HEADERS_MASK == _END_HEADERS
                        and self.header_block is None and self.got_settings):
                    j = i
                    while (j < n and j - i < UNARY_MAX_UPDATES and frames[j][0] == _WINDOW_UPDATE
                           and frames[j][2] == sid):
                        j += 1
                    nxt = frames[j] if j < n else None
                    if (nxt is not None and nxt[0] == _DATA and nxt[2] == sid
                            and nxt[1] & _UNARY_DATA_MASK == _END_STREAM
                            and self._unary(sid, payload, nxt[3], frames[i:j] if j > i else ())):
                        i = j + 1
                        if self.closed:
                            return
                        continue
                self._frame(ftype, flags, sid, payload)
                if self.closed:
                    return
        except FrameError as e:
            self.goaway(e.code, str(e).encode()[:200])
        except HpackError as e:
            self.goaway(F.COMPRESSION_ERROR, str(e).encode("ascii", "replace")[:200])
        finally:
            self._out = None
            if out and not self.closed:
                self.transport.write(b"".join(out))
        if not self.closed and self.transport.get_write_buffer_size() > self.max_write_buffer:
            self.abort()  # a peer that does not read what it asks for (pings, settings answers)

    def write(self, data: bytes) -> None:
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

    def _spill(self) -> None:
        batch = self._out if self._out is not None else self._later
        self.transport.write(b"".join(batch))
        del batch[:]  # (the read's or the loop pass's write finds nothing left)
        self.room = self.max_write_buffer - self.transport.get_write_buffer_size()
        if self.room < 0:
            self.abort()  # answers the peer does not read, past maxWriteBufferBytes

    def _write_later(self) -> None:
        later, self._later = self._later, None
        if later and not self.closed:
            self.transport.write(b"".join(later) if len(later) > 1 else later[0])

    def _frame(self, ftype, flags, sid, payload):
        if self.header_block is not None and ftype != F.CONTINUATION:
            raise FrameError(F.PROTOCOL_ERROR, "a header block interrupted")
        if not self.got_settings and ftype != F.SETTINGS:
            raise FrameError(F.PROTOCOL_ERROR, "the first frame is not SETTINGS")
        if ftype == F.DATA:
            self._data(flags, sid, payload)
        elif ftype == F.HEADERS:
            self._headers(flags, sid, payload)
        elif ftype == F.CONTINUATION:
            self._continuation(flags, sid, payload)
        elif ftype == F.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == F.RST_STREAM:
            self._rst_stream(sid, payload)
        elif ftype == F.SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == F.PING:
            if sid:
                raise FrameError(F.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise FrameError(F.FRAME_SIZE_ERROR, "PING of a length other than 8")
            if flags & F.FLAG_ACK:
                self.ping_sent = None
            else:
                # a ping after a request frame is a client's flow-control (BDP) probe, as grpc counts them: only
                # pings without a request frame between them count against the budget
                if self.fed:
                    self.fed = False
                else:
                    self._count_control()
                self.write(F.ping(payload, ack=True))
        elif ftype == F.GOAWAY:
            if sid:
                raise FrameError(F.PROTOCOL_ERROR, "GOAWAY on a stream")
            self.going_away = True  # the client opens no more streams; its calls go on
        elif ftype == F.PRIORITY:
            if not sid:
                raise FrameError(F.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise FrameError(F.FRAME_SIZE_ERROR, "PRIORITY of a length other than 5")
            self._count_control()
        elif ftype == F.PUSH_PROMISE:
            raise FrameError(F.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other types: ignored (RFC 7540 §4.1)

    def _count_control(self):
        now = self.last_recv
        if now - self.control_since > CONTROL_WINDOW_S:
            self.control_since = now
            self.control = 0
        self.control += 1
        if self.control > self.max_control:
            raise FrameError(F.ENHANCE_YOUR_CALM, "too many control frames")

    def _settings(self, flags, sid, payload):
        if sid:
            raise FrameError(F.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & F.FLAG_ACK:
            if payload:
                raise FrameError(F.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self.settings_acked = True
            return
        if self.got_settings:
            self._count_control()
        self.got_settings = True
        for key, value in F.parse_settings(payload):
            if key == F.SETTINGS_INITIAL_WINDOW_SIZE:
                self.peer_initial_window = F.apply_initial_window(self.streams.values(), self.peer_initial_window,
                                                                  value)
            elif key == F.SETTINGS_MAX_FRAME_SIZE:
                if not F.DEFAULT_MAX_FRAME_SIZE <= value <= F.MAX_MAX_FRAME_SIZE:
                    raise FrameError(F.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == F.SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise FrameError(F.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # SETTINGS_HEADER_TABLE_SIZE: our answers use no dynamic table; the others do not bind a server
        self.write(F.settings(ack=True))
        if self.blocked:
            self._flush_blocked()

    def _window_update(self, sid, payload):
        if len(payload) != 4:
            raise FrameError(F.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = F.u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if not increment:
                raise FrameError(F.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > F.MAX_WINDOW:
                raise FrameError(F.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
        else:
            call = self.streams.get(sid)
            if call is None:
                if sid > self.last_sid:
                    raise FrameError(F.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return  # a closed stream's: ignored
            if not increment:
                return self._reset(call, F.PROTOCOL_ERROR)
            call.send_window += increment
            if call.send_window > F.MAX_WINDOW:
                return self._reset(call, F.FLOW_CONTROL_ERROR)
        if self.blocked:
            self._flush_blocked()

    def _rst_stream(self, sid, payload):
        if not sid:
            raise FrameError(F.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise FrameError(F.FRAME_SIZE_ERROR, "RST_STREAM of a length other than 4")
        if sid > self.last_sid:
            raise FrameError(F.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        now = self.last_recv
        if now - self.resets_since > RESET_WINDOW_S:
            self.resets_since = now
            self.resets = 0
        self.resets += 1
        if self.resets > self.max_resets:
            raise FrameError(F.ENHANCE_YOUR_CALM, "too many stream resets")
        call = self.streams.get(sid)
        if call is not None:
            call.closed = True
            self._drop(call)

    def _headers(self, flags, sid, payload):
        self.fed = True
        if not sid or not sid & 1:
            raise FrameError(F.PROTOCOL_ERROR, "HEADERS on stream 0 or an even stream")
        pos, end = 0, len(payload)
        if flags & F.FLAG_PADDED:
            if not payload:
                raise FrameError(F.PROTOCOL_ERROR, "padded HEADERS without a pad length")
            pos = 1
            end -= payload[0]
        if flags & F.FLAG_PRIORITY:
            pos += 5
        if end < pos:
            raise FrameError(F.PROTOCOL_ERROR, "HEADERS padding past its payload")
        block = payload[pos:end] if pos or end != len(payload) else payload
        if flags & F.FLAG_END_HEADERS:
            self._header_block(sid, flags, block)
        else:
            if len(block) > self.hard_metadata:
                raise FrameError(F.ENHANCE_YOUR_CALM, "header block too large")
            self.header_block = [sid, flags, [block], len(block), 0]

    def _continuation(self, flags, sid, payload):
        hb = self.header_block
        if hb is None or hb[0] != sid:
            raise FrameError(F.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        hb[2].append(payload)
        hb[3] += len(payload)
        hb[4] += 1
        if hb[3] > self.hard_metadata or hb[4] > self.max_continuations:
            raise FrameError(F.ENHANCE_YOUR_CALM, "CONTINUATION flood")
        if flags & F.FLAG_END_HEADERS:
            self.header_block = None
            self._header_block(sid, hb[1], b"".join(hb[2]))

    def _unary(self, sid, block, body, updates=()) -> bool:
        """A unary call whose HEADERS and DATA (END_STREAM) came in one read, for a method with a prepared answer
        (Heartbeat's repeat): answered here, without a Call, a context or the handler's coroutine; the frames and
        windows counted as _headers, _window_update (``updates``: WINDOW_UPDATE frames of the stream between its
        HEADERS and DATA) and _data count them. False (nothing done): the frames take the general path, as do, once
        the header block is decoded, a request the checks below do not pass or one ``prepared`` declines (its
        handler then runs)."""
        server = self.server
        n = len(body)
        if (not sid & 1 or sid <= self.last_sid or self.going_away or len(self.streams) >= self.max_streams
                or server.calls >= server.max_calls or n > self.recv_window or n > STREAM_WINDOW
                or self.buffered + n > self.max_held):
            return False  # (the last: the general path's answer to request bytes held past the budget)
        stream_window = self.peer_initial_window
        for update in updates:  # what _window_update would do on the open stream; its errors: the general path
            increment = F.u32(update[3]) & 0x7FFFFFFF if len(update[3]) == 4 else 0
            stream_window += increment
            if not increment or stream_window > F.MAX_WINDOW:
                return False
        self.fed = True
        # from here the frames are taken: the HPACK table has moved on
        headers, path, client_id = self.decoder.decode_unary(block, self.max_metadata)
        # the path of a well-formed unary request whose body is one uncompressed message within the budgets
        if n < 5 or body[0] or int.from_bytes(body[1:5], "big") != n - 5 or n - 5 > self.max_message:
            path = None
        method = None if path is None else server.methods.get(path)
        answer = None
        if method is not None and method.prepared is not None:
            try:
                answer = method.prepared(body[5:], client_id, self.peer)
            except Exception:  # a bug: the handler answers instead, as the general path would run it
                server.ep.internal_error("native gRPC prepared answer")
        if answer is None:
            self._open(sid, F.FLAG_END_HEADERS, headers)
            for update in updates:
                if not self.closed:
                    self._window_update(sid, update[3])
            if not self.closed:
                self._data(F.FLAG_END_STREAM, sid, body)
            return True
        self.last_sid = sid
        self.recv_window -= n
        if self.recv_window < CONNECTION_WINDOW // 2:
            self.write(F.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        size = len(answer) + 5
        if (size <= self.send_window and size <= stream_window and size <= self.peer_max_frame
                and size - 5 <= self.max_message):
            self.send_window -= size
            self.write(F.unary_answer(sid, RESPONSE_HEADERS, answer, OK_TRAILERS, False))
        else:  # no window for it now: a call waiting for one, as _finish queues it
            call = Call(sid, self, method, headers, stream_window)
            call.remote_closed = call.started = True
            self.streams[sid] = call
            server.calls += 1
            self._finish(call, None, answer)
        return True

    def _header_block(self, sid, flags, block):
        self._open(sid, flags, self.decoder.decode(block))  # always decoded: the HPACK table stays in sync

    def _data(self, flags, sid, payload):
        n = len(payload)
        if not sid:
            raise FrameError(F.PROTOCOL_ERROR, "DATA on stream 0")
        self.recv_window -= n
        if self.recv_window < 0:
            raise FrameError(F.FLOW_CONTROL_ERROR, "DATA past the connection window")
        if self.recv_window < CONNECTION_WINDOW // 2:
            self.write(F.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        if not n and not flags & F.FLAG_END_STREAM:
            self._count_control()
        else:
            self.fed = True
        call = self.streams.get(sid)
        if call is None:
            if sid > self.last_sid:
                raise FrameError(F.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream closed (reset or answered) while the client was sending: ignored
        if call.remote_closed:
            return self._reset(call, F.STREAM_CLOSED)
        call.recv_window -= n
        if call.recv_window < 0:
            return self._reset(call, F.FLOW_CONTROL_ERROR)
        if flags & F.FLAG_PADDED:
            if not n or payload[0] >= n:
                raise FrameError(F.PROTOCOL_ERROR, "DATA padding past its payload")
            payload = payload[1:n - payload[0]]
        if payload and not self._receive(call, payload):
            return
        if call.recv_window < STREAM_WINDOW // 2 and (call.inbox is None or call.held < STREAM_WINDOW):
            self.write(F.window_update(sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW
        if flags & F.FLAG_END_STREAM:
            self._remote_end(call)

    def _receive(self, call, payload) -> bool:
        """gRPC messages out of a stream's DATA: whole ones to the call, a partial one kept (its declared length
        within grpcMaxMessageBytes, the connection's buffered bytes within max_held). ``held``: the
        call's partial and not yet handled messages' bytes (with their prefixes)."""
        n = len(payload)
        call.held += n
        self.buffered += n
        if self.buffered > self.max_held:
            self._finish(call, (_RESOURCE_EXHAUSTED, "too many request bytes held on this connection"))
            return False
        # F.MessageReader: a message spread over frames grows in place, its declared length checked on its prefix
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
                    self._finish(call, (_UNIMPLEMENTED, "more than one request message for a unary call"))
                    return False
        if reader.error == F.MESSAGE_COMPRESSED:
            if call.encoding in (None, b"identity"):
                status = (_INTERNAL, "Compressed message but no grpc-encoding (compressed flag set)")
            else:
                status = (_UNIMPLEMENTED, "Compression is not supported by this server (grpc-encoding "
                          f"{call.encoding[:40].decode('ascii', 'replace')})")
            self._finish(call, status)
            return False
        if reader.error:
            self._finish(call, (_RESOURCE_EXHAUSTED, f"Received message larger than max ({reader.error_length} vs. "
                                f"{self.max_message})"))
            return False
        return True

    def consumed(self, call, n) -> None:
        """A streaming call's message was read: its bytes are released, the stream's window reopens."""
        n += 5
        call.held -= n
        self.buffered -= n
        if (not call.remote_closed and not call.closed and call.recv_window < STREAM_WINDOW // 2
                and call.held < STREAM_WINDOW):
            self.write(F.window_update(call.sid, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW

    def send_message(self, call, data: bytes) -> None:
        n = len(data)
        if n > self.max_message:
            call.status = (_RESOURCE_EXHAUSTED, f"Sent message larger than max ({n} vs. {self.max_message})")
            return
        out = [] if call.headers_sent else [F.frame(F.HEADERS, F.FLAG_END_HEADERS, call.sid, RESPONSE_HEADERS)]
        call.headers_sent = True
        size = n + 5
        if not call.pending and size <= self.send_window and size <= call.send_window and size <= self.peer_max_frame:
            self.send_window -= size
            call.send_window -= size
            out.append(F.data_message(call.sid, data))
            self.write(b"".join(out) if len(out) > 1 else out[0])
            return
        if out:
            self.write(out[0])
        payload = b"\x00" + n.to_bytes(4, "big") + data
        call.pending.append(payload)
        call.pending_size += size
        self.pending += size
        if self.pending > self.max_pending:
            return self.goaway(F.FLOW_CONTROL_ERROR, b"answers waiting for a window past the budget")
        if not self.blocked:
            self.stall_since = time.monotonic()
            self._stalled()  # the stall is looked at within FLOW_STALL_MS
        self.blocked[call.sid] = call
        self._flush_blocked()

    def _flush_blocked(self):
        progressed = False
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
                self.write(F.frame(F.DATA, 0, sid, chunk))
                progressed = True
            if not call.pending:
                del self.blocked[sid]
                if call.trailers is not None:
                    self.write(call.trailers)
                    call.trailers = None
                    self._drop(call)
        if progressed:
            self.stall_since = time.monotonic()
