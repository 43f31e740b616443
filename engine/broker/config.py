"""BrokerConfig: the broker's settings under RocketMQ's property names, loaded like ``mqbroker -c broker.properties``.

Sources of a value, last one wins: the field default, the properties file (``-c``), command-line overrides
(``--listenPort 10911``). Property names are RocketMQ's (``BrokerConfig``, ``NettyServerConfig``,
``MessageStoreConfig``); a few settings of this engine that RocketMQ has no property for (connection limits,
metrics, the recorder) use the same camelCase style and are marked ``engine`` in :data:`PROPERTIES`.

Validation mirrors ``BrokerStartup.buildBrokerController``: the same messages for a malformed ``namesrvAddr`` and
for a slave without a positive ``brokerId``; a master's ``brokerId`` is forced to 0. Unlike Java, a value that does
not parse as its type is an error here (Java silently keeps the default).
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path

from engine.codec.errors import RemotingError, echo
from engine.broker.java_properties import JAVA_PROPERTIES


class ConfigError(RemotingError, ValueError):
    """A broker setting is missing, malformed or inconsistent; the message names the property."""


class ConfigFileError(ConfigError):
    """The properties file cannot be read (mqbroker: an exception in createBrokerController, exit -1)."""


def _default_broker_name() -> str:
    # BrokerConfig.defaultBrokerName(): the local host name, "DEFAULT_BROKER" when it cannot be read
    try:
        return socket.gethostname() or "DEFAULT_BROKER"
    except OSError:
        return "DEFAULT_BROKER"


@dataclass
class BrokerConfig:
    """Every setting of the broker front end. Attribute names are the property names in snake_case."""

    # -- identity (BrokerConfig) --
    #: cluster name in routes and REGISTER_BROKER
    broker_cluster_name: str = "DefaultCluster"
    #: broker name in routes (default: the host name)
    broker_name: str = field(default_factory=_default_broker_name)
    #: 0 = master (a master's brokerId is forced to 0)
    broker_id: int = 0
    #: MessageStoreConfig: ASYNC_MASTER or SYNC_MASTER (the same here: there is no slave to wait for); SLAVE is
    #: refused (no HA)
    broker_role: str = "ASYNC_MASTER"
    #: address put in routes and REGISTER_BROKER; empty: a route answer carries the local address its client
    #: connected to, and REGISTER_BROKER (and the boot line) `listenHost` when that names one address, else 4.9.8's
    #: default (`RemotingUtil.getLocalAddress`: the first IPv4 address of a non-loopback, non-bridge interface
    #: outside 127.0 and 192.168, else the last IPv4 one, else the first IPv6 one)
    broker_ip1: str = ""
    #: name servers, `host:port;host:port`; empty = this broker answers route queries itself
    namesrv_addr: str = ""
    #: ms between REGISTER_BROKER calls to the name servers (clamped to 10-60 s; the first at start, the periodic
    #: ones from +10 s; a new topic, e.g. a retry topic, is registered at once)
    register_name_server_period: int = 30_000
    #: directory of the persisted state (`config/topics.json`, `subscriptionGroup.json`, `consumerOffset.json`); default `~/store`
    store_path_root_dir: str = field(default_factory=lambda: str(Path.home() / "store"))
    #: engine: a store file whose every copy (file, .bak) is unusable is moved aside (`<name>.corrupt-<time>`) and
    #: the broker starts with that table empty; false (default): start-up fails naming the file, as Java's does
    store_recover_corrupt_files: bool = False
    # -- network (NettyServerConfig) --
    #: the main remoting port
    listen_port: int = 10911
    listen_host: str = "0.0.0.0"  # engine: bind address (Netty binds every interface)
    #: engine: also serve the fast/VIP port (listenPort - 2), as BrokerController.initializeRemotingServer does
    fast_port_enable: bool = True
    #: a connection with no traffic this long is closed
    server_channel_max_idle_time_seconds: int = 120
    # -- client management (BrokerConfig) --
    #: engine: 4 = Apache RocketMQ 4.9.8's client-management rules (a consumer whose group has no config is
    #: registered, BROADCASTING groups are notified, no heartbeat V2 and no ext fields in its answer); 5 = RocketMQ
    #: 5.1.3+ rules (such a consumer is answered SUCCESS and not registered, no CHANGE for BROADCASTING, heartbeat
    #: V2). docs/conformance.md
    client_management_rules: int = 4
    #: a client silent this long (ms) is removed by the expiry scan (every 10 s)
    channel_expired_timeout: int = 120_000
    #: create a consumer's missing subscription group on its first heartbeat
    auto_create_subscription_group: bool = True
    #: create missing `CID_RMQ_SYS_*` groups even with auto-create off
    enable_create_sys_group: bool = True
    #: broker-wide switch of NOTIFY_CONSUMER_IDS_CHANGED
    notify_consumer_ids_changed_enable: bool = True
    #: ignore pull (CONSUME_ACTIVELY) consumers in heartbeats
    reject_pull_consumer_enable: bool = False
    #: accept SQL92 subscriptions (CHECK_CLIENT_CONFIG)
    enable_property_filter: bool = False
    #: engine: lines of each kind of Java's client-management log (new consumer connected, subscription changed,
    #: NETTY EVENT, SCAN...) written per minute at most; past it they are counted and one line says how many were
    #: left out (0 = none of these lines)
    client_manage_log_lines_per_minute: int = 6000
    #: engine: bytes of Java's client-management lines (all kinds together, and the gRPC session-close lines)
    #: written per minute at most; past it they are counted as left out, as past the line budget (0 = none)
    client_manage_log_bytes_per_minute: int = 32 << 20
    #: engine: `java` = the log lines of `rmqhb serve` as 4.9.8's logback_broker.xml writes broker.log,
    #: `yyyy-MM-dd HH:mm:ss LEVEL THREAD - message` (whole seconds, GMT+8 whatever the machine's zone, the Java
    #: thread that would write it: HeartbeatThread_N, ClientManageThread_N, NettyEventExecutor...), for tools made
    #: for a Java broker's log; `rmqhb` = milliseconds, the local zone and the logger's name. docs/configuration.md:
    #: Java's client-management log lines
    log_format: str = "rmqhb"
    #: engine: directory where `rmqhb serve` also writes `broker.log` in the `logFormat` (Java's is
    #: `~/logs/rocketmqlogs`), rolled as logback's broker appender rolls it: at 128 MiB into
    #: `otherdays/broker.N.log.gz`, 20 kept; never through a symlink. "" = stderr only
    log_dir: str = ""
    #: engine: coalesce CHANGE notifications of one group within this window (0 = RocketMQ's real-time notify)
    notify_coalesce_window_ms: int = 0
    #: engine: auto-creation of subscription groups (by heartbeats) stops once the table holds this many groups;
    #: a consumer of a group that cannot be created is treated as one whose group has no config (0 = no limit)
    auto_create_max_subscription_groups: int = 10_000
    #: engine: auto-creation of topics (retry topics, route queries, sends) stops once the table holds this many
    #: topics (the start topics, TBW102 and the other system topics, not counted); a route query or send for a topic
    #: that cannot be created answers TOPIC_NOT_EXIST (0 = no limit)
    auto_create_max_topics: int = 20_000
    #: engine: topics that route queries and sends from one client address (an IPv4 address, an IPv6 /64) may
    #: auto-create, so that one host cannot fill `autoCreateMaxTopics` for everyone; past it that host's route
    #: query or send for a new topic answers TOPIC_NOT_EXIST (0 = no share)
    auto_create_topics_per_ip: int = 1024
    #: engine: topics the table may hold (all of them: start, auto-created, loaded and admin-created) for
    #: UPDATE_AND_CREATE_TOPIC (`rmqhb updateTopic`) to create a new one; past it that request answers SYSTEM_ERROR
    #: (an update of an existing topic still applies); without ACL the request proves nothing (0 = no limit)
    max_topic_configs: int = 100_000
    default_topic_queue_nums: int = 4  # RocketMQ defaults to 8; 4 halves the idle long polls of real clients
    #: register TBW102 (`defaultTopicQueueNums` queues, perm 7) at start: behind a name server the route a producer
    #: of a topic with no route uses to find this broker; standalone, a route query creates an unknown topic
    #: (false: TOPIC_NOT_EXIST)
    auto_create_topic_enable: bool = True
    #: the cluster-name topic (16 queues) at start is readable and writable (false: perm 1, inherit only)
    cluster_topic_enable: bool = True
    #: the broker-name topic (1 queue) at start is readable and writable (false: perm 1, inherit only)
    broker_topic_enable: bool = True
    #: register the trace topic `msgTraceTopicName` (1 queue) at start
    trace_topic_enable: bool = False
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"  # the trace topic registered with traceTopicEnable
    #: engine: committed consumer offsets held at once (one per group, topic and queue id, which the client
    #: chooses); a commit of a new one past it is answered SYSTEM_ERROR, existing ones still move (0 = no limit)
    max_consumer_offset_entries: int = 1_000_000
    #: ms between writes of `consumerOffset.json`
    flush_consumer_offset_interval: int = 5_000
    # -- executor queues (BrokerConfig *ThreadPoolQueueCapacity) --
    #: queue of CHECK_CLIENT_CONFIG (UNREGISTER_CLIENT is served inline, as heartbeats)
    client_manager_thread_pool_queue_capacity: int = 1_000_000
    #: queue of offset requests (GET_CONSUMER_LIST_BY_GROUP is served inline, as heartbeats)
    consumer_manager_thread_pool_queue_capacity: int = 1_000_000
    #: queue of admin requests (connection lists, locks, route queries)
    admin_broker_thread_pool_queue_capacity: int = 10_000
    #: queue of PULL_MESSAGE
    pull_thread_pool_queue_capacity: int = 100_000
    # -- fast failure (BrokerFastFailure): a queued request that waited longer than its limit is answered
    #    SYSTEM_BUSY "[TIMEOUT_CLEAN_QUEUE]..." instead of late; 0 = no limit --
    #: answer requests that waited too long in a queue with SYSTEM_BUSY instead of late
    broker_fast_failure_enable: bool = True
    #: longest wait of a pull in its queue (ms)
    wait_time_mills_in_pull_queue: int = 5_000
    #: engine: the limit of the client-manage, consumer-manage and admin queues (Java has none; its clients give
    #: up after their 3 s invoke timeout, so a later answer is wasted). Heartbeats, unregisters and consumer
    #: lists never queue.
    wait_time_mills_in_queue: int = 3_000
    # -- long polling --
    #: hold pulls that ask for it (PullSysFlag suspend) instead of answering at once
    long_polling_enable: bool = True
    #: engine: longest a PULL_MESSAGE is held (the client's suspendTimeoutMillis is capped at this)
    pull_max_suspend_millis: int = 30_000
    # -- rebalance locks (RebalanceLockManager) --
    #: engine: how long a queue lock of an orderly consumer lives without renewal (Java's system property
    #: -Drocketmq.broker.rebalance.lockMaxLiveTime, 60 s)
    rebalance_lock_max_live_time: int = 60_000
    #: engine: queue locks held at once across groups; a lock past it is not granted (the client retries)
    rebalance_lock_max_entries: int = 1_000_000
    # -- ACL --
    #: check every request's signature against `aclFile` (plain_acl.yml); on `grpcServerPort` the 5.x signature
    acl_enable: bool = False
    #: the plain_acl.yml of `aclEnable`
    acl_file: str = ""
    # -- limits (engine) --
    #: engine: connections at most, all listeners together (remoting ports, grpcServerPort's share
    #: grpcMaxConnections, metricsPort's 16); lowered to RLIMIT_NOFILE - 256 without ioWorkers
    max_connections: int = 100_000
    max_connections_per_ip: int = 0  # 0 = no per-IP limit
    #: I/O worker processes holding the client sockets (engine.broker.ioworker); 0 = socket I/O in the broker process.
    #: With N > 0 the connection limit is min(maxConnections, N x a worker's RLIMIT_NOFILE minus a reserve).
    io_workers: int = 0
    #: with ioWorkers > 0: connections the broker process serves itself (in-process I/O, the cheapest path: no
    #: relay) before it hands new ones to the workers; capped by its own RLIMIT_NOFILE. 0 = every connection goes
    #: to a worker. Workers then hold only what one process cannot (20k connections where RLIMIT_NOFILE is 20,000).
    io_core_connections: int = 0
    max_frame_size: int = 16 * 1024 * 1024  # com.rocketmq.remoting.frameMaxLength
    #: engine: bytes of partial (incomplete) frames buffered across all connections; the connection whose read
    #: passes it is closed (16 connections each sending a whole 16 MiB frame slowly fit in the default)
    max_partial_frame_bytes_total: int = 256 * 1024 * 1024
    #: engine: heartbeat bytes the connections keep after their reads, all together (each one's last heartbeat body
    #: with its decode, counted as what the decoded objects hold, a body not offered the repeat route, the armed
    #: repeat pattern); a heartbeat whose body or
    #: arming does not fit keeps nothing (decoded again next time, no repeat route): same answer, only slower.
    #: 0 = nothing kept, no repeat route
    max_heartbeat_cache_bytes_total: int = 256 * 1024 * 1024
    #: engine: decoded elements of one heartbeat body (tags, codes, subscriptions, consumer and producer groups) at
    #: most, so a body decodes to at most its size plus a bounded overhead per element; past it the heartbeat is
    #: answered SYSTEM_ERROR naming the element and not registered (a bad body: decode_errors_total{kind="heartbeat"})
    max_heartbeat_elements: int = 65_536
    #: engine: consumer lists (GET_CONSUMER_LIST_BY_GROUP) of groups of 64 or more members kept encoded for the
    #: next ask, all groups together, each counted as twice its encoded size (the ids kept to compare with): after
    #: a change every member of a group asks for the same list; the oldest kept lists make room, a list larger
    #: than the budget is not kept: same answer, only slower. 0 = none kept
    consumer_list_cache_bytes: int = 16 * 1024 * 1024
    #: a partial frame that is not complete after this long closes the connection (slowloris)
    incomplete_frame_timeout_ms: int = 30_000
    #: responses queued for a client that does not read them; over this the connection is closed
    max_write_buffer_bytes: int = 8 * 1024 * 1024
    #: a client whose unread responses stall our writes this long is disconnected (reading from it pauses meanwhile)
    write_stall_timeout_ms: int = 30_000
    #: requests of one connection waiting in executors; over this the server stops reading that connection
    max_inflight_per_connection: int = 1024
    #: engine: groups one channel may be registered in; the heartbeat that would pass it is answered SYSTEM_ERROR
    #: and changes nothing (a Java client instance registers a handful)
    max_groups_per_channel: int = 1024
    #: engine: live consumer and producer groups of the registry; a heartbeat that would create more is refused
    max_registered_groups: int = 100_000
    #: engine: (group, channel) registrations of all clients together; a heartbeat that would pass it is refused
    max_registered_memberships: int = 1 << 24
    # -- observability (engine) --
    #: engine: port of the Prometheus endpoint (GET /metrics); 0 = off
    metrics_port: int = 0
    #: engine: port of the gRPC endpoint of RocketMQ 5.x clients (the proxy's grpcServerPort; needs the grpc extra);
    #: 0 = off
    grpc_server_port: int = 0
    #: engine: the gRPC port's transport: "native" (engine.http2: HTTP/2 and gRPC on the broker's own loop, no grpc
    #: threads) or "grpcio" (grpc.aio, the reference twin)
    grpc_transport: str = "native"
    #: engine: PEM certificate (chain) of the gRPC port's TLS, with grpcTlsKeyPath (5.x SDKs such as Java's use TLS
    #: unless told otherwise; ALPN h2); "" = plaintext
    grpc_tls_cert_path: str = ""
    #: engine: PEM private key of grpcTlsCertPath's certificate
    grpc_tls_key_path: str = ""
    #: engine: gRPC client sessions (5.x client ids) at most; past it a new client's Telemetry stream ends
    #: RESOURCE_EXHAUSTED
    grpc_max_sessions: int = 100_000
    #: engine: connections the gRPC port holds at once, its share of maxConnections (at most half of what the
    #: descriptors allow); past it a new connection is closed at accept (connections_refused_total{grpc}; grpcio:
    #: grpc.max_allowed_incoming_connections, uncounted)
    grpc_max_connections: int = 10_000
    #: engine: gRPC calls in progress over all connections (grpc.aio maximum_concurrent_rpcs); past it
    #: RESOURCE_EXHAUSTED
    grpc_max_concurrent_rpcs: int = 200_000
    #: engine: HTTP/2 streams of one gRPC connection (grpc.max_concurrent_streams); past it the client waits
    grpc_max_streams_per_connection: int = 256
    #: engine: bytes of one gRPC message either way; past it RESOURCE_EXHAUSTED
    grpc_max_message_bytes: int = 4 * 1024 * 1024
    #: engine: bytes of one gRPC call's metadata (grpc.max_metadata_size); past it the call is refused
    grpc_max_metadata_bytes: int = 16 * 1024
    #: engine: gRPC sessions of one IP address at most (counted once their Settings arrive); past it a new client's
    #: Settings end its Telemetry stream RESOURCE_EXHAUSTED
    grpc_max_sessions_per_ip: int = 1024
    #: engine: gRPC sessions one connection creates at most (clients behind one address, a NAT, share its
    #: grpcMaxSessionsPerIp: one connection may not take it all); the 5.x SDKs open a connection per client, or,
    #: Go and grpcio, share one among the clients of a process: far fewer than this. Past it RESOURCE_EXHAUSTED
    grpc_max_sessions_per_connection: int = 256
    #: engine: distinct consumer and producer groups the gRPC sessions of one IP address register (a producer's
    #: topics are its groups); Settings or a Heartbeat that would pass it are refused RESOURCE_EXHAUSTED
    grpc_max_groups_per_ip: int = 4096
    #: engine: what the Settings of all gRPC sessions are counted to cost in memory, bytes (the decoded
    #: subscriptions and tags, not the wire size); Settings that would pass it are refused RESOURCE_EXHAUSTED.
    #: The default has room for grpcMaxSessions sessions counted ~6.7 KB each (an SDK's usual Settings are
    #: counted 4.8-5.2 KB)
    grpc_max_settings_bytes_total: int = 640 * 1024 * 1024
    #: engine: the same for the sessions of one IP address (its share of grpcMaxSettingsBytesTotal)
    grpc_max_settings_bytes_per_ip: int = 64 * 1024 * 1024
    #: engine: tags in one subscription's expression of a gRPC Settings; past it the Settings are refused
    #: INVALID_ARGUMENT
    grpc_max_tags_per_subscription: int = 1024
    #: engine: a gRPC Telemetry stream that has sent no Settings after this long is ended (it has no session and
    #: counts for none); a session silent (no Settings, no Heartbeat) past channelExpiredTimeout ends with its stream
    grpc_settings_timeout_ms: int = 30_000
    #: engine: a gRPC session whose Telemetry stream's connection has been silent (no Settings, Heartbeat or other
    #: call of the session) this long may be taken over by another connection of its client id (a client that
    #: reconnects after its connection died without a close; 3 x the 5.x clients' 10 s heartbeat interval); before
    #: it, another connection is refused FORBIDDEN / PERMISSION_DENIED
    grpc_session_takeover_silence_ms: int = 30_000
    #: engine: address of the Prometheus endpoint
    metrics_host: str = "127.0.0.1"
    #: engine: per-group series (group_clients / group_channels) on /metrics at most: the groups with the most
    #: clients are kept, the number left out is the group_series_dropped gauge
    metrics_max_group_series: int = 1000
    #: engine: directory of the heartbeat recording (zstd segments); "" = no recording
    record_dir: str = ""
    #: engine: blocks (of up to 4096 heartbeats) waiting for the recorder's writer thread; a block that finds the
    #: queue full is dropped and marked as lost in the recording (the heartbeats are still served)
    record_queue_blocks: int = 64
    #: engine: body bytes of one connection waiting for the recorder's writer at most; a heartbeat past it is
    #: recorded clipped (its first 1 KiB, its size and the reason), so one connection cannot fill the queue
    record_connection_share_bytes: int = 16 << 20
    #: engine: body bytes of all connections waiting for the recorder's writer at most (its queue's bytes: N
    #: connections have N shares); a heartbeat past it is recorded clipped; from 3/4 of it on, one of a connection
    #: at or above the connections' average of what waits is clipped, past 7/8 dropped (a gap marker), so a flood
    #: of connections cannot crowd out the others' records
    record_queue_bytes: int = 256 << 20
    #: names of the properties set explicitly (file or command line), for `-p` and for defaults that depend on them
    explicit: set = field(default_factory=set, repr=False, compare=False)
    #: properties this engine does not use (kept, as Java keeps them, so -p can show them)
    extra: dict = field(default_factory=dict, repr=False, compare=False)

    # ---- derived values ----
    @property
    def fast_listen_port(self) -> int:
        """The VIP port: listenPort - 2, or 0 (an ephemeral port) when that is negative, as in Java."""
        return max(0, self.listen_port - 2)

    @property
    def namesrv_addr_list(self) -> list[tuple[str, int]]:
        """(host, port) of each name server, split as Java does (``namesrvAddr.split(";")``: a trailing ``;`` is
        accepted); white space around a host is dropped here (Java keeps it and then cannot resolve the name)."""
        if not self.namesrv_addr.strip():
            return []
        return [_split_addr(a) for a in java_split(self.namesrv_addr, ";")]

    @property
    def store_config_dir(self) -> Path:
        return Path(self.store_path_root_dir) / "config"

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    # ---- loading ----
    @classmethod
    def load(cls, path: str | os.PathLike | None = None, overrides: dict | None = None,
             lenient: bool = False) -> "BrokerConfig":
        """Defaults, then the properties file, then the overrides (property name -> text); validated.
        ``lenient`` (``rmqhb serve --lenient-config``) keeps unknown property names instead of refusing them."""
        cfg = cls()
        if path:
            cfg.apply(read_properties(path), lenient)
        if overrides:
            cfg.apply(overrides, lenient)
        cfg.validate()
        return cfg

    def unused_properties(self) -> list[str]:
        """Properties that were set but that this broker does not use (Java's, or unknown ones when lenient)."""
        return sorted(self.extra)

    def java_unused_properties(self) -> list[str]:
        """Java broker properties that were set and that this broker accepts but does not use."""
        return sorted(n for n in self.extra if n in JAVA_PROPERTIES)

    def unknown_properties(self) -> list[str]:
        """Names kept by ``lenient`` that are neither this broker's nor Java's properties."""
        return sorted(n for n in self.extra if n not in JAVA_PROPERTIES)

    def apply(self, props: dict, lenient: bool = False) -> "BrokerConfig":
        """Set fields from a {propertyName: text} mapping; text is parsed by the field's type.

        A name that is neither this broker's nor one of Java's broker properties (JAVA_PROPERTIES) is an error
        naming the closest known property (a typo must not silently leave the default in force), unless
        ``lenient``; Java's properties this broker does not use are kept in ``extra`` (see unused_properties)."""
        for name, text in props.items():
            spec = PROPERTIES.get(name)
            if spec is None:
                if not lenient and name not in JAVA_PROPERTIES:
                    raise ConfigError(unknown_property_message(name))
                self.extra[name] = text
                continue
            setattr(self, spec.attr, spec.parse(name, text))
            self.explicit.add(name)
        return self

    def validate(self) -> "BrokerConfig":
        """BrokerStartup's checks, with its messages where it has one."""
        if self.namesrv_addr.strip():  # StringUtils.isNotBlank
            try:
                for addr in java_split(self.namesrv_addr, ";"):
                    _java_socket_address(addr)
            except ValueError:
                raise ConfigError(
                    f"The Name Server Address[{self.namesrv_addr}] illegal, please set it as follows, "
                    '"127.0.0.1:9876;192.168.0.1:9876"'
                ) from None
        if self.client_management_rules not in (4, 5):
            raise ConfigError(f"clientManagementRules must be 4 or 5, not {self.client_management_rules}")
        if self.client_management_rules == 4 and self.reject_pull_consumer_enable:
            raise ConfigError("rejectPullConsumerEnable is a RocketMQ 5.x setting (4.9 has none): it needs "
                              "clientManagementRules=5")
        if self.log_format not in ("rmqhb", "java"):
            raise ConfigError(f"logFormat must be rmqhb or java, not {echo(self.log_format)}")
        if self.grpc_transport not in ("grpcio", "native"):
            raise ConfigError(f"grpcTransport must be grpcio or native, not {echo(self.grpc_transport)}")
        if bool(self.grpc_tls_cert_path) != bool(self.grpc_tls_key_path):
            raise ConfigError("grpcTlsCertPath and grpcTlsKeyPath go together (both set: TLS; neither: plaintext)")
        if self.broker_role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
            raise ConfigError(f"brokerRole must be ASYNC_MASTER, SYNC_MASTER or SLAVE, not {echo(self.broker_role)}")
        if self.broker_role in ("ASYNC_MASTER", "SYNC_MASTER"):
            self.broker_id = 0  # MixAll.MASTER_ID
        elif self.broker_id <= 0:
            raise ConfigError("Slave's brokerId must be > 0")
        else:
            # a slave replicates a master's message store over HA; this broker has neither, and a slave that served
            # clients as this broker does would register as one more master of its broker name
            raise ConfigError("brokerRole=SLAVE is not supported: this broker has no HA (no message store to "
                              "replicate); run it as ASYNC_MASTER or SYNC_MASTER (brokerId 0)")
        for name in ("enableDLegerCommitLog", "enableControllerMode"):
            if str(self.extra.get(name, "")).strip().lower() == "true":
                # DLedger / the controller elect a node's role (it may become a slave): the same HA this broker lacks
                raise ConfigError(f"{name}=true is not supported: this broker has no HA (roles are not elected "
                                  "here); remove it and run the broker as ASYNC_MASTER or SYNC_MASTER")
        for name in ("listenPort", "metricsPort", "grpcServerPort"):
            v = getattr(self, PROPERTIES[name].attr)
            if not 0 <= v <= 65535:
                raise ConfigError(f"{name} must be between 0 and 65535, not {v}")
        if self.metrics_port and self.metrics_port in (self.listen_port, self.fast_listen_port):
            raise ConfigError(f"metricsPort {self.metrics_port} collides with the broker's ports")
        positive = ("channelExpiredTimeout", "maxConnections", "maxFrameSize", "incompleteFrameTimeoutMs",
                    "maxWriteBufferBytes", "writeStallTimeoutMs", "maxInflightPerConnection", "serverChannelMaxIdleTimeSeconds",
                    "defaultTopicQueueNums", "pullMaxSuspendMillis", "flushConsumerOffsetInterval",
                    "grpcMaxSessions", "grpcMaxConcurrentRpcs", "grpcMaxStreamsPerConnection", "grpcMaxConnections",
                    "grpcMaxSessionsPerIp", "grpcMaxSessionsPerConnection", "recordQueueBytes",
                    "grpcMaxGroupsPerIp", "grpcMaxSettingsBytesTotal",
                    "grpcMaxSettingsBytesPerIp", "grpcMaxTagsPerSubscription", "grpcSettingsTimeoutMs",
                    "grpcSessionTakeoverSilenceMs", "maxHeartbeatElements")
        for name in positive:
            if getattr(self, PROPERTIES[name].attr) <= 0:
                raise ConfigError(f"{name} must be > 0")
        for name in ("maxConnectionsPerIp", "notifyCoalesceWindowMs", "clientManageLogLinesPerMinute", "clientManageLogBytesPerMinute",
                     "waitTimeMillsInPullQueue",
                     "waitTimeMillsInQueue", "ioWorkers", "ioCoreConnections", "maxHeartbeatCacheBytesTotal",
                     "consumerListCacheBytes", "recordConnectionShareBytes", "autoCreateTopicsPerIp"):
            if getattr(self, PROPERTIES[name].attr) < 0:
                raise ConfigError(f"{name} must be >= 0")
        from engine.registry.client_registry import (MAX_CHANNEL_EXPIRED_TIMEOUT_MS, MAX_GROUPS_PER_CHANNEL,
                                                     RegistryConfig)
        if self.channel_expired_timeout > MAX_CHANNEL_EXPIRED_TIMEOUT_MS:
            raise ConfigError(f"channelExpiredTimeout must be at most {MAX_CHANNEL_EXPIRED_TIMEOUT_MS} ms")
        if not 1 <= self.max_groups_per_channel <= MAX_GROUPS_PER_CHANNEL:
            raise ConfigError(f"maxGroupsPerChannel must be between 1 and {MAX_GROUPS_PER_CHANNEL}")
        if not 1 <= self.max_registered_groups <= 1 << 30:
            raise ConfigError("maxRegisteredGroups must be between 1 and 1073741824")
        if not 1 <= self.max_registered_memberships <= 0x7FFFFFFF:
            raise ConfigError("maxRegisteredMemberships must be between 1 and 2147483647")

        # every connection and gRPC session is a channel of the registry's table: both budgets together must fit
        # its slots, so the table's own budget (ChannelTableError) is never what refuses a client
        slots = RegistryConfig.max_channels
        if self.max_connections + self.grpc_max_sessions > slots:
            raise ConfigError(f"maxConnections + grpcMaxSessions must be at most {slots} (the slots of the "
                              f"registry's channel table), not {self.max_connections + self.grpc_max_sessions}")
        if not 64 * 1024 <= self.grpc_max_message_bytes <= 0x7FFFFFFF:
            raise ConfigError("grpcMaxMessageBytes must be between 65536 and 2147483647")
        if not 1024 <= self.grpc_max_metadata_bytes <= 1024 * 1024:  # the x-mq-* headers and a signature fit 1 KiB
            raise ConfigError("grpcMaxMetadataBytes must be between 1024 and 1048576")
        if not 16 <= self.max_frame_size <= 0x7FFFFFFF:
            raise ConfigError("maxFrameSize must be between 16 and 2147483647")
        # BrokerController clamps the registration period to [10 s, 60 s]
        self.register_name_server_period = max(10_000, min(self.register_name_server_period, 60_000))
        if self.broker_ip1:
            try:
                ipaddress.ip_address(self.broker_ip1)
            except ValueError:
                raise ConfigError(f"brokerIP1 must be an IP literal (clients match routes by ip:port), not {echo(self.broker_ip1)}") from None
        if self.acl_enable and not self.acl_file:
            raise ConfigError("aclEnable=true needs aclFile (a plain_acl.yml accounts file)")
        if self.acl_enable and not Path(self.acl_file).is_file():
            raise ConfigError(f"aclFile {self.acl_file} does not exist")
        return self

    # ---- printing ----
    def to_properties(self) -> list[tuple[str, str]]:
        """(propertyName, text) for every setting, in declaration order, like MixAll.printObjectProperties."""
        out = []
        for name, spec in PROPERTIES.items():
            out.append((name, spec.format(getattr(self, spec.attr))))
        out.extend(sorted(self.extra.items()))
        return out

    def __repr__(self) -> str:
        return "BrokerConfig(" + ", ".join(f"{k}={v}" for k, v in self.to_properties() if k in self.explicit) + ")"


# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    attr: str
    kind: type

    def parse(self, name: str, text):
        if not isinstance(text, str):
            text = str(text).lower() if isinstance(text, bool) else str(text)
        if self.kind is bool:
            # Boolean.parseBoolean: only a case-insensitive "true" is true; anything else is an error here
            t = text.strip().lower()
            if t not in ("true", "false"):
                raise ConfigError(f"{name} must be true or false, not {echo(text)}")
            return t == "true"
        if self.kind is int:
            return _java_int(name, text, name in LONG_PROPERTIES)
        return text.strip()  # MixAll.properties2Object trims strings (and only strings)

    def format(self, value) -> str:
        if self.kind is bool:
            return "true" if value else "false"
        return str(value)


#: properties that are a Java ``long`` (Long.parseLong); every other int property is an ``int`` (Integer.parseInt)
LONG_PROPERTIES = frozenset({"channelExpiredTimeout", "waitTimeMillsInPullQueue", "brokerId",
                             "maxPartialFrameBytesTotal", "maxHeartbeatCacheBytesTotal",
                             "rebalanceLockMaxLiveTime"})


def _java_int(name: str, text: str, long: bool) -> int:
    """Integer.parseInt / Long.parseLong: an optional sign, then ASCII digits only (no spaces, underscores or
    other scripts' digits), in range. Java's broker silently keeps the default for a value it cannot parse; here
    it is an error."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not (digits.isascii() and digits.isdigit()):
        kind = "a long (Long.parseLong)" if long else "an integer (Integer.parseInt)"
        raise ConfigError(f"{name} must be {kind}, not {echo(text)}")
    value = int(text)
    bits = 63 if long else 31
    if not -(1 << bits) <= value < (1 << bits):
        raise ConfigError(f"{name} is out of range for a Java {'long' if long else 'int'}: {echo(text)}")
    return value


def _camel(attr: str) -> str:
    head, *rest = attr.split("_")
    name = head + "".join(w[:1].upper() + w[1:] for w in rest)
    return _CAMEL_FIXUPS.get(name, name)


_CAMEL_FIXUPS = {"brokerIp1": "brokerIP1"}

#: propertyName -> how to parse it; the order is the declaration order of BrokerConfig.
PROPERTIES: dict[str, _Spec] = {
    _camel(f.name): _Spec(f.name, {"bool": bool, "int": int, "str": str}[f.type])
    for f in fields(BrokerConfig)
    if f.name not in ("explicit", "extra")
}

#: Short RocketMQ command-line options (ServerUtil / BrokerStartup): -n namesrvAddr.
SHORT_OPTIONS = {"-n": "namesrvAddr"}


def unknown_property_message(name: str, prefix: str = "property ") -> str:
    close = difflib.get_close_matches(name, list(PROPERTIES) + sorted(JAVA_PROPERTIES), n=1, cutoff=0.75)
    hint = f": did you mean {close[0]}?" if close else " (not a property of this broker or of RocketMQ's)"
    return f"unknown {prefix}{echo(name)[1:-1] if len(name) <= 64 else echo(name)}{hint}"


def java_split(text: str, sep: str) -> list[str]:
    """Java's ``String.split(sep)`` for a literal one-character separator: trailing empty strings are removed
    (``"a;b;"`` -> ``["a", "b"]``, ``"a;;b"`` keeps the empty one)."""
    parts = text.split(sep)
    if len(parts) == 1:
        return parts
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _java_socket_address(addr: str) -> None:
    """What BrokerStartup checks of each name server (NetworkUtil.string2SocketAddress): a ':' (the host is what
    precedes the last one, any text), then a port Integer.parseInt reads (no white space) within 0-65535
    (InetSocketAddress). ValueError otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise ValueError(f"no port in {addr!r}")
    digits = port[1:] if port[:1] in ("+", "-") else port
    if not digits or not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"port is not an int in {addr!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port out of range in {addr!r}")


