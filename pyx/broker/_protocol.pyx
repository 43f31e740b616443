# cython: language_level=3
"""The connection protocol's hot part in Cython (twin: the pure-Python ``engine.broker.server.PyConnection``).

:class:`ProtocolCore` holds a connection's state as C fields and implements ``data_received``: the streaming decode
(the connection's :class:`engine.FrameDecoder`), the repeat route (a repeated heartbeat answered from its armed
template without decoding it), HEART_BEAT requests served straight from the registry (decode, ``ClientRegistry
.heartbeat``, the answer template, the repeat route's next arming), the other requests the processor table serves
inline (UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP: ``RemotingServer.dispatch`` and ``run`` done here, the
processor's handler called directly), and the answers of one read batched into one ``transport.write`` (flushed
early once the processors' answers pass ``RemotingServer.out_flush_bytes``; the repeat route's are not counted).
Every other request, and every request the short forms do not cover (a response flag, a refused connection, ACL,
the recorder, for heartbeats a handler other than the broker's own), goes to ``RemotingServer.dispatch`` and its
executors, exactly as the twin does it. The rest of a connection (connection_made / lost, close, send, the
partial-frame budget, flow control) is the twin's Python code, shared through
``engine.broker.server.ConnectionMethods``: ``engine.broker.server.NativeConnection`` is ``ProtocolCore`` + those
methods.

What the tests hold both implementations to: the same answers, in the same order and the same writes, the same
registry state, the same metrics, the same closes (one logged reason), for any split of the same byte stream
(tests/test_protocol_parity.py).
"""
from cpython.list cimport PyList_Append, PyList_GET_SIZE
from cpython.bytes cimport PyBytes_GET_SIZE

import logging

from engine import FrameDecoder, FrameError
from engine.codec.enums import ResponseCode
from engine.codec.errors import HeartbeatError
from engine.broker import processors as _processors
from engine.broker.processors import HeartbeatRepeat as _HeartbeatRepeat, Processors as _Processors
from engine.broker.repeat import RepeatRoute

cdef int _HEART_BEAT = 34
cdef int _SUCCESS = 0
cdef int _FLAG_RESPONSE = 1
cdef int _FLAG_ONEWAY = 2
cdef object _ERROR = logging.ERROR
cdef object _INFO = logging.INFO
cdef bytes _SUBVERSION = b'"subVersion"'
cdef object _SYSTEM_ERROR = ResponseCode.SYSTEM_ERROR


