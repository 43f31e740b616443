"""The gRPC endpoint of RocketMQ 5.x clients (``apache.rocketmq.v2.MessagingService``), beside the remoting port.

RocketMQ 5.x SDKs (Java, Go, C++, C#, Node.js, Rust, Python) do not speak the remoting protocol: they talk gRPC to a
RocketMQ Proxy, which maps their client sessions onto the broker's client management. This endpoint is that
mapping for this broker (the proxy's GrpcMessagingApplication / ClientActivity / GrpcClientSettingsManager /
RouteActivity semantics, standalone): a 5.x Producer, PushConsumer and SimpleConsumer start against it, register
and stay registered in the same :class:`engine.registry.client_registry.ClientRegistry` as the 4.x clients, and are listed by
``rmqhb consumerConnection`` / ``producerConnection`` next to them.

Served: QueryRoute (this endpoint's address, queues from the topic config; an unknown topic is TOPIC_NOT_FOUND and
is not created, as from the proxy), Heartbeat, the Telemetry stream (the client's Settings in, the broker's merged Settings
back), QueryAssignment, NotifyClientTermination, ReceiveMessage ("no new message" once the long-polling time has
passed: this broker has no message store). Every other RPC answers the proxy's ``NOT_IMPLEMENTED`` status.

A client session (:class:`GrpcSession`, one per client id as the proxy's GrpcChannelManager keeps them) is the
registry's channel: client id, language and version from the ``x-mq-client-id`` / ``x-mq-language`` /
``x-mq-client-version`` metadata, the address from the peer, the groups and subscriptions from the Telemetry
Settings (a producer registers in one producer group per topic it publishes to, named after the topic, as the
proxy does). Heartbeat refreshes it; the broker's housekeeping expires it like any channel (``close``); it is
removed on NotifyClientTermination and when its Telemetry stream ends.

With ``aclEnable`` every call is checked against plain_acl.yml with the 5.x signature scheme (:meth:`GrpcEndpoint
.authorize`, engine.broker.acl's ``check_grpc``): UNAUTHORIZED / FORBIDDEN statuses. With ``recordDir`` each registering
Settings / Heartbeat is recorded as the remoting heartbeat of the same HeartbeatData. A graceful stop saves the
sessions' Settings; a client's Heartbeat after the next start restores its session (:meth:`GrpcEndpoint._restore`).

grpcio's ``grpc.aio`` server runs on the broker's own asyncio loop: every handler, and so every registry call,
runs on that loop's thread (grpcio's poller threads only hand completions to the loop).

The generated protobuf code is the pinned PyPI client's own (``rocketmq-python-client==5.1.2`` ships
``rocketmq/grpc_protocol/*_pb2*.py``, generated from apache/rocketmq-apis): the ``grpc`` extra installs it.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys
import time
import traceback
import types
from collections import Counter
from urllib.parse import unquote

from engine import compiled_or_twin
from engine.alarms import Alarms
from engine.codec.enums import BROKER_VERSION, ConsumeFromWhere, ConsumeType, LanguageCode, MessageModel, ResponseCode
from engine.codec.errors import RemotingError, echo
from engine.logutil import RateLimitedLog
from engine.broker.shares import share_key
from engine.broker.grpc_repeat import header_client_id

_repeat, NATIVE_REPEAT = compiled_or_twin("_grpc_repeat")
HeartbeatRepeat = _repeat.HeartbeatRepeat
del _repeat

log = logging.getLogger("engine.grpc")

#: The PyPI package whose generated modules this endpoint uses (the ``grpc`` extra pins it).
CLIENT_PACKAGE = "rocketmq-python-client==5.1.2"

# -- budgets (README: "5.x clients (gRPC)") --
#: sessions, RPCs in progress, streams per connection, message and metadata bytes: the broker's grpcMax* properties
#: (engine.broker.config.BrokerConfig); the fixed protocol-sanity limits follow
#: topics in one Settings' publishing, subscription entries in one Settings, addresses in one Endpoints (the shares
#: of an address, the Settings bytes and tags budgets, the stream timeout: grpcMax*PerIp, grpcMaxSettingsBytes*,
#: grpcMaxTagsPerSubscription, grpcSettingsTimeoutMs)
MAX_SETTINGS_ENTRIES = 1024
MAX_ENDPOINT_ADDRESSES = 16
#: longest client id accepted (characters)
MAX_CLIENT_ID = 1024
#: QueryRoute and QueryAssignment answers the native transport keeps by their request's bytes, while the topic's and
#: the group's configs and brokerIP1 are unchanged (an SDK repeats the same query every 5-30 s: answered from here
#: without parsing it or building the answer), bytes of requests and answers at most; past it the cache starts
#: over. Requests past ANSWER_CACHE_MAX_REQUEST bytes, and an answer that would take more than a 16th of the budget,
#: are answered, not kept
ANSWER_CACHE_BYTES = 8 << 20
ANSWER_CACHE_MAX_REQUEST = 1024
#: file (in the store's config folder) of the sessions' Settings a graceful stop leaves for the next start
SESSIONS_FILE = "grpcSessions.json"
#: longest sessions file written at stop and read at start, bytes: a stop saves the smallest sessions first and
#: leaves out those that do not fit; a start restores the entries that fit and ignores the rest
MAX_SESSIONS_FILE_BYTES = 64 * 1024 * 1024
#: what one session's Settings are counted to cost (grpcMaxSettingsBytesTotal / grpcMaxSettingsBytesPerIp), bytes:
#: calibrated with tracemalloc (tests/test_grpc_guard.py) on what a registered session keeps: its Settings
#: (twice their encoded size: kept encoded, and the recorder's body of them), per subscription its
#: SubscriptionData, per tag its string, Java hash and set entries, and the session itself
SESSION_COST = 4096
SUBSCRIPTION_COST = 512
TAG_COST = 160
#: HTTP/2 keepalive, ms: the server pings each connection after this long without a frame from it and closes it
#: when no answer came within KEEPALIVE_TIMEOUT_MS, so a client's connection that died without a close (a NAT, a
#: crashed host) ends its Telemetry stream and frees its session within ~30 s instead of channelExpiredTimeout
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
#: clients' own keepalive pings are accepted this often (grpc-java's and grpc-go's shortest keepalive time is
#: 10 s; grpcio's default, 5 minutes, answers more frequent pings with a GOAWAY that drops the client's streams),
#: with or without calls in progress
MIN_CLIENT_PING_INTERVAL_MS = 10_000
#: long polling of ReceiveMessage, ms (the proxy's grpcClientConsumerMin/MaxLongPollingTimeoutMillis)
MIN_LONG_POLLING_MS = 5_000
MAX_LONG_POLLING_MS = 20_000

# -- the proxy's defaults (ProxyConfig, SubscriptionGroupConfig, CustomizedRetryPolicy, ExponentialRetryPolicy) --
_PRODUCER_MAX_ATTEMPTS = 3
_PRODUCER_BACKOFF_MS = (10, 1000, 2)  # initial, max, multiplier
_CONSUMER_BATCH_SIZE = 32
_CUSTOMIZED_NEXT_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
                       480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)
_EXPONENTIAL_MS = (5_000, 7_200_000, 2)

_GROUP_MAX = 255
_TOPIC_MAX = 127
_LEGAL = frozenset("%|_-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
#: x-mq-language values whose Java LanguageCode name differs
_LANGUAGE_ALIASES = {"GOLANG": LanguageCode.GO, "DOT_NET": LanguageCode.DOTNET, "NODEJS": LanguageCode.NODE_JS}
_PERM_READ, _PERM_WRITE = 4, 2
SERVICE = "apache.rocketmq.v2.MessagingService"


class GrpcEndpointError(RemotingError, ValueError):
    """The gRPC endpoint cannot start (the ``grpc`` extra is missing, the port cannot be bound)."""


class _BadRequest(Exception):
    """A request the proxy refuses with a status code (never carries Python internals)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


_protocol = None


def load_protocol() -> types.SimpleNamespace:
    """grpc, grpc.aio and the generated modules, or GrpcEndpointError naming the extra to install."""
    global _protocol
    if _protocol is None:
        try:
            import grpc
            from grpc import aio
            from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
        except ImportError as e:
            raise GrpcEndpointError(
                f"grpcServerPort needs the grpc extra (grpcio, {CLIENT_PACKAGE}): pip install "
                f"'rocketmq-heartbeat-engine[grpc]' ({str(e)[:120]})") from None
        _protocol = types.SimpleNamespace(grpc=grpc, aio=aio, d=definition_pb2, s=service_pb2, sg=service_pb2_grpc)
    return _protocol