def _split_addr(addr: str) -> tuple[str, int]:
    """NetworkUtil.string2SocketAddress: host before the last ':', an int port in range after it."""
    _java_socket_address(addr)
    host, _, port = addr.rpartition(":")
    host = host.strip().strip("[]")
    return host or "127.0.0.1", int(port)  # InetAddress.getByName("") is the loopback address


# ---------------------------------------------------------------------------------------------------------------
# java.util.Properties text format


def read_properties(path: str | os.PathLike) -> dict[str, str]:
    """Parse a .properties file the way java.util.Properties.load does (ISO-8859-1 is widened to UTF-8 here)."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e.strerror}") from None
    return parse_properties(text)


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Comments (# !), separators (= : whitespace), continuation lines, backslash and \\uXXXX escapes."""
    out: dict[str, str] = {}
    lines = _LINE_BREAK.split(text)  # Java's LineReader ends lines at \n, \r and \r\n only (not \u2028, \x85, ...)
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        # join continuation lines: an odd number of trailing backslashes continues the logical line
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        out[_unescape(key)] = _unescape(value)
    return out


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEX = frozenset("0123456789abcdefABCDEF")


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c in "=: \t\f":
            break
        j += 1
    key, rest = line[:j], line[j:]
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    else:  # the key ended at whitespace: one '=' or ':' may still follow it
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
    return key, rest.lstrip(" \t\f")