cdef class ProtocolCore:
    """A connection's state and its ``data_received`` (see the module doc); the same attributes as the twin."""

    cdef public object server
    cdef public object port_name
    cdef public object id
    cdef public object transport
    cdef public object decoder
    cdef public object remote_ip
    cdef public object remote_port
    cdef public object remote_addr
    cdef public object local_ip
    cdef public object local_port
    cdef public bint closing
    cdef public object close_reason
    cdef public object rejected
    cdef public object partial_since
    cdef public object buffered
    cdef public object last_io
    cdef public Py_ssize_t inflight
    cdef public bint reading_paused
    cdef public object write_paused_since
    cdef public object serialize_type
    cdef public object held_pulls
    cdef public object route
    cdef public object _out
    cdef public Py_ssize_t _out_bytes
    cdef public object _soon
    cdef object __weakref__

    def __init__(self, server, port_name):
        self.server = server
        self.port_name = port_name
        self.id = server._next_conn_id()
        self.transport = None
        self.decoder = FrameDecoder(server.config.max_frame_size)
        self.remote_ip = ""
        self.remote_port = 0
        self.remote_addr = ""
        self.local_ip = ""
        self.local_port = 0
        self.closing = False
        self.close_reason = None
        self.rejected = None
        self.partial_since = None
        self.buffered = 0
        self.last_io = server.tick
        self.inflight = 0
        self.reading_paused = False
        self.write_paused_since = None
        self.serialize_type = "JSON"
        self.held_pulls = {}
        self.route = RepeatRoute(server.hb_cache)
        if server.repeats and server.hb_cache.limit:  # maxHeartbeatCacheBytesTotal 0: no route
            self.decoder.watch_code = _HEART_BEAT
        self._out = None
        self._out_bytes = 0
        self._soon = None

    def data_received(self, data):
        if self.closing:
            return
        server = self.server
        self.last_io = server.tick
        bad = None
        try:
            commands = self.decoder.feed(data)
        except FrameError as e:
            server.metrics.frame_errors += 1
            # as Netty, the requests completed before the bad frame are processed and answered before the close
            bad, commands = e, getattr(e, "commands", None)
        if commands:
            self._serve(server, commands)
        if bad is not None:
            (<object>self).close(f"undecodable frame: {bad}", abort=False)
            return
        buffered = self.decoder.buffered
        if buffered != self.buffered and not self.closing:
            (<object>self)._track_partial(buffered)

    cdef _serve(self, server, list commands):
        cdef list out = []
        cdef bint replayed = False
        cdef bint full = False
        cdef object route = self.route
        cdef object procs = _heartbeat_processors(server)
        self._out = out
        self._out_bytes = 0
        try:
            for cmd in commands:
                if self.closing:
                    break
                if type(cmd) is int:  # a repeat of the armed heartbeat: only its opaque
                    armed = route.armed
                    if armed is not None:
                        answer = self._repeat_answer(armed, cmd)
                        if answer is not None:
                            PyList_Append(out, answer)
                            continue
                        route.armed = None
                    replayed = True  # the full path from here on; the read's later repeats too
                    cmd = self.decoder.repeat_command(cmd)
                full = True
                if procs is not None and cmd.code == _HEART_BEAT and self._heart_beat(server, procs, cmd, out):
                    continue
                if self._inline(server, cmd, out):
                    continue
                server.dispatch(self, cmd)
        except Exception:
            # a failure outside the handlers' own guard: answers already made go out, the connection closes, one
            # traceback a minute in the log (as the twin)
            server._dispatch_failed(self)
        finally:
            self._out = None
            if route.candidate is not None:
                route.arm(self.closing, self.decoder)
            if replayed and route.armed is None:
                route.disarm(self.decoder)
            if full:  # the read's heartbeat frame was only kept for arm(): not past the read
                self.decoder.drop_watched()
            if PyList_GET_SIZE(out) and not self.closing:
                self._write(b"".join(out) if PyList_GET_SIZE(out) > 1 else out[0])

    cdef bint _inline(self, server, cmd, list out) except -1:
        """RemotingServer.dispatch + run for a request whose code the processor table serves inline (the
        broker's UNREGISTER_CLIENT and GET_CONSUMER_LIST_BY_GROUP; a heartbeat _heart_beat did not take), in the
        same steps; False (nothing done) where dispatch must take it: a response, a refused connection, a code
        without an inline entry, an ACL check."""
        cdef int flag = cmd.flag
        if flag & _FLAG_RESPONSE or self.rejected is not None:
            return False
        code = cmd.code
        entry = server.table.get(code)
        if entry is None:
            return False
        handler, executor = entry
        if type(executor) is not server._inline_type:
            return False
        if server.acl is not None and code not in server.acl_exempt:
            return False
        # RemotingServer.dispatch
        self.serialize_type = cmd.serialize_type
        server.metrics.requests[code] += 1
        # RemotingServer.run
        try:
            response = handler(self, cmd)
        except Exception as e:
            response = server._handler_failed(self, cmd, e)
        return self._answer(server, cmd, flag, response, out)

    cdef inline bint _answer(self, server, cmd, int flag, response, list out) except -1:
        """The end of RemotingServer.run: no answer to a oneway request; the answer, encoded (a RemotingCommand) or
        not (a template's frame), joins the read's batch, which is written early past out_flush_bytes. True: the
        request was served."""
        if response is None or flag & _FLAG_ONEWAY:
            return True
        if type(response) is not bytes:
            response = server._encode_answer(self, cmd, response)
        if self.closing:
            return True
        PyList_Append(out, response)
        self._out_bytes += PyBytes_GET_SIZE(response)
        if self._out_bytes > server.out_flush_bytes:
            (<object>self)._flush_out()
        return True

    cdef object _repeat_answer(self, armed, opaque):
        """HeartbeatRepeat.answer, inlined for the broker's own class."""
        if type(armed) is not _HeartbeatRepeat:
            return armed.answer(self, opaque)
        if armed.registry.heartbeat_repeat(armed.token) is None:
            return None
        metrics = armed.metrics
        metrics.requests[_HEART_BEAT] += 1
        metrics.heartbeats += 1
        self.serialize_type = armed.serialize_type
        return armed.template.frame(opaque)

    cdef bint _heart_beat(self, server, procs, cmd, list out) except -1:
        """RemotingServer.dispatch + run + Processors.heart_beat, for a heartbeat on the broker's own processor, in
        the same steps; False (nothing done) where the twin's path must take it whole: a response, a refused
        connection, an ACL check, the recorder on."""
        cdef int flag = cmd.flag
        if flag & _FLAG_RESPONSE or self.rejected is not None:
            return False
        if server.acl is not None and _HEART_BEAT not in server.acl_exempt:
            return False
        if procs.broker.recorder is not None:
            return False
        # RemotingServer.dispatch
        self.serialize_type = cmd.serialize_type
        server.metrics.requests[_HEART_BEAT] += 1
        # RemotingServer.run + Processors.heart_beat
        try:
            response = self._heart_beat_answer(procs, cmd)
        except Exception as e:
            response = server._handler_failed(self, cmd, e)
        return self._answer(server, cmd, flag, response, out)

    cdef object _heart_beat_answer(self, procs, cmd):
        """Processors.heart_beat without the recorder (the caller checked it is off)."""
        metrics = procs.metrics
        metrics.heartbeats += 1
        cdef bint kept = True
        body = cmd.body
        route = self.route
        if body == route.body:
            hb = route.hb
        else:
            try:
                hb = _processors.decode_heartbeat(body, procs.config.max_heartbeat_elements)
            except HeartbeatError as e:
                metrics.heartbeat_errors += 1
                procs.broker.server.client_log.log(_INFO, "bad_heartbeat", "bad heartbeat from %s: %s",
                                                   self.remote_addr, e)
                return cmd.response(_SYSTEM_ERROR, remark=str(e))
            consumers = hb.consumers
            if consumers and body.count(_SUBVERSION) < _subscriptions(consumers):
                # a subscription without subVersion: decoded every time, no cached decode, no repeat route
                route.keep_norepeat(body)
                kept = False
            else:
                # cached within maxHeartbeatCacheBytesTotal; past it this heartbeat keeps nothing (not offered)
                kept = route.keep(body, hb)
        registry = procs.registry
        language, version = cmd.language, cmd.version
        result = registry.heartbeat(self, hb, language, version)
        tpl = _template(procs, cmd, result)
        if tpl:
            # a candidate only where the route is on (there the connection's decoder watches heartbeats), and never
            # for a oneway heartbeat (its repeats would be answered from the template), as the twin
            if (kept and self.decoder.watch_code is not None and not cmd.flag & _FLAG_ONEWAY
                    and body != route.norepeat):
                token = registry.repeat_token(self, hb, language, version)
                if token is not None:
                    repeat_tpl = _template(procs, cmd, token[len(token) - 1])  # the result a repeat gets
                    if repeat_tpl:
                        route.offer(_HeartbeatRepeat(procs, token, repeat_tpl, cmd.serialize_type), cmd)
            return tpl.frame(cmd.opaque)
        return cmd.response(result.code, remark=result.remark, ext_fields=result.ext_fields)

    cdef int _write(self, data) except -1:
        t = self.transport
        t.write(data)
        server = self.server
        self.last_io = server.tick
        if t.get_write_buffer_size() > server.config.max_write_buffer_bytes:
            (<object>self).close(f"client does not read its responses ({t.get_write_buffer_size()} bytes pending)",
                                 abort=True)
        return 0