def _short(text, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _legal_name(name: str, limit: int) -> bool:
    return 0 < len(name) <= limit and _LEGAL.issuperset(name)


def language_of(text: str | None):
    """The remoting LanguageCode of an ``x-mq-language`` value (LanguageCode.valueOf; unknown names: OTHER)."""
    name = (text or "").strip().upper()
    code = LanguageCode.__members__.get(name)
    if code is not None:
        return code
    return _LANGUAGE_ALIASES.get(name, LanguageCode.OTHER)


def _client_id(context) -> str | None:
    """The ``x-mq-client-id`` of a call (its first value, stripped), read without building a dict."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return value.strip() if isinstance(value, str) else None
    return None


def ip_of(address: str) -> str:
    """The key of an address's shares (grpcMax*PerIp): ``1.2.3.4:5`` without the port, ``[2001:db8::1]:5`` as its
    /64 ``2001:db8::/64`` (engine.broker.shares: one host commonly holds a whole /64)."""
    host, colon, port = address.rpartition(":")
    return share_key((host.strip("[]") if colon and port.isdigit() else address) or address)


def peer_address(peer: str) -> str:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` (grpc's ``context.peer()``) as ``1.2.3.4:5`` / ``[::1]:5``."""
    peer = unquote(peer or "")
    for scheme in ("ipv4:", "ipv6:"):
        if peer.startswith(scheme):
            return peer[len(scheme):]
    return peer


class GrpcSession:
    """One 5.x client (one client id) as a channel of the registry.

    ``closing`` and ``close(reason, level)`` are what the broker's housekeeping uses on an expired channel;
    ``grpc_session`` tells the broker's NOTIFY_CONSUMER_IDS_CHANGED sender that this channel takes no remoting
    command (a 5.x client learns of membership changes by its periodic QueryAssignment, as from the proxy).
    """

    __slots__ = ("client_id", "language", "version", "sdk_version", "remote_addr", "settings_raw", "client_type",
                 "stream", "closing", "close_reason", "id", "ip", "peer", "groups", "cost", "last_seen", "_endpoint",
                 "_hb", "_hb_group", "_hb_body", "_hb_repeat", "_beat", "__weakref__")
    grpc_session = True

    @property
    def settings(self):
        """The client's raw Settings (GrpcClientSettingsManager's CLIENT_SETTINGS_MAP entry), None before its first;
        decoded from ``settings_raw`` at each read (rare: a Settings command, a registration, a termination): kept
        decoded, a session's Settings cost ~1.2 KB of the broker's memory for its life, encoded ~0.15 KB."""
        raw = self.settings_raw
        return None if raw is None else self._endpoint.p.d.Settings.FromString(raw)

    def __init__(self, endpoint, client_id: str, language, sdk_version: str, remote_addr: str):
        self._endpoint = endpoint
        self.client_id = client_id
        self.language = language
        self.sdk_version = sdk_version
        # ClientActivity.parseClientVersion: a 5.x SDK sends "5.1.2", not a MQVersion.Version name: CURRENT_VERSION
        self.version = BROKER_VERSION
        self.remote_addr = remote_addr
        #: the peer's address without its port (an IPv6 address's /64): the key of the per-address shares
        self.ip = ip_of(remote_addr)
        #: the connection (grpc's context.peer()) that created it: its grpcMaxSessionsPerConnection share
        self.peer = None
        #: the groups counted against the address's share (its Settings' and its heartbeats', ("C" | "P", name):
        #: consumer and producer groups are two tables, as in the registry's budget), and the bytes its
        #: Settings are counted to cost (SESSION_COST...): both released when the session closes
        self.groups = frozenset()
        self.cost = 0
        #: time.monotonic() of its last Settings or Heartbeat: a session silent for channelExpiredTimeout ends
        #: with its stream even when the registry holds none of its groups (e.g. a refused registration)
        self.last_seen = time.monotonic()
        self.settings_raw = None  # its Settings, encoded (see settings)
        self.client_type = 0
        self.stream = None  # its current Telemetry stream (_Stream)
        self.closing = False
        self.close_reason = None
        self._hb = None
        self._hb_group = None
        self._hb_body = None  # its HeartbeatData as a remoting heartbeat body (the recorder's records)
        #: (key, HeartbeatData) its Heartbeat registers: the Settings' groups with the subscriptions the group
        #: already has (the proxy's Heartbeat registers without updating subscriptions: only Settings do)
        self._beat = None
        #: (the serialized HeartbeatRequest, the registry's repeat token) of its last heartbeat that took the
        #: registry's full path and armed its fast path: the same bytes again are a repeat (see _Servicer.Heartbeat)
        self._hb_repeat = None
        #: the recorder's connection id (the remoting server's sequence: no clash with a connection's)
        self.id = endpoint.broker.server._next_conn_id()

    def close(self, reason: str = "", level=logging.INFO) -> None:
        """Remove the session (the registry's entries, its table slot); its Telemetry stream is ended."""
        self._endpoint.close_session(self, reason, level)

    def __repr__(self):
        return (f"GrpcSession(client_id={self.client_id!r}, language={getattr(self.language, 'name', self.language)}, "
                f"sdk_version={self.sdk_version!r}, remote_addr={self.remote_addr!r})")


class GrpcEndpoint:
    """The gRPC server of one broker. ``await start()`` / ``await stop()`` on the broker's loop."""

    def __init__(self, broker, port: int | None = None, host: str | None = None, *, max_sessions: int | None = None,
                 max_concurrent_rpcs: int | None = None, max_streams_per_connection: int | None = None,
                 max_message_bytes: int | None = None, max_metadata_bytes: int | None = None,
                 min_long_polling_ms: int = MIN_LONG_POLLING_MS, max_long_polling_ms: int = MAX_LONG_POLLING_MS):
        """The budgets are the broker's grpcMax* properties unless given here."""
        self.broker = broker
        cfg = broker.config

        def budget(value, name):
            return int(value if value is not None else getattr(cfg, name))
        #: engine.broker.acl.AclValidator with aclEnable: every call's 5.x signature and the resources it names are checked
        self.acl = getattr(broker, "acl", None)
        self.port = int(cfg.grpc_server_port if port is None else port)
        self.host = cfg.listen_host if host is None else host
        self.max_sessions = budget(max_sessions, "grpc_max_sessions")
        self.max_concurrent_rpcs = budget(max_concurrent_rpcs, "grpc_max_concurrent_rpcs")
        self.max_streams_per_connection = budget(max_streams_per_connection, "grpc_max_streams_per_connection")
        self.max_message_bytes = budget(max_message_bytes, "grpc_max_message_bytes")
        self.max_metadata_bytes = budget(max_metadata_bytes, "grpc_max_metadata_bytes")
        # the shares one client, connection or address may take of what all clients share (issue 26), read per
        # request (tests lower them on a running endpoint)
        self.max_sessions_per_ip = int(cfg.grpc_max_sessions_per_ip)
        self.max_sessions_per_connection = int(cfg.grpc_max_sessions_per_connection)
        self.max_groups_per_ip = int(cfg.grpc_max_groups_per_ip)
        self.max_settings_bytes_total = int(cfg.grpc_max_settings_bytes_total)
        self.max_settings_bytes_per_ip = int(cfg.grpc_max_settings_bytes_per_ip)
        self.max_tags_per_subscription = int(cfg.grpc_max_tags_per_subscription)
        self.settings_timeout_ms = int(cfg.grpc_settings_timeout_ms)
        self.takeover_silence_ms = int(cfg.grpc_session_takeover_silence_ms)
        #: per address: sessions, groups (name -> sessions of the address counting it), Settings bytes counted
        self._ip_sessions: Counter = Counter()
        self._ip_groups: dict[str, Counter] = {}
        self._ip_cost: Counter = Counter()
        #: per connection (context.peer()): the sessions it created (grpcMaxSessionsPerConnection)
        self._conn_sessions: Counter = Counter()
        #: Settings bytes counted over all sessions (grpcMaxSettingsBytesTotal)
        self.settings_cost = 0
        #: reason -> requests or streams refused to protect what clients share (also the broker's
        #: rocketmq_broker_grpc_refused_total): foreign_client_id, sessions_per_ip, sessions_per_connection,
        #: groups_per_ip, settings_bytes, tags_per_subscription, settings_timeout, idle_session
        self.refused: Counter = Counter()
        #: sessions taken over by another connection after grpcSessionTakeoverSilenceMs of silence of their owner's
        self.takeovers = 0
        self._refusal_log = RateLimitedLog(log, 60.0, 5)
        #: handler failures: a client may cause one with every call (see :meth:`internal_error`)
        self._error_log = RateLimitedLog(log, 60.0, 5, max_arg=8192)
        self.min_long_polling_ms = min_long_polling_ms
        self.max_long_polling_ms = max_long_polling_ms
        self.sessions: dict[str, GrpcSession] = {}
        self.bound_port = 0
        self._server = None
        self._loop = None
        self.alarms = None
        self._stopping: asyncio.Event | None = None
        #: requests answered with a non-OK status because they were bad, and handler failures (logged)
        self.bad_requests = 0
        self.internal_errors = 0
        #: calls refused by the ACL (UNAUTHORIZED, FORBIDDEN)
        self.acl_denied = 0
        #: ``fn(method, metadata, request)`` called with every request before it is handled (captures, tests);
        #: its failures are logged, never the client's problem
        self.on_request = None
        #: client id -> (Settings, language, SDK version, restorable until ms): sessions of the broker before its
        #: restart, restored by their client's next Heartbeat (see :meth:`_restore`)
        self.dormant: dict = {}
        self.restored = 0
        #: QueryRoute / QueryAssignment answers by (method, request bytes): (answer, topic, its config, group (None
        #: for a route), its config, brokerIP1) (see prepared_route); their bytes; hits
        self._answers: dict = {}
        self._answers_bytes = 0
        self.answer_cache_hits = 0
        self.p = load_protocol()
        #: the serialized answer of a heartbeat that registered (the Heartbeat handler answers with bytes)
        self._heartbeat_ok = self.p.s.HeartbeatResponse(status=self._status(self.p.d.Code.OK)).SerializeToString()
        #: a repeated Heartbeat's answer (engine.broker.grpc_repeat; compiled: engine.broker._grpc_repeat): made
        #: last, it holds the sessions dict, the ACL validator and the answer above
        self.heartbeat_repeat = HeartbeatRepeat(self)

    @property
    def heartbeat_repeats(self) -> int:
        """Heartbeats answered on the repeat path (see _Servicer.Heartbeat)."""
        return self.heartbeat_repeat.hits

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        p = self.p
        self._loop = asyncio.get_running_loop()
        #: the Telemetry handlers' waits (engine.alarms)
        self.alarms = Alarms(self._loop, lambda: self.internal_error("Telemetry alarm"))
        self._stopping = asyncio.Event()
        from engine.broker.metrics import channelz_connections, channelz_server_ids
        from engine.broker.server import listener_budget

        self.max_connections = listener_budget(self.broker.config)["grpc"]
        if getattr(self.broker.config, "grpc_transport", "native") == "native":  # issue 30: engine.http2
            return await self._start_native()
        others = channelz_server_ids()  # the gRPC servers before this one (its open connections: channelz)
        options = [
            ("grpc.so_reuseport", 0),  # a port in use fails the start (grpc's default would share it)
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            # the soft limit and the hard one (between them grpc refuses a call only with some probability)
            ("grpc.max_metadata_size", self.max_metadata_bytes),
            ("grpc.absolute_max_metadata_size", self.max_metadata_bytes),
            # this port's share of maxConnections (engine.broker.server.listener_budget): grpcio closes a connection
            # past it at accept, so a flood here cannot take the descriptors of the other ports and the store
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            # a connection that died without a close is found by the keepalive ping it does not answer
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # grpc core's own ping timeout (default 1 min)
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # keepalive pings also on a connection sending no data
            # the clients' own keepalive pings are welcome (not counted as ping abuse)
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ]
        server = p.aio.server(maximum_concurrent_rpcs=self.max_concurrent_rpcs, options=options)
        servicer = _Servicer(self)
        p.sg.add_MessagingServiceServicer_to_server(servicer, server)
        # Heartbeat with bytes in and out (its repeat path compares the request's bytes, answers prepared bytes): a
        # registered method's handler takes precedence over the generated (generic) one
        server.add_registered_method_handlers(SERVICE, {
            "Heartbeat": p.grpc.unary_unary_rpc_method_handler(servicer.Heartbeat)})
        host = self.host or "0.0.0.0"
        addr = f"[{host}]:{self.port}" if ":" in host and not host.startswith("[") else f"{host}:{self.port}"
        try:
            tls = self._tls_files()  # grpcTlsCertPath / grpcTlsKeyPath
            bound = (server.add_insecure_port(addr) if tls is None else
                     server.add_secure_port(addr, p.grpc.ssl_server_credentials([(tls[1], tls[0])])))
        except RuntimeError as e:
            # grpc's text ("Failed to bind ...; set GRPC_VERBOSITY=debug ...") says neither why nor what to do
            raise GrpcEndpointError(f"grpcServerPort {self.port}: cannot bind {addr}: the port is in use (or the "
                                    "address is not this machine's)") from None
        if not bound:
            raise GrpcEndpointError(f"grpcServerPort {self.port}: cannot bind {addr}")
        await server.start()
        self._server = server
        self.bound_port = bound
        metrics = getattr(self.broker, "metrics", None)
        if metrics is not None and hasattr(metrics, "listener_limits"):
            metrics.listener_limits["grpc"] = self.max_connections
            ours = channelz_server_ids() - others
            if len(ours) == 1:  # else (another server started meanwhile) the gauge is left out
                sid = ours.pop()
                metrics.listener_open["grpc"] = lambda: channelz_connections(sid)
        self._load_sessions()
        log.info("gRPC endpoint (RocketMQ 5.x clients) listening on %s:%d", host, bound)
        return bound

    def _tls_files(self):
        """(certificate chain, private key) bytes of grpcTlsCertPath / grpcTlsKeyPath, or None (plaintext)."""
        cfg = self.broker.config
        cert, key = getattr(cfg, "grpc_tls_cert_path", ""), getattr(cfg, "grpc_tls_key_path", "")
        if not cert:
            return None
        try:
            with open(cert, "rb") as f:
                cert_pem = f.read(1 << 20)
            with open(key, "rb") as f:
                key_pem = f.read(1 << 20)
        except OSError as e:
            raise GrpcEndpointError(f"grpcTlsCertPath / grpcTlsKeyPath: {_short(e, 120)}") from None
        return cert_pem, key_pem

    async def _start_native(self) -> int:
        """grpcTransport=native: engine.http2's server on this loop, the same _Servicer (Heartbeat with bytes in
        and out); its accepts within this port's share of maxConnections (connections_refused_total{grpc})."""
        from engine.http2.server import H2Server

        # the same keepalive as the grpcio server's options (read at start: tests scale the constants down)
        self.keepalive_time_ms, self.keepalive_timeout_ms = KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
        servicer = _Servicer(self)
        server = H2Server(self, servicer, SERVICE, prepared={
            "Heartbeat": self.heartbeat_repeat,
            "QueryRoute": lambda message, client_id, peer: self.prepared_route("QueryRoute", message, client_id),
            "QueryAssignment": lambda message, client_id, peer: self.prepared_route("QueryAssignment", message,
                                                                                    client_id)})
        host = self.host or "0.0.0.0"
        tls = self._tls_files()
        context = None
        if tls is not None:  # TLS 1.2+ with ALPN h2 (RFC 7540 §3.3)
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["h2"])
            cfg = self.broker.config
            try:
                context.load_cert_chain(cfg.grpc_tls_cert_path, cfg.grpc_tls_key_path)
            except (OSError, ssl.SSLError) as e:
                raise GrpcEndpointError(f"grpcTlsCertPath / grpcTlsKeyPath: {_short(e, 120)}") from None
        try:
            bound = await server.start(self.host or None, self.port, ssl=context)
        except OSError as e:
            # asyncio's text repeats the address; say why in the words the grpcio transport uses
            why = ("the port is in use (or the address is not this machine's)" if e.errno == errno.EADDRINUSE else
                   os.strerror(e.errno) if e.errno else _short(e, 80))
            raise GrpcEndpointError(f"grpcServerPort {self.port}: cannot bind {host}:{self.port}: {why}") from None
        self._server = server
        self.bound_port = bound
        metrics = getattr(self.broker, "metrics", None)
        if metrics is not None and hasattr(metrics, "listener_limits"):
            metrics.listener_limits["grpc"] = self.max_connections
            metrics.listener_open["grpc"] = lambda: len(server.connections)
        self._load_sessions()
        log.info("gRPC endpoint (RocketMQ 5.x clients, native HTTP/2) listening on %s:%d", host, bound)
        return bound

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is None:
            return
        self._stopping.set()
        getattr(getattr(self.broker, "metrics", None), "listener_open", {}).pop("grpc", None)
        # what the sessions are before their streams end with the server (ending a stream removes its session)
        kept = [(x.client_id, x.language, x.sdk_version, x.settings_raw) for x in self.sessions.values()
                if x.settings_raw is not None and not x.closing]
        server, self._server = self._server, None
        await server.stop(grace)
        for session in list(self.sessions.values()):
            self.close_session(session, "broker shutdown", logging.DEBUG)
        self._save_sessions(kept)

    # ------------------------------------------------------------------ sessions across a restart
    def _sessions_path(self):
        store = getattr(self.broker.registry, "store", None)
        config_dir = getattr(store, "config_dir", None)
        return None if config_dir is None else config_dir / SESSIONS_FILE

    def _save_sessions(self, kept, limit: int | None = None) -> None:
        """A graceful stop writes each registered session's Settings (a 5.x client does not send them again when
        its broker comes back: the Python client 5.1.2 only every 300 s on a stream it rebuilds after a failed
        write). One JSON line per session after a header line, the smallest sessions first, as many as fit in
        ``limit`` bytes (MAX_SESSIONS_FILE_BYTES, what a start reads): large sessions cannot cost the others their
        restore. Never fails the stop."""
        path = self._sessions_path()
        if path is None or not kept:
            return
        import base64
        import json
        import os

        limit = MAX_SESSIONS_FILE_BYTES if limit is None else limit
        lines = [json.dumps({"version": 2, "savedMs": int(time.time() * 1000)}).encode("utf-8") + b"\n"]
        size = len(lines[0])
        encoded = sorted(((raw, cid, lang, ver) for cid, lang, ver, raw in kept), key=lambda x: len(x[0]))
        left_out = 0
        for raw, cid, lang, ver in encoded:
            line = json.dumps({"clientId": cid, "language": getattr(lang, "name", str(lang)), "sdkVersion": ver,
                               "settings": base64.b64encode(raw).decode("ascii")}).encode("utf-8") + b"\n"
            if size + len(line) > limit:
                left_out = len(encoded) - (len(lines) - 1)
                break
            lines.append(line)
            size += len(line)
        if left_out:
            log.warning("gRPC sessions file: %d of %d sessions (the largest) left out to stay within %d bytes",
                        left_out, len(encoded), limit)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            log.warning("gRPC sessions not saved for the next start (%s): %s", path, _short(e, 120))

    def _load_sessions(self) -> None:
        """The sessions file of the previous run, read once (and removed: a later crash must not bring them back):
        each entry restorable until channelExpiredTimeout after this start. At most MAX_SESSIONS_FILE_BYTES are
        read: the entries within them are restored, the rest is left out (and said so); a bad entry is skipped, a
        bad header ignores the file. An older file (one JSON document) is read when it fits."""
        path = self._sessions_path()
        if path is None or not path.is_file():
            return
        import base64
        import json

        now = int(time.time() * 1000)
        until = now + int(self.broker.config.channel_expired_timeout)
        left_out = 0
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SESSIONS_FILE_BYTES + 1)
            head, _, rest = data.partition(b"\n")
            doc = json.loads(head)
            if not isinstance(doc, dict):
                raise ValueError("no header")
            if isinstance(doc.get("sessions"), list):  # version 1: the whole file is one document
                entries = doc["sessions"]
            else:
                if doc.get("version") != 2:
                    raise ValueError("unknown version")
                lines = rest.split(b"\n")
                if len(data) > MAX_SESSIONS_FILE_BYTES:
                    lines.pop()  # cut inside it (or just after it): what did not fit is left out
                    left_out = -1
                entries = (line for line in lines if line.strip())
            saved = int(doc.get("savedMs") or 0)
            if now - saved <= int(self.broker.config.channel_expired_timeout):  # else they have expired meanwhile
                for entry in entries:
                    if len(self.dormant) >= self.max_sessions:
                        left_out = -1
                        break
                    try:
                        if isinstance(entry, bytes):
                            entry = json.loads(entry)
                        cid = str(entry["clientId"])
                        raw = base64.b64decode(entry["settings"], validate=True)
                        self.p.d.Settings.FromString(raw)  # kept encoded (see GrpcSession.settings) once it decodes
                        if 0 < len(cid) <= MAX_CLIENT_ID:
                            self.dormant[cid] = (raw, language_of(entry.get("language")),
                                                 str(entry.get("sdkVersion") or "")[:64], until)
                    except Exception:  # one bad entry: skipped
                        continue
        except Exception as e:
            log.warning("gRPC sessions file %s ignored: %s", path, _short(e, 120))
        try:
            path.unlink()
        except OSError:
            pass
        if left_out:
            log.warning("gRPC sessions file %s: only the first %d bytes (%d sessions) read, the rest left out",
                        path, MAX_SESSIONS_FILE_BYTES, len(self.dormant))
        if self.dormant:
            log.info("gRPC endpoint: %d sessions of the previous run restorable by their next Heartbeat",
                     len(self.dormant))

    def _restore(self, context):
        """A Heartbeat of a client id with no session: the session it had before the broker's restart, registered
        again from its saved Settings (with this call's peer; checked by the ACL as its Settings would be), or
        None."""
        client_id = self._metadata(context)[0]
        entry = self.dormant.pop(client_id, None)
        if entry is None:
            return None
        raw, _, _, until = entry
        if int(time.time() * 1000) > until:
            return None
        settings = self.p.d.Settings.FromString(raw)
        self.authorize("Telemetry", self.p.s.TelemetryCommand(settings=settings), context)
        session = self._session(context, create=True)
        try:
            status = self._update_settings(session, settings)
        except Exception:  # whatever failed: a session without a stream left here would never be reaped
            self.close_session(session, "restore failed", logging.DEBUG)
            raise
        if status is not None:  # its group cannot register any more: the client's Settings will tell
            self.close_session(session, "restore failed", logging.DEBUG)
            return None
        self.restored += 1
        self.broker.registry.client_log.log(log, logging.INFO, "grpc_session_restored", "gRPC client %s (%s) "
                                            "restored from its Settings before the broker's restart", client_id,
                                            session.remote_addr)
        return session

    # ------------------------------------------------------------------ sessions
    def close_session(self, session: GrpcSession, reason: str = "", level=logging.INFO,
                      end_stream: bool = True) -> None:
        """Remove a session: its registry entries and slot, its table entry; ``end_stream``: its Telemetry stream
        is ended too (expiry, broker shutdown; a terminated client closes its stream itself)."""
        if session.closing:
            return
        session.closing = True
        session.close_reason = reason
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            self._account(session, frozenset(), 0)
            ip = session.ip
            self._ip_sessions[ip] -= 1
            if self._ip_sessions[ip] <= 0:
                del self._ip_sessions[ip]
            self._conn_sessions[session.peer] -= 1
            if self._conn_sessions[session.peer] <= 0:
                del self._conn_sessions[session.peer]
        self.broker.registry.close_channel(session)
        stream, session.stream = session.stream, None
        if stream is not None:
            if end_stream:
                stream.end()  # its Telemetry handler ends the stream
            elif self._loop is not None:  # the client closes it; if it does not, it ends as a stream without Settings
                stream.linger = self._loop.call_later(self.settings_timeout_ms / 1000.0, stream.end)
        # clients decide how often a session closes: the client-management log's budget, texts escaped
        self.broker.registry.client_log.log(log, level, "grpc_session_removed", "gRPC client %s (%s) removed: %s",
                                            session.client_id, session.remote_addr, reason)

    def _metadata(self, context) -> tuple[str, object, str]:
        md = {}
        for key, value in context.invocation_metadata() or ():
            if key not in md and isinstance(value, str):
                md[key] = value
        client_id = md.get("x-mq-client-id", "").strip()
        if not client_id:
            raise _BadRequest(self.p.d.Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
        if len(client_id) > MAX_CLIENT_ID:
            raise _BadRequest(self.p.d.Code.BAD_REQUEST, f"client id longer than {MAX_CLIENT_ID} characters")
        return client_id, language_of(md.get("x-mq-language")), md.get("x-mq-client-version", "")[:64]

    def _session(self, context, create: bool) -> GrpcSession | None:
        """The session of the call's client id (``create``: a new one when it has none, within grpcMaxSessions and
        the address's grpcMaxSessionsPerIp and the connection's grpcMaxSessionsPerConnection). A call from a
        connection other than the one of the session's live Telemetry stream is refused (:meth:`_check_owner`)."""
        client_id, language, version = self._metadata(context)
        session = self.sessions.get(client_id)
        if session is not None:
            self._check_owner(session, context)
        elif create:
            remote_addr = peer_address(context.peer())
            ip = ip_of(remote_addr)
            if len(self.sessions) >= self.max_sessions:
                raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many client sessions")
            if self._ip_sessions[ip] >= self.max_sessions_per_ip:
                self._refuse("sessions_per_ip", "gRPC client %s (%s) refused: its address holds %d sessions",
                             echo(client_id), echo(remote_addr), self.max_sessions_per_ip)
                raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many client sessions from this address")
            peer = context.peer()
            if self._conn_sessions[peer] >= self.max_sessions_per_connection:
                # clients behind one address (a NAT) share its share: one of their connections may not take it all
                self._refuse("sessions_per_connection", "gRPC client %s (%s) refused: its connection holds %d "
                             "sessions", echo(client_id), echo(remote_addr), self.max_sessions_per_connection)
                raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many client sessions on this connection")
            session = GrpcSession(self, client_id, language, version, remote_addr)
            session.peer = peer
            self.sessions[client_id] = session
            self._ip_sessions[ip] += 1
            self._conn_sessions[peer] += 1
            self.broker.registry.open_channel(session, session.remote_addr)
        return session

    def _check_owner(self, session: GrpcSession, context) -> None:
        """A session belongs to the connection of its live Telemetry stream: another connection presenting its
        client id (to end it, take its stream over, or heartbeat it into other groups) is refused FORBIDDEN while
        that stream lives and its connection is heard from; once it is gone, or its connection has been silent for
        grpcSessionTakeoverSilenceMs (a live client heartbeats every 10 s: this one's connection died without a
        close), any connection of the client may take the session on."""
        stream = session.stream
        if stream is None or stream.ended:
            return
        now = time.monotonic()
        if stream.peer == context.peer():
            stream.last_active = now
            return
        if (now - max(stream.last_active, session.last_seen)) * 1000 > self.takeover_silence_ms:
            self.takeovers += 1
            self._refusal_log.log(logging.INFO, "takeover", "gRPC client %s (%s) silent for "
                                  "grpcSessionTakeoverSilenceMs: its session taken over by %s",
                                  echo(session.client_id), echo(session.remote_addr),
                                  echo(peer_address(context.peer())))
            session.stream = None  # the silent stream's handler ends it, and leaves the session to the new owner
            stream.end()
            return
        self._refuse("foreign_client_id", "gRPC client id %s of %s presented by another connection (%s): refused",
                     echo(session.client_id), echo(session.remote_addr), echo(peer_address(context.peer())))
        raise _BadRequest(self.p.d.Code.FORBIDDEN, "this client id belongs to another connection")

    def move_session(self, session: GrpcSession, remote_addr: str, peer: str) -> None:
        """The session taken on by the connection ``peer`` from ``remote_addr``: its address (the registry's too),
        its shares of the per-address budgets and its connection's session share move there, checked as a new
        session's would be (_BadRequest TOO_MANY_REQUESTS past them: the session stays where it was)."""
        if peer != session.peer and self._conn_sessions[peer] >= self.max_sessions_per_connection:
            self._refuse("sessions_per_connection", "gRPC client %s (%s) refused: its connection holds %d sessions",
                         echo(session.client_id), echo(remote_addr), self.max_sessions_per_connection)
            raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many client sessions on this connection")
        ip = ip_of(remote_addr)
        if ip != session.ip:
            table = self._ip_groups.get(ip) or {}
            if (self._ip_sessions[ip] >= self.max_sessions_per_ip
                    or len(table) + sum(1 for g in session.groups if g not in table) > self.max_groups_per_ip
                    or self._ip_cost[ip] + session.cost > self.max_settings_bytes_per_ip):
                self._refuse("sessions_per_ip", "gRPC client %s (%s) refused: its session does not fit the shares "
                             "of %s", echo(session.client_id), echo(session.remote_addr), echo(remote_addr))
                raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many client sessions from this address")
            groups, cost = session.groups, session.cost
            self._account(session, frozenset(), 0)  # released by the old address...
            self._ip_sessions[session.ip] -= 1
            if self._ip_sessions[session.ip] <= 0:
                del self._ip_sessions[session.ip]
            session.ip = ip
            self._ip_sessions[ip] += 1
            self._account(session, groups, cost)  # ... and counted for the new one
        if peer != session.peer:
            self._conn_sessions[session.peer] -= 1
            if self._conn_sessions[session.peer] <= 0:
                del self._conn_sessions[session.peer]
            session.peer = peer
            self._conn_sessions[peer] += 1
        session.remote_addr = remote_addr
        self.broker.registry.open_channel(session, remote_addr)

    def _refuse(self, reason: str, msg: str, *args) -> None:
        """Count a refusal (``refused``, the broker's grpc_refused_total) and log it within the budget."""
        self.refused[reason] += 1
        metrics = getattr(self.broker, "metrics", None)
        counter = getattr(metrics, "grpc_refused", None)
        if counter is not None:
            counter[reason] += 1
        self._refusal_log.log(logging.WARNING, reason, msg, *args)

    def internal_error(self, what: str) -> None:
        """The exception being handled, a failure of ``what``: counted (``internal_errors``) and logged within a
        budget (a client may cause one with every call), its text and traceback on one line with control
        characters escaped (its message may hold a client's text; an embedder's formatter may escape nothing)."""
        self.internal_errors += 1
        exc = sys.exc_info()[1]
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self._error_log.log(logging.ERROR, "internal_error", "gRPC %s failed: %s; traceback: %s", what, summary,
                            "".join(traceback.format_tb(exc.__traceback__)) if exc is not None else "")

    def _account(self, session: GrpcSession, groups: frozenset, cost: int) -> None:
        """Move the session's share of its address's budgets to ``groups`` and ``cost`` (checked before)."""
        ip = session.ip
        if groups != session.groups:
            table = self._ip_groups.setdefault(ip, Counter())
            for g in groups - session.groups:
                table[g] += 1
            for g in session.groups - groups:
                table[g] -= 1
                if table[g] <= 0:
                    del table[g]
            if not table:
                del self._ip_groups[ip]
            session.groups = groups
        if cost != session.cost:
            self._ip_cost[ip] += cost - session.cost
            if self._ip_cost[ip] <= 0:
                del self._ip_cost[ip]
            self.settings_cost += cost - session.cost
            session.cost = cost

    def _check_shares(self, session: GrpcSession, groups: frozenset, cost: int) -> None:
        """_BadRequest TOO_MANY_REQUESTS when ``groups`` / ``cost`` in place of the session's own would pass the
        address's group share or the Settings bytes budgets."""
        ip = session.ip
        table = self._ip_groups.get(ip) or {}
        new = sum(1 for g in groups - session.groups if g not in table)
        gone = sum(1 for g in session.groups - groups if table.get(g) == 1)
        if new and len(table) + new - gone > self.max_groups_per_ip:
            self._refuse("groups_per_ip", "gRPC client %s (%s) refused: its address registers %d groups at most",
                         echo(session.client_id), echo(session.remote_addr), self.max_groups_per_ip)
            raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "too many groups from this address")
        more = cost - session.cost
        if more > 0 and (self.settings_cost + more > self.max_settings_bytes_total
                         or self._ip_cost[ip] + more > self.max_settings_bytes_per_ip):
            self._refuse("settings_bytes", "gRPC client %s (%s) refused: Settings counted at %d bytes pass the "
                         "Settings bytes budget", echo(session.client_id), echo(session.remote_addr), cost)
            raise _BadRequest(self.p.d.Code.TOO_MANY_REQUESTS, "settings too large for the broker's budget")

    def settings_cost_of(self, settings) -> int:
        """What a session with these Settings is counted to cost (see SESSION_COST)."""
        cost = SESSION_COST + 2 * settings.ByteSize()
        if settings.HasField("subscription"):
            for entry in settings.subscription.subscriptions:
                expr = entry.expression.expression
                cost += SUBSCRIPTION_COST + 2 * len(expr) + TAG_COST * (expr.count("||") + 1)
        else:
            cost += SUBSCRIPTION_COST * len(settings.publishing.topics)
        return cost

    # ------------------------------------------------------------------ validation
    def _topic(self, resource) -> str:
        name = resource.name
        if not _legal_name(name, _TOPIC_MAX):
            raise _BadRequest(self.p.d.Code.ILLEGAL_TOPIC, f"topic name is illegal: {_short(name, 40)!r}")
        return name

    def _group(self, resource) -> str:
        name = resource.name
        if not _legal_name(name, _GROUP_MAX):
            raise _BadRequest(self.p.d.Code.ILLEGAL_CONSUMER_GROUP,
                              f"consumer group name is illegal: {_short(name, 40)!r}")
        return name

    def trace(self, method: str, request, context) -> None:
        if self.on_request is not None:
            try:
                self.on_request(method, tuple(context.invocation_metadata() or ()), request)
            except Exception:
                log.exception("gRPC on_request hook failed")

    # ------------------------------------------------------------------ ACL
    def acl_resources(self, method: str, request) -> dict:
        """PlainAccessResource.parse of a gRPC request (RocketMQ 5.0-5.2's acl module): the resources it names and
        the permission each needs (engine.broker.acl's bits; a group as its retry topic ``%RETRY%group``). Names are the
        plain names this endpoint registers (the resource namespace is not applied, as nowhere here); an empty name
        names nothing (the request is refused as illegal right after; RocketMQ would check ``%RETRY%`` for a
        producer's NotifyClientTermination, which names no group)."""
        from engine.broker.acl import ANY, PUB, SUB, retry_topic

        out: dict = {}

        def topic(resource, perm):
            if resource.name:
                out[resource.name] = perm

        def group(resource, perm):
            if resource.name:
                out[retry_topic(resource.name)] = perm

        d = self.p.d
        if method == "Heartbeat":
            if request.client_type in (d.ClientType.PUSH_CONSUMER, d.ClientType.SIMPLE_CONSUMER):
                group(request.group, SUB)
        elif method == "Telemetry":
            if request.WhichOneof("command") == "settings":
                st = request.settings
                if st.HasField("publishing"):
                    for t in st.publishing.topics[:MAX_SETTINGS_ENTRIES]:
                        topic(t, PUB)
                if st.HasField("subscription"):
                    group(st.subscription.group, SUB)
                    for entry in st.subscription.subscriptions[:MAX_SETTINGS_ENTRIES]:
                        topic(entry.topic, SUB)
        elif method == "QueryRoute":
            topic(request.topic, ANY)
        elif method in ("QueryAssignment", "AckMessage", "ForwardMessageToDeadLetterQueue",
                        "ChangeInvisibleDuration"):
            group(request.group, SUB)
            topic(request.topic, SUB)
        elif method == "ReceiveMessage":
            group(request.group, SUB)
            topic(request.message_queue.topic, SUB)
        elif method == "NotifyClientTermination":
            group(request.group, SUB)
        elif method == "SendMessage":
            if request.messages:
                topic(request.messages[0].topic, PUB)
        elif method == "EndTransaction":
            topic(request.topic, PUB)
        return out

    def authorize(self, method: str, request, context, authenticate_only: bool = False) -> None:
        """With aclEnable: the call's signature (``authorization``, ``x-mq-date-time``) and the resources the
        request names, against plain_acl.yml; _BadRequest UNAUTHORIZED / FORBIDDEN (the apache.rocketmq.v2 codes
        of an authentication and a permission failure) when refused."""
        acl = self.acl
        if acl is None:
            return
        from engine.broker.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, UNAUTHORIZED

        md = {}
        for key, value in context.invocation_metadata() or ():
            if key not in md and isinstance(value, str):
                md[key] = value
        host = peer_address(context.peer())
        host = host.rpartition(":")[0].strip("[]") if ":" in host else host
        resources = {} if authenticate_only else self.acl_resources(method, request)
        denied = acl.check_grpc(md.get(GRPC_AUTHORIZATION), md.get(GRPC_DATE_TIME), host, resources)
        if denied is not None:
            self.acl_denied += 1
            kind, remark = denied
            code = self.p.d.Code.UNAUTHORIZED if kind == UNAUTHORIZED else self.p.d.Code.FORBIDDEN
            raise _BadRequest(code, _short(remark, 200))

    def _status(self, code, message: str = ""):
        return self.p.d.Status(code=code, message=message or self.p.d.Code.Name(code))

    # ------------------------------------------------------------------ registration
    def _heartbeat_data(self, session: GrpcSession, group: str | None):
        """The HeartbeatData a session's Settings stand for (cached: a repeat is the registry's fast path)."""
        if session._hb is not None and session._hb_group == group:
            return session._hb
        from engine import ConsumerData, HeartbeatData, ProducerData, build_subscription

        d = self.p.d
        s = session.settings
        if session.client_type == d.ClientType.PRODUCER:
            hb = HeartbeatData(session.client_id, producers=[ProducerData(t.name) for t in s.publishing.topics])
        else:
            consume_type = (ConsumeType.CONSUME_ACTIVELY if session.client_type == d.ClientType.SIMPLE_CONSUMER
                            else ConsumeType.CONSUME_PASSIVELY)
            now = int(time.time() * 1000)
            subs = []
            for entry in s.subscription.subscriptions:
                expr = entry.expression
                kind = "SQL92" if expr.type == d.FilterType.SQL else "TAG"
                try:
                    subs.append(build_subscription(entry.topic.name, expr.expression, now, kind))
                except ValueError:
                    raise _BadRequest(d.Code.ILLEGAL_FILTER_EXPRESSION, "expression format is not correct") from None
            hb = HeartbeatData(session.client_id, consumers=[ConsumerData(
                group, consume_type, MessageModel.CLUSTERING, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subscriptions=subs)])
        session._hb, session._hb_group, session._hb_body, session._hb_repeat = hb, group, None, None
        return hb

    def _beat_data(self, session: GrpcSession, group: str | None):
        """The HeartbeatData a session's Heartbeat registers: ClientActivity.heartbeat registers the consumer with
        ``updateSubscription`` false, so its group keeps the subscriptions it has (only Settings change them; two
        members with different topic sets would otherwise flip the group's table, and its remoting members would
        be notified, at every heartbeat). Cached while the group and its subscriptions stay the same objects."""
        if session.client_type == self.p.d.ClientType.PRODUCER:
            return self._heartbeat_data(session, None)
        g = self.broker.registry.consumers.group_table.get(group)
        subs = tuple(g.subscriptions.values()) if g is not None else ()
        beat = session._beat
        if (beat is not None and beat[0] == group and beat[1] is g and len(beat[2]) == len(subs)
                and all(a is b for a, b in zip(beat[2], subs))):
            return beat[3]
        own = self._heartbeat_data(session, group)
        if len(own.consumers[0].subscriptions) == len(subs) and (
                {id(x) for x in own.consumers[0].subscriptions} == {id(x) for x in subs}):
            # the group's table is this session's own Settings (the usual case): the same HeartbeatData, so a
            # heartbeat after its Settings is a repeat of the registry's armed registration
            session._beat = (group, g, subs, own)
            return own
        from engine import ConsumerData, HeartbeatData

        d = self.p.d
        consume_type = (ConsumeType.CONSUME_ACTIVELY if session.client_type == d.ClientType.SIMPLE_CONSUMER
                        else ConsumeType.CONSUME_PASSIVELY)
        hb = HeartbeatData(session.client_id, consumers=[ConsumerData(
            group, consume_type, MessageModel.CLUSTERING, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            subscriptions=list(subs))])
        session._beat = (group, g, subs, hb)
        return hb

    def _register(self, session: GrpcSession, group: str | None, hb=None):
        """Register the session's Settings (``hb`` None) or its Heartbeat's HeartbeatData ``hb``; the recorder
        records the Settings' (what the client subscribes)."""
        d = self.p.d
        settings_hb = self._heartbeat_data(session, group)
        if hb is None:
            hb = settings_hb
        if self.broker.recorder is not None:
            self._record(session)
        result = self.broker.registry.heartbeat(session, hb, session.language, session.version)
        if result.code == ResponseCode.SUCCESS:
            return None
        if result.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
            return self._status(d.Code.CONSUMER_GROUP_NOT_FOUND, _short(result.remark or "", 120))
        return self._status(d.Code.INTERNAL_ERROR, _short(result.remark or "registration failed", 120))

    def _record(self, session: GrpcSession) -> None:
        """The recorder's record of a registering Settings / Heartbeat: the remoting heartbeat body of the same
        HeartbeatData (the scan reads both generations alike)."""
        if session._hb_body is None:
            from engine import encode_heartbeat

            session._hb_body = encode_heartbeat(session._hb)
        self.broker.recorder.record(int(time.time() * 1000), session.id, session.remote_addr, session.language,
                                    session.version, session._hb_body)

    def _update_settings(self, session: GrpcSession, settings) -> None:
        """ClientActivity.processAndWriteClientSettings: validate, register, keep the client's Settings."""
        d = self.p.d
        kind = settings.WhichOneof("pub_sub")
        if kind is None:
            raise _BadRequest(d.Code.BAD_REQUEST, "there is no publishing or subscription data in settings")
        group = None
        if kind == "publishing":
            if len(settings.publishing.topics) > MAX_SETTINGS_ENTRIES:
                raise _BadRequest(d.Code.BAD_REQUEST, f"more than {MAX_SETTINGS_ENTRIES} topics in settings")
            for topic in settings.publishing.topics:
                self._topic(topic)
            client_type = d.ClientType.PRODUCER
        else:
            group = self._group(settings.subscription.group)
            if len(settings.subscription.subscriptions) > MAX_SETTINGS_ENTRIES:
                raise _BadRequest(d.Code.BAD_REQUEST, f"more than {MAX_SETTINGS_ENTRIES} subscriptions in settings")
            for entry in settings.subscription.subscriptions:
                self._topic(entry.topic)
                # each tag is a string, a Java hash and set entries once decoded: at most so many per expression
                if entry.expression.expression.count("||") >= self.max_tags_per_subscription:
                    self._refuse("tags_per_subscription", "gRPC client %s (%s) refused: more than %d tags in a "
                                 "subscription", echo(session.client_id), echo(session.remote_addr),
                                 self.max_tags_per_subscription)
                    raise _BadRequest(d.Code.ILLEGAL_FILTER_EXPRESSION,
                                      f"more than {self.max_tags_per_subscription} tags in a subscription")
            client_type = settings.client_type
            if client_type not in (d.ClientType.PUSH_CONSUMER, d.ClientType.SIMPLE_CONSUMER):
                raise _BadRequest(d.Code.UNRECOGNIZED_CLIENT_TYPE, d.ClientType.Name(client_type)
                                  if client_type in d.ClientType.values() else "unknown client type")
        # the address's shares, checked before anything is decoded or registered
        groups = frozenset((("C", group),) if group is not None
                           else (("P", t.name) for t in settings.publishing.topics))
        cost = self.settings_cost_of(settings)
        self._check_shares(session, groups, cost)
        self._account(session, groups, cost)
        session.last_seen = time.monotonic()
        old = self.broker.registry.channel_groups(session)
        raw = settings.SerializeToString()
        if session.client_type != client_type or session.settings_raw != raw:
            # the same Settings again (the 5.x clients send them again on their own) keep the HeartbeatData: the
            # registry sees the same registration, and the Heartbeat repeat path stays armed
            session._hb = session._hb_repeat = session._beat = None
        session.settings_raw = raw
        session.client_type = client_type
        hb = self._heartbeat_data(session, group)
        new = ((cd.group for cd in hb.consumers), (pd.group for pd in hb.producers))
        if any(set(o) - set(n) for o, n in zip(old, new)):
            # groups the client left: it is registered anew with what it now has (the channel stays)
            self.broker.registry.close_channel(session)
        return self._register(session, group)

    def merged_settings(self, session: GrpcSession):
        """GrpcClientSettingsManager.getClientSettings: the client's Settings with the broker's values merged in."""
        d = self.p.d
        raw = session.settings
        if raw.HasField("publishing"):
            s = d.Settings()
            s.CopyFrom(raw)
            bp = s.backoff_policy
            bp.max_attempts = _PRODUCER_MAX_ATTEMPTS
            bp.exponential_backoff.initial.FromMilliseconds(_PRODUCER_BACKOFF_MS[0])
            bp.exponential_backoff.max.FromMilliseconds(_PRODUCER_BACKOFF_MS[1])
            bp.exponential_backoff.multiplier = _PRODUCER_BACKOFF_MS[2]
            s.publishing.validate_message_type = True
            s.publishing.max_body_size = self.max_message_bytes  # what the endpoint accepts
        else:
            # updateClientSettings: the defaults of a new SubscriptionGroupConfig, the client's values over them;
            # then getClientSettings merges the group's own config, when it has one
            s = d.Settings()
            self._merge_group(s, None)
            s.MergeFrom(raw)
            sgc = self.broker.registry.subscription_group_config(raw.subscription.group.name)
            if sgc is not None:
                self._merge_group(s, sgc)
        s.metric.Clear()
        s.metric.on = False  # metricCollectorMode OFF
        return s

    def _merge_group(self, s, sgc) -> None:
        """GrpcClientSettingsManager.mergeSubscriptionData."""
        sub = s.subscription
        sub.receive_batch_size = _CONSUMER_BATCH_SIZE
        sub.long_polling_timeout.FromMilliseconds(self.max_long_polling_ms)
        sub.fifo = bool(sgc.consume_message_orderly) if sgc is not None else False
        bp = s.backoff_policy
        bp.max_attempts = (int(sgc.retry_max_times) if sgc is not None else 16) + 1
        policy = (sgc.group_retry_policy if sgc is not None else None) or {}
        if str(policy.get("type", "CUSTOMIZED")).upper() == "EXPONENTIAL":
            exp = policy.get("exponentialRetryPolicy") or {}
            initial, maximum, mult = (int(exp.get(k, dflt)) for k, dflt in
                                      zip(("initial", "max", "multiplier"), _EXPONENTIAL_MS))
            bp.exponential_backoff.initial.FromMilliseconds(initial)
            bp.exponential_backoff.max.FromMilliseconds(maximum)
            bp.exponential_backoff.multiplier = mult
        else:
            nxt = (policy.get("customizedRetryPolicy") or {}).get("next") or _CUSTOMIZED_NEXT_MS
            bp.customized_backoff.Clear()
            for ms in list(nxt)[:64]:
                bp.customized_backoff.next.add().FromMilliseconds(int(ms))

    # ------------------------------------------------------------------ routes
    def _broker_message(self, request_endpoints):
        """This broker as a route's Broker: the address the client used (RouteActivity.convertToAddressList, with
        this endpoint's port), brokerIP1 when set, else 127.0.0.1."""
        d = self.p.d
        ep = d.Endpoints()
        cfg = self.broker.config
        if cfg.broker_ip1:
            ep.scheme = d.AddressScheme.IPv6 if ":" in cfg.broker_ip1 else d.AddressScheme.IPv4
            ep.addresses.add(host=cfg.broker_ip1, port=self.bound_port)
        elif request_endpoints is not None and request_endpoints.addresses:
            ep.scheme = request_endpoints.scheme or d.AddressScheme.IPv4
            for a in list(request_endpoints.addresses)[:MAX_ENDPOINT_ADDRESSES]:
                ep.addresses.add(host=a.host[:255], port=self.bound_port)
        else:
            ep.scheme = d.AddressScheme.IPv4
            ep.addresses.add(host="127.0.0.1", port=self.bound_port)
        return d.Broker(name=cfg.broker_name, id=0, endpoints=ep)

    def _topic_config(self, topic: str):
        """The topic's config; TOPIC_NOT_FOUND for an unknown topic, created by nobody: the proxy's route comes
        from the name server, which answers TOPIC_NOT_EXIST for a topic no broker registered (a route query
        proves nothing about its caller, so it creates nothing here)."""
        tc = self.broker.registry.topic_config(topic)
        if tc is None:
            raise _BadRequest(self.p.d.Code.TOPIC_NOT_FOUND, f"topic not found: {topic}")
        return tc

    def query_route(self, request):
        d = self.p.d
        topic = self._topic(request.topic)
        tc = self._topic_config(topic)
        broker = self._broker_message(request.endpoints if request.HasField("endpoints") else None)
        dflt = self.broker.config.default_topic_queue_nums
        reads = int(getattr(tc, "read_queue_nums", dflt)) if tc is not None else dflt
        writes = int(getattr(tc, "write_queue_nums", dflt)) if tc is not None else dflt
        perm = int(getattr(tc, "perm", _PERM_READ | _PERM_WRITE)) if tc is not None else _PERM_READ | _PERM_WRITE
        mtype = str(((getattr(tc, "attributes", None) or {}).get("message.type")
                     or (getattr(tc, "attributes", None) or {}).get("+message.type") or "NORMAL")).upper()
        accept = ([d.MessageType.NORMAL, d.MessageType.FIFO, d.MessageType.DELAY, d.MessageType.TRANSACTION]
                  if mtype == "MIXED" else [d.MessageType.Value(mtype) if mtype in d.MessageType.keys()
                                            else d.MessageType.MESSAGE_TYPE_UNSPECIFIED])
        # RouteActivity.genMessageQueueFromQueueData: read-only, write-only, read-write queues, ids in that order
        r = w = rw = n = 0
        readable, writable = bool(perm & _PERM_READ), bool(perm & _PERM_WRITE)
        if readable and writable:
            rw = min(reads, writes)
            r, w = reads - rw, writes - rw
        elif writable:
            w = writes
        elif readable:
            r = reads
        else:
            n = max(1, reads, writes)
        self._check_queues(r + w + rw + n, broker, request.topic)
        resp = self.p.s.QueryRouteResponse(status=self._status(d.Code.OK))
        qid = 0
        for count, permission in ((r, d.Permission.READ), (w, d.Permission.WRITE), (rw, d.Permission.READ_WRITE),
                                  (n, d.Permission.NONE)):
            for _ in range(count):
                q = resp.message_queues.add(id=qid, permission=permission, accept_message_types=accept)
                q.topic.CopyFrom(request.topic)
                q.broker.CopyFrom(broker)
                qid += 1
        return resp

    def _check_queues(self, count: int, broker, topic) -> None:
        """An answer listing ``count`` queues (each with the broker's endpoints and the topic) is built only when it
        fits grpcMaxMessageBytes: a topic given a huge queue count (readQueueNums is not bounded, as in 4.9.8)
        costs a route query an error, not the memory of an answer that could not be sent."""
        per_queue = broker.ByteSize() + topic.ByteSize() + 24  # the queue's id, permission, types and tags
        if count * per_queue > self.max_message_bytes:
            raise _BadRequest(self.p.d.Code.INTERNAL_ERROR, f"the route of {count} queues is larger than "
                              f"grpcMaxMessageBytes ({self.max_message_bytes})")

    def prepared_route(self, method: str, message: bytes, client_id: bytes | None) -> bytes | None:
        """The native transport's prepared answer of a QueryRoute / QueryAssignment (``method``): the serialized
        answer of the same request bytes while what it was read from is unchanged (the topic's config and the
        group's, the very objects: the tables replace a config to change it; brokerIP1), else built here and kept
        when it is OK; None (the handler runs and answers): ACL or the on_request hook in force (each call is
        checked or seen), a request without a valid client id, one that does not parse, or any answer but OK."""
        if self.acl is not None or self.on_request is not None:
            return None
        client_id = header_client_id(client_id)
        if not client_id or len(client_id) > MAX_CLIENT_ID:
            return None
        registry = self.broker.registry
        key = (method, message)
        kept = self._answers.get(key)
        if (kept is not None and kept[5] == self.broker.config.broker_ip1 and registry.topic_config(kept[1]) is kept[2]
                and (kept[3] is None or registry.subscription_group_config(kept[3]) is kept[4])):
            self.answer_cache_hits += 1
            return kept[0]
        group = None
        try:
            if method == "QueryRoute":
                request = self.p.s.QueryRouteRequest.FromString(message)
                response = self.query_route(request)
            else:
                request = self.p.s.QueryAssignmentRequest.FromString(message)
                response = self.query_assignment(request)
                group = request.group.name
        except Exception:  # _BadRequest, a parse error, a failure: the handler answers it in its words
            return None
        if response.status.code != self.p.d.Code.OK:
            return None
        answer = response.SerializeToString()
        if kept is not None:  # stale: out, whatever comes next
            del self._answers[key]
            self._answers_bytes -= len(message) + len(kept[0]) + 300
        cost = len(message) + len(answer) + 300  # the dict entry, the key and the entry's tuples, about
        # kept: a request of at most ANSWER_CACHE_MAX_REQUEST bytes whose answer can be sent (within
        # grpcMaxMessageBytes) and fits the budget on its own (a topic of many queues: answered, not kept)
        if (len(message) <= ANSWER_CACHE_MAX_REQUEST and len(answer) <= self.max_message_bytes
                and cost <= ANSWER_CACHE_BYTES // 16):
            if self._answers_bytes + cost > ANSWER_CACHE_BYTES:
                self._answers.clear()
                self._answers_bytes = 0
            topic = request.topic.name
            self._answers[key] = (answer, topic, registry.topic_config(topic), group,
                                  None if group is None else registry.subscription_group_config(group),
                                  self.broker.config.broker_ip1)
            self._answers_bytes += cost
        return answer

    def query_assignment(self, request):
        d = self.p.d
        topic = self._topic(request.topic)
        group = self._group(request.group)
        tc = self._topic_config(topic)
        reads = int(getattr(tc, "read_queue_nums", 0)) if tc is not None else self.broker.config.default_topic_queue_nums
        perm = int(getattr(tc, "perm", _PERM_READ | _PERM_WRITE)) if tc is not None else _PERM_READ | _PERM_WRITE
        if not perm & _PERM_READ or reads <= 0:
            return self.p.s.QueryAssignmentResponse(status=self._status(d.Code.FORBIDDEN, "no readable queue"))
        sgc = self.broker.registry.subscription_group_config(group)
        permission = d.Permission.READ_WRITE if perm & _PERM_WRITE else d.Permission.READ
        broker = self._broker_message(request.endpoints if request.HasField("endpoints") else None)
        orderly = sgc is not None and sgc.consume_message_orderly
        self._check_queues(reads if orderly else 1, broker, request.topic)
        resp = self.p.s.QueryAssignmentResponse(status=self._status(d.Code.OK))
        # RouteActivity.queryAssignment: a FIFO group gets every queue, any other one queue id -1 (the broker's
        # pop service picks the queue)
        for qid in (range(reads) if orderly else (-1,)):
            q = resp.assignments.add().message_queue
            q.topic.CopyFrom(request.topic)
            q.id = qid
            q.permission = permission
            q.broker.CopyFrom(broker)
        return resp


def _unsupported(name: str, response_type: str):
    async def handler(self, request, context):
        ep = self.ep
        ep.trace(name, request, context)
        make = getattr(ep.p.s, response_type)
        try:
            ep.authorize(name, request, context)
        except _BadRequest as e:
            return make(status=ep._status(e.code, e.message))
        ep.bad_requests += 1
        return make(status=ep._status(
            ep.p.d.Code.NOT_IMPLEMENTED, f"{name} is not supported by this broker (it has no message store)"))
    handler.__name__ = name
    return handler


class _Stream:
    """One Telemetry stream of a session; ``ended`` (:meth:`end`): its handler ends it (replaced, terminated,
    expired). ``peer``: its connection (grpc's ``context.peer()``, one per HTTP/2 connection), the session's owner;
    ``last_active``: time.monotonic() of the last command or call of the session from that connection;
    ``linger``: the timer ending it after its session was terminated (the client's to close it first).

    A held session's handler spends its life waiting (:meth:`arm`) for its next command, its end or its expiry
    check: one future and an entry in the endpoint's alarms (engine.alarms), where an asyncio.Event and
    asyncio.wait would hold a second task, the event's waiter deque, a set, callbacks and a timer (~3.5 KB a
    session)."""

    __slots__ = ("context", "ended", "wake", "tick", "peer", "last_active", "linger")

    def __init__(self, context):
        self.context = context
        self.ended = False
        self.wake = None  # the handler's wait, while it waits
        self.tick = None  # the wait's alarm
        self.peer = context.peer()
        self.last_active = time.monotonic()
        self.linger = None

    def end(self, _=None) -> None:
        """Its handler ends the stream."""
        self.ended = True
        self._wake()

    def _wake(self, _=None) -> None:
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    alarm = _wake  # engine.alarms

    def arm(self, reader: asyncio.Future, timeout: float, alarms):
        """A future done once ``reader`` is, the stream ends or ``timeout`` s pass (``alarms``: the endpoint's);
        the handler awaits it, then calls :meth:`disarm`."""
        wake = self.wake = reader.get_loop().create_future()
        reader.add_done_callback(self._wake)
        self.tick = alarms.set(self, timeout)
        return wake

    def disarm(self, reader: asyncio.Future, alarms) -> None:
        alarms.cancel(self, self.tick)
        reader.remove_done_callback(self._wake)
        self.wake = self.tick = None


class _Servicer:
    """MessagingService handlers: coroutines on the broker's loop. A bad request gets a status; a failure is logged
    and answered INTERNAL_ERROR "internal error" (never its text); neither stops the endpoint."""

    def __init__(self, endpoint: GrpcEndpoint):
        self.ep = endpoint

    async def _unary(self, response_type: str, fn, request, context):
        ep = self.ep
        make = getattr(ep.p.s, response_type)
        try:
            return await fn(request, context)
        except _BadRequest as e:
            ep.bad_requests += 1
            return make(status=ep._status(e.code, e.message))
        except asyncio.CancelledError:
            raise
        except Exception:
            ep.internal_error(response_type[:-8])
            return make(status=ep._status(ep.p.d.Code.INTERNAL_ERROR, "internal error"))

    # -- served
    async def QueryRoute(self, request, context):
        self.ep.trace("QueryRoute", request, context)
        async def run(request, context):
            self.ep.authorize("QueryRoute", request, context)
            self.ep._metadata(context)
            return self.ep.query_route(request)
        return await self._unary("QueryRouteResponse", run, request, context)

    async def QueryAssignment(self, request, context):
        self.ep.trace("QueryAssignment", request, context)
        async def run(request, context):
            self.ep.authorize("QueryAssignment", request, context)
            self.ep._metadata(context)
            return self.ep.query_assignment(request)
        return await self._unary("QueryAssignmentResponse", run, request, context)

    async def Heartbeat(self, request: bytes, context):
        """Registered with the serialized request in and the serialized answer out (GrpcEndpoint.start). A
        repeated Heartbeat is answered from the registry's repeat path (engine.broker.grpc_repeat; the native
        transport calls it as the method's ``prepared`` answer, without this coroutine); anything else takes the
        full path."""
        answer = self.ep.heartbeat_repeat.answer(request, _client_id(context), context.peer())
        return answer if answer is not None else await self._heartbeat(request, context)

    async def _heartbeat(self, raw: bytes, context):
        ep = self.ep
        try:
            request = ep.p.s.HeartbeatRequest.FromString(raw)
        except Exception:  # protobuf's DecodeError: grpc-java's words for it, never the parser's
            ep.bad_requests += 1
            await context.abort(ep.p.grpc.StatusCode.INTERNAL, "Invalid protobuf byte sequence")
        ep.trace("Heartbeat", request, context)

        async def run(request, context):
            d = ep.p.d
            ep.authorize("Heartbeat", request, context)
            session = ep._session(context, create=False)
            if session is None and ep.dormant:
                session = ep._restore(context)
            if session is None or session.settings_raw is None:
                return ep.p.s.HeartbeatResponse(status=ep._status(
                    d.Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"))
            group = added = None
            if session.client_type != d.ClientType.PRODUCER:
                group = ep._group(request.group)
                if ("C", group) not in session.groups:  # a group its Settings do not name: in the share too
                    added = session.groups | {("C", group)}
                    ep._check_shares(session, added, session.cost)
            session.last_seen = time.monotonic()
            beat = ep._beat_data(session, group)
            status = ep._register(session, group, beat)
            if added is not None and group in ep.broker.registry.channel_groups(session)[0]:
                ep._account(session, added, session.cost)  # counted once registered: one not taken holds none
            if status is not None:
                if session.stream is None and not any(ep.broker.registry.channel_groups(session)):
                    # no stream and nothing registered (a refused heartbeat of a session taken over): nothing
                    # would ever end it; the client's Settings make it a session again
                    ep.close_session(session, "heartbeat refused, no Telemetry stream", logging.DEBUG)
                return ep.p.s.HeartbeatResponse(status=status)
            token = ep.broker.registry.repeat_token(session, beat, session.language, session.version)
            session._hb_repeat = None if token is None else (raw, token)
            return ep._heartbeat_ok
        answer = await self._unary("HeartbeatResponse", run, request, context)
        return answer if isinstance(answer, bytes) else answer.SerializeToString()

    async def NotifyClientTermination(self, request, context):
        self.ep.trace("NotifyClientTermination", request, context)
        ep = self.ep

        async def run(request, context):
            d = ep.p.d
            ep.authorize("NotifyClientTermination", request, context)
            session = ep._session(context, create=False)
            if session is None and ep.dormant:
                ep.dormant.pop(ep._metadata(context)[0], None)  # it leaves before it was restored
            if session is None or session.settings_raw is None:
                return ep.p.s.NotifyClientTerminationResponse(status=ep._status(
                    d.Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"))
            registry = ep.broker.registry
            if session.client_type == d.ClientType.PRODUCER:
                for topic in session.settings.publishing.topics:
                    registry.unregister(session, session.client_id, producer_group=topic.name,
                                        language=session.language, version=session.version)
            else:
                group = ep._group(request.group)
                registry.unregister(session, session.client_id, consumer_group=group, language=session.language,
                                    version=session.version)
            # the proxy leaves the stream to the client, which closes it right after (reading an EOF the Python
            # client 5.1.2 would log as an error)
            ep.close_session(session, "NotifyClientTermination", end_stream=False)
            return ep.p.s.NotifyClientTerminationResponse(status=ep._status(d.Code.OK))
        return await self._unary("NotifyClientTerminationResponse", run, request, context)

    async def ReceiveMessage(self, request, context):
        self.ep.trace("ReceiveMessage", request, context)
        ep = self.ep
        d = ep.p.d
        try:
            ep.authorize("ReceiveMessage", request, context)
            ep._metadata(context)
            ep._group(request.group)
            ep._topic(request.message_queue.topic)
            remaining = context.time_remaining()
            remaining_ms = None if remaining is None else int(remaining * 1000)
            if request.HasField("long_polling_timeout"):
                polling = request.long_polling_timeout.ToMilliseconds()
            else:
                polling = (remaining_ms if remaining_ms is not None else ep.max_long_polling_ms) - 1_500
            polling = max(ep.min_long_polling_ms, min(polling, ep.max_long_polling_ms))
            if remaining_ms is not None and polling > remaining_ms:
                if remaining_ms < ep.min_long_polling_ms:
                    raise _BadRequest(d.Code.ILLEGAL_POLLING_TIME, "The deadline time remaining is not enough for "
                                                                  "polling, please check network condition")
                polling = remaining_ms
            try:
                await asyncio.wait_for(ep._stopping.wait(), polling / 1000.0)
            except asyncio.TimeoutError:
                pass
            status = ep._status(d.Code.MESSAGE_NOT_FOUND, "no new message")
        except _BadRequest as e:
            ep.bad_requests += 1
            status = ep._status(e.code, e.message)
        except asyncio.CancelledError:
            raise
        except Exception:
            ep.internal_error("ReceiveMessage")
            status = ep._status(d.Code.INTERNAL_ERROR, "internal error")
        await context.write(ep.p.s.ReceiveMessageResponse(status=status))

    async def PullMessage(self, request, context):
        self.ep.trace("PullMessage", request, context)
        ep = self.ep
        try:
            ep.authorize("PullMessage", request, context)
        except _BadRequest as e:
            await context.write(ep.p.s.PullMessageResponse(status=ep._status(e.code, e.message)))
            return
        ep.bad_requests += 1
        await context.write(ep.p.s.PullMessageResponse(status=ep._status(
            ep.p.d.Code.NOT_IMPLEMENTED, "PullMessage is not supported by this broker (it has no message store)")))

    async def _refuse_stream(self, context, error: _BadRequest) -> None:
        """Each command of a Telemetry stream that failed the ACL is answered with its status until the client
        ends the stream (no session), or grpcSettingsTimeoutMs after it opened: a stream that never has Settings
        accepted ends then, as the others without Settings."""
        ep = self.ep
        deadline = time.monotonic() + ep.settings_timeout_ms / 1000.0
        while True:
            try:
                command = await asyncio.wait_for(context.read(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                ep._refuse("settings_timeout", "gRPC Telemetry stream of %s ended: no Settings in %d ms",
                           echo(peer_address(context.peer())), ep.settings_timeout_ms)
                return
            if command is ep.p.aio.EOF:
                return
            ep.trace("Telemetry", command, context)
            await context.write(ep.p.s.TelemetryCommand(status=ep._status(error.code, error.message)))

    async def _fail(self, context, e: _BadRequest, prefix: str = ""):
        """A bad Telemetry command ends the stream with its status."""
        ep, p = self.ep, self.ep.p
        ep.bad_requests += 1
        code = (p.grpc.StatusCode.RESOURCE_EXHAUSTED if e.code == p.d.Code.TOO_MANY_REQUESTS
                else p.grpc.StatusCode.PERMISSION_DENIED if e.code == p.d.Code.FORBIDDEN
                else p.grpc.StatusCode.INVALID_ARGUMENT)
        await context.abort(code, prefix + e.message)

    def _attach(self, stream: _Stream, context, new):
        """``new``, the session of a Telemetry stream's client id, is the stream's now."""
        if new.stream is not None and new.stream is not stream:
            new.stream.end()  # a newer stream of the same client (same connection) replaces the older one
        if stream.linger is not None:  # Settings again after a termination: a session again
            stream.linger.cancel()
            stream.linger = None
        peer = context.peer()
        remote_addr = peer_address(peer)
        if peer != new.peer or remote_addr != new.remote_addr:  # taken on by another connection: it is there
            self.ep.move_session(new, remote_addr, peer)
        new.stream = stream
        return new

    async def Telemetry(self, request_iterator, context):
        """ClientActivity.telemetry: each Settings command registers the client and is answered with the merged
        Settings; a bad one ends the stream with INVALID_ARGUMENT; the stream's end removes the session.

        A stream is a session only once its Settings arrive (or when its client id has one: the stream takes it
        on): a stream without Settings after grpcSettingsTimeoutMs ends, and a session silent (no Settings, no
        Heartbeat) for channelExpiredTimeout ends with its stream. A stream presenting the client id of a session
        whose live stream is another connection's is refused (PERMISSION_DENIED), as are its Settings."""
        ep = self.ep
        p = ep.p
        session = None
        stream = _Stream(context)
        opened = time.monotonic()
        reader = None
        # (no closures here: a held session keeps this frame for its life)
        try:
            try:
                ep.authorize("Telemetry", None, context, authenticate_only=True)
            except _BadRequest as e:
                # the proxy answers every command of an unauthenticated stream with the status, registering nothing
                await self._refuse_stream(context, e)
                return
            try:
                session = ep._session(context, create=False)
                if session is not None:
                    self._attach(stream, context, session)
            except _BadRequest as e:
                await self._fail(context, e)
            while True:
                if reader is None:
                    reader = asyncio.ensure_future(context.read())
                now = time.monotonic()
                if session is None:
                    left = opened + ep.settings_timeout_ms / 1000.0 - now
                else:
                    left = session.last_seen + ep.broker.config.channel_expired_timeout / 1000.0 - now
                if left <= 0:
                    if session is None:  # never sent Settings: it holds no session, and now no stream
                        ep._refuse("settings_timeout", "gRPC Telemetry stream of %s ended: no Settings in %d ms",
                                   echo(peer_address(context.peer())), ep.settings_timeout_ms)
                        break
                    if session.closing:
                        break
                    if any(ep.broker.registry.channel_groups(session)):
                        left = 1.0  # registered: the housekeeping expires it (as any channel); looked at again
                    else:  # nothing for the housekeeping to expire (e.g. a refused registration): ended here
                        ep._refuse("idle_session", "gRPC client %s (%s) silent for channelExpiredTimeout: ended",
                                   echo(session.client_id), echo(session.remote_addr))
                        ep.close_session(session, "no Settings or Heartbeat within channelExpiredTimeout")
                        break
                # a held session's handler waits here for its life: it keeps no decoded command or answer (their
                # protobuf arenas, ~1.2 KB each)
                command = answer = status = None
                if reader.done():
                    # a command already queued: still one loop step each (a client's write packed with thousands
                    # of them must not hold the loop while they are handled)
                    await asyncio.sleep(0)
                elif not stream.ended:
                    wake = stream.arm(reader, left, ep.alarms)
                    try:
                        await wake
                    finally:
                        stream.disarm(reader, ep.alarms)
                if stream.ended:
                    break  # replaced, terminated or expired: end the stream
                if not reader.done():
                    continue  # the timeout: checked above
                command = reader.result()
                reader = None
                if command is p.aio.EOF:
                    break
                stream.last_active = time.monotonic()
                ep.trace("Telemetry", command, context)
                which = command.WhichOneof("command")
                if which != "settings":
                    continue  # thread stack traces, verify results: answers to commands this broker never sends
                try:
                    ep.authorize("Telemetry", command, context)
                except _BadRequest as e:  # settings naming a resource the account may not use: not applied
                    await context.write(p.s.TelemetryCommand(status=ep._status(e.code, e.message)))
                    continue
                try:
                    if session is None or session.closing:
                        # its first Settings (or Settings again after a termination): now it is a session
                        session = self._attach(stream, context, ep._session(context, create=True))
                    status = ep._update_settings(session, command.settings)
                except _BadRequest as e:
                    await self._fail(context, e, "process client telemetryCommand failed. ")
                answer = p.s.TelemetryCommand(status=status or ep._status(p.d.Code.OK),
                                              settings=ep.merged_settings(session))
                await context.write(answer)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if isinstance(e, p.aio.AbortError):
                raise
            ep.internal_error("Telemetry")
            await context.abort(p.grpc.StatusCode.INTERNAL, "internal error")
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            if stream.linger is not None:
                stream.linger.cancel()
            if session is not None and session.stream is stream and not session.closing:
                session.stream = None
                ep.close_session(session, "telemetry stream ended")


for _name, _resp in (("SendMessage", "SendMessageResponse"), ("AckMessage", "AckMessageResponse"),
                     ("ForwardMessageToDeadLetterQueue", "ForwardMessageToDeadLetterQueueResponse"),
                     ("UpdateOffset", "UpdateOffsetResponse"), ("GetOffset", "GetOffsetResponse"),
                     ("QueryOffset", "QueryOffsetResponse"), ("EndTransaction", "EndTransactionResponse"),
                     ("ChangeInvisibleDuration", "ChangeInvisibleDurationResponse"),
                     ("RecallMessage", "RecallMessageResponse"),
                     ("SyncLiteSubscription", "SyncLiteSubscriptionResponse")):
    setattr(_Servicer, _name, _unsupported(_name, _resp))
del _name, _resp


# ---------------------------------------------------------------------------------------------------------------
# captures of a client's requests, as protobuf text (tests/data/grpc; scripts/grpc_capture.py writes them)

#: request metadata a capture keeps (the signature, date and request id change with every request)
CAPTURE_METADATA = ("x-mq-client-id", "x-mq-language", "x-mq-client-version", "x-mq-protocol", "x-mq-namespace")


def format_capture(entries) -> str:
    """``[(method, metadata pairs, request message)]`` as text: per request a ``=== Method`` line, its kept
    metadata as ``key: value`` lines, ``---``, then the request in protobuf text format."""
    from google.protobuf import text_format

    out = []
    for method, metadata, request in entries:
        out.append(f"=== {method}")
        out.extend(f"{k}: {v}" for k, v in metadata if k in CAPTURE_METADATA)
        out.append("---")
        text = text_format.MessageToString(request, as_utf8=True)
        out.append(text.rstrip("\n"))
    return "\n".join(out) + "\n"


class CaptureError(RemotingError, ValueError):
    """A capture text :func:`parse_capture` cannot read (the message names the entry)."""


def parse_capture(text: str):
    """The entries of :func:`format_capture`'s text: ``[(method, metadata pairs, request message)]``.

    Entries start at lines beginning with ``=== `` (protobuf text format escapes line breaks inside strings, so no
    request line can); a malformed entry raises :class:`CaptureError`."""
    from google.protobuf import text_format

    p = load_protocol()
    request_types = {"Telemetry": p.s.TelemetryCommand}
    lines = text.splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith("=== ")]
    if any(line.strip() for line in lines[:starts[0] if starts else len(lines)]):
        raise CaptureError("capture: text before the first '=== <method>' line")
    entries = []
    for k, start in enumerate(starts):
        block = lines[start:starts[k + 1] if k + 1 < len(starts) else len(lines)]
        method = block[0][4:].strip()
        where = f"capture entry {k + 1} ({_short(method, 40)!r})"
        cls = request_types.get(method) or getattr(p.s, f"{method}Request", None)
        if cls is None or not method.isidentifier():
            raise CaptureError(f"{where}: not a MessagingService method")
        try:
            sep = block.index("---")
        except ValueError:
            raise CaptureError(f"{where}: no '---' line after the metadata") from None
        metadata = []
        for line in block[1:sep]:
            key, colon, value = line.partition(":")
            if not colon or not key.strip():
                raise CaptureError(f"{where}: metadata line without 'key: value'")
            metadata.append((key.strip(), value.strip()))
        try:
            request = text_format.Parse("\n".join(block[sep + 1:]), cls())
        except text_format.ParseError as e:
            raise CaptureError(f"{where}: {_short(e, 160)}") from None
        entries.append((method, tuple(metadata), request))
    return entries