def _unescape(s: str) -> str:
    """Properties.loadConvert: ``\\uXXXX`` (exactly four hex digits, else "Malformed \\uxxxx encoding." as Java
    throws), ``\\t \\n \\r \\f``, and a backslash before any other character stands for that character. Escaped
    UTF-16 surrogate pairs join into one character."""
    if "\\" not in s:
        return s
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\" or i + 1 >= len(s):
            out.append(c)
            i += 1
            continue
        n = s[i + 1]
        if n == "u":
            hex4 = s[i + 2 : i + 6]
            if len(hex4) < 4 or not _HEX.issuperset(hex4):
                raise ConfigError(f"Malformed \\uxxxx encoding in {echo(s)}")
            out.append(chr(int(hex4, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(n, n))
        i += 2
    text = "".join(out)
    # (char) code units as Java builds them: a pair of escaped surrogates is one character
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def parse_overrides(argv: list[str], lenient: bool = False) -> dict[str, str]:
    """``--listenPort 10911`` / ``--listenPort=10911`` / ``-n ADDR`` pairs into {propertyName: text}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in SHORT_OPTIONS:
            name, value = SHORT_OPTIONS[arg], None
        elif arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq:
                value = None
        else:
            raise ConfigError(f"unexpected argument {echo(arg)}")
        if name not in PROPERTIES and name not in JAVA_PROPERTIES and not lenient:
            raise ConfigError(unknown_property_message(name, "option --"))
        if value is None:
            if i + 1 >= len(argv):
                raise ConfigError(f"option --{name} needs a value")
            value = argv[i + 1]
            i += 1
        out[name] = value
        i += 1
    return out