cdef object _template(procs, cmd, result):
    """Processors._template: the encoded SUCCESS answer for (serialize type, IS_SUB_CHANGE, V2), or False."""
    if result.code != _SUCCESS or result.remark is not None:
        return False
    tpl = procs._hb_answers.get((cmd.serialize_type, result.is_sub_change, result.v2_fields))
    if tpl is None:
        return procs._template(cmd, result)
    return tpl


cdef object _heartbeat_processors(server):
    """The Processors whose ``heart_beat`` serves HEART_BEAT inline on this server (the broker's wiring), or None:
    then every heartbeat goes through ``dispatch``. Cached on the table entry's identity."""
    entry = server.table.get(_HEART_BEAT)
    if entry is server._hb_entry:
        return server._hb_procs
    procs = None
    if entry is not None:
        handler, executor = entry
        owner = getattr(handler, "__self__", None)
        if (type(executor) is server._inline_type and getattr(handler, "__func__", None) is _Processors.heart_beat
                and type(owner) is _Processors and owner.broker.recorder is None):
            procs = owner
    server._hb_entry = entry
    server._hb_procs = procs
    return procs


cdef Py_ssize_t _subscriptions(consumers) except -1:
    cdef Py_ssize_t n = 0
    for cd in consumers:
        n += len(cd.subscriptions)
    return n
