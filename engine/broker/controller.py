"""engine.Broker: the embeddable broker front end (BrokerController's initialize/start/shutdown for this engine).

    import engine
    broker = engine.Broker(engine.BrokerConfig(listen_port=10911)).start()   # serves on a background thread
    ...
    broker.stop()                                                             # persists state, closes clients

In an asyncio program use ``await broker.start_async()`` / ``await broker.stop_async()`` on your own loop.
``rmqhb serve -c broker.properties`` runs :func:`serve_main`, which adds signal handling (SIGTERM/SIGINT:
graceful shutdown that persists state).

What runs once started (BrokerController.start): the main and fast ports; the client housekeeping (expiry scan
every 10 s, first after 10 s; expired connections are closed); consumer-offset persistence every
``flushConsumerOffsetInterval``; NOTIFY_CONSUMER_IDS_CHANGED pushed to a group's connections on CHANGE events;
REGISTER_BROKER to every configured name server at start, then at a fixed rate every ``registerNameServerPeriod``
from +10 s, and at once (coalesced) when a topic appears, e.g. a new retry topic (without a name server the broker
answers route queries itself); the Prometheus endpoint with ``metricsPort``; the heartbeat
recorder with ``recordDir``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
import zlib

from engine import RemotingCommand
from engine.registry import clientlog
from engine.registry.clientlog import JavaLogFormatter
from engine.broker.config import PROPERTIES, BrokerConfig, ConfigError, ConfigFileError, parse_overrides
from engine.codec.errors import clip
from engine.codec.enums import BROKER_VERSION, RequestCode, ResponseCode
from engine.broker.ioworker import new_event_loop
from engine.broker.metrics import Metrics, MetricsEndpoint, render
from engine.broker.processors import NAMESRV_TABLE, PROCESSOR_TABLE, Processors
from engine.registry.rebalance import RebalanceLockManager
from engine.broker.server import RemotingServer
from engine.broker.shares import share_key as auto_create_share_key  # an IPv4 address, an IPv6 /64

log = logging.getLogger("engine.broker.controller")

#: exit statuses of `rmqhb serve`, as mqbroker's (BrokerStartup): System.exit(-3) = 253 for a configuration that
#: cannot run (an illegal namesrvAddr, a slave's brokerId; here also any property error) and for a failed
#: initialize() (store files that do not load); System.exit(-1) = 255 for a bad command line, an unreadable
#: config file and a failed start (a port in use)
EXIT_CONFIG = 253
EXIT_FAILURE = 255

#: Executors and their queue capacities (BrokerConfig *ThreadPoolQueueCapacity); None = inline.
def _executor_capacities(cfg: BrokerConfig) -> dict:
    return {
        "inline": None,
        "client_manage": cfg.client_manager_thread_pool_queue_capacity,
        "consumer_manage": cfg.consumer_manager_thread_pool_queue_capacity,
        "pull": cfg.pull_thread_pool_queue_capacity,
        "admin": cfg.admin_broker_thread_pool_queue_capacity,
    }


_TOPIC_CHARS = frozenset("%|_-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def valid_topic_name(topic: str) -> bool:
    """TopicValidator: 1-127 characters of ``[%|a-zA-Z0-9_-]``."""
    return 0 < len(topic) <= 127 and _TOPIC_CHARS.issuperset(topic)


def _validate_topic(topic: str):
    """TopicValidator.validateTopic (4.9.8): None, or its refusal as (code, remark)."""
    if not topic or not topic.strip():
        return ResponseCode.SYSTEM_ERROR, "The specified topic is blank."
    if not _TOPIC_CHARS.issuperset(topic):
        return (ResponseCode.SYSTEM_ERROR,
                "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$")
    if len(topic) > 127:
        return ResponseCode.SYSTEM_ERROR, "The specified topic is longer than topic max length."
    return None


#: TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET (4.9.8)
NOT_ALLOWED_SEND_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                     "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})


class Broker:
    """The broker front end: registry + remoting server + housekeeping, started and stopped as one."""

    def __init__(self, config: BrokerConfig | None = None, *, registry=None, namesrv_timers=None):
        """``namesrv_timers``: ``(clock, sleep)`` of the name-server registration schedule (tests drive it; default
        ``(time.monotonic, asyncio.sleep)``)."""
        self.config = config if config is not None else BrokerConfig()
        self._namesrv_timers = namesrv_timers
        self._local_ip = None  # brokerIP1's default (local_address), read once when first needed
        self.config.validate()
        self.metrics = Metrics()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ports: dict[str, int] = {}
        self.registry = registry if registry is not None else self._build_registry()
        self._add_system_topics()
        #: topics auto-created by route queries and sends, per client address share key (auto_create_share_key):
        #: at most autoCreateTopicsPerIp each; an entry exists only for an address that created one, so the table
        #: holds at most autoCreateMaxTopics entries
        self._auto_created_topics: dict[str, int] = {}
        self.acl = None
        if self.config.acl_enable:
            from engine.broker.acl import AclValidator

            self.acl = AclValidator.from_file(self.config.acl_file)
            self.acl.max_heartbeat_elements = self.config.max_heartbeat_elements
            log.info("ACL enabled with %d accounts from %s", len(self.acl.accounts), self.config.acl_file)
        self.recorder = None
        if self.config.record_dir:
            from engine.recording.recorder import HeartbeatRecorder

            # its own thread compresses and writes: recording never blocks the loop or fails a heartbeat
            self.recorder = HeartbeatRecorder(self.config.record_dir, background=True,
                                              queue_blocks=self.config.record_queue_blocks,
                                              connection_share_bytes=self.config.record_connection_share_bytes,
                                              queue_bytes=self.config.record_queue_bytes)
        namesrv_codes = frozenset(int(c) for c, _, _ in NAMESRV_TABLE)
        # the name-server role does no ACL (as a RocketMQ name server), so a refused client still finds the broker
        self.server = RemotingServer(self.config, self.metrics, on_close=self._on_connection_closed, acl=self.acl,
                                     acl_exempt=namesrv_codes)
        # repeated heartbeats skip the full path's per-request work: only when it has none to do (no recording,
        # no ACL signature to check on every request)
        self.server.repeats = self.acl is None and self.recorder is None
        self.rebalance_lock_manager = RebalanceLockManager(self.config.rebalance_lock_max_live_time,
                                                           self.config.rebalance_lock_max_entries,
                                                           client_log=getattr(self.registry, "client_log", None))
        self.processors = Processors(self)
        caps = _executor_capacities(self.config)
        table = PROCESSOR_TABLE + (NAMESRV_TABLE if not self.config.namesrv_addr.strip() else ())
        #: logFormat=java: each task's lines carry the Java thread that would run it (clientlog.java_threads); a
        #: wrapped heartbeat handler takes the Python path (the native one serves the broker's own handler only)
        self._java_threads = clientlog.java_threads if self.config.log_format == "java" else None
        for code, name, executor in table:
            handler = getattr(self.processors, name)
            if self._java_threads is not None:
                handler = self._java_threads.handler(code, handler)
            self.server.register_processor(code, handler, self.server.executor(executor, caps[executor]))
        self._tasks: list[asyncio.Task] = []
        self._metrics_endpoint: MetricsEndpoint | None = None
        self.grpc = None  # engine.broker.grpc_endpoint.GrpcEndpoint with grpcServerPort (RocketMQ 5.x clients)
        self._namesrv = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopped = False
        self._notify_opaque = 0

    # ------------------------------------------------------------------ registry wiring
    def _build_registry(self):
        from engine.registry.client_registry import ClientRegistry, ConsumerGroupEvent, RegistryConfig
        from engine.registry.store import Store

        cfg = self.config
        rc = RegistryConfig(
            channel_expired_timeout_ms=cfg.channel_expired_timeout,
            auto_create_subscription_group=cfg.auto_create_subscription_group,
            enable_create_sys_group=cfg.enable_create_sys_group,
            notify_consumer_ids_changed_enable=cfg.notify_consumer_ids_changed_enable,
            reject_pull_consumer_enable=cfg.reject_pull_consumer_enable,
            enable_property_filter=cfg.enable_property_filter,
            notify_coalesce_window_ms=cfg.notify_coalesce_window_ms,
            client_management_rules=cfg.client_management_rules,
            client_log_lines_per_minute=cfg.client_manage_log_lines_per_minute,
            client_log_bytes_per_minute=cfg.client_manage_log_bytes_per_minute,
            max_groups_per_channel=cfg.max_groups_per_channel,
            max_groups=cfg.max_registered_groups,
            max_memberships=cfg.max_registered_memberships,
        )
        # timed writes (auto-created config, offsets) go to the store's writer thread: no fsync on the loop
        store = Store(cfg.store_path_root_dir, background_writes=True,
                      auto_create_max_groups=cfg.auto_create_max_subscription_groups,
                      auto_create_max_topics=cfg.auto_create_max_topics,
                      max_offset_entries=cfg.max_consumer_offset_entries,
                      recover_corrupt=cfg.store_recover_corrupt_files)
        # only CHANGE matters here: leaving REGISTER out keeps the heartbeat path free of event objects
        return ClientRegistry(config=rc, listener=self._on_registry_event, store=store,
                              events={ConsumerGroupEvent.CHANGE})

    def _add_system_topics(self) -> None:
        """TopicConfigManager's constructor: the topics a 4.9.8 broker has from its start (TBW102 with
        autoCreateTopicEnable, the cluster- and broker-name topics, SELF_TEST_TOPIC, ...); the first REGISTER_BROKER
        carries them, so a producer of a new topic finds this broker through TBW102's route."""
        from engine.registry.topic_config_manager import system_topic_configs

        store = getattr(self.registry, "store", None)
        if store is None:
            return
        cfg = self.config
        store.topics.add_system_topics(system_topic_configs(
            cluster_name=cfg.broker_cluster_name, broker_name=cfg.broker_name,
            auto_create_topic_enable=cfg.auto_create_topic_enable,
            default_topic_queue_nums=cfg.default_topic_queue_nums, cluster_topic_enable=cfg.cluster_topic_enable,
            broker_topic_enable=cfg.broker_topic_enable, trace_topic_enable=cfg.trace_topic_enable,
            msg_trace_topic_name=cfg.msg_trace_topic_name))

    def _on_registry_event(self, event) -> None:
        """CHANGE -> NOTIFY_CONSUMER_IDS_CHANGED (oneway) to each listed connection (DefaultConsumerIdsChangeListener)."""
        if getattr(event, "kind", None) != "CHANGE" and getattr(getattr(event, "kind", None), "name", None) != "CHANGE":
            return
        channels = event.channels or ()
        if not channels or not self.config.notify_consumer_ids_changed_enable:
            return
        self._notify_opaque = (self._notify_opaque + 1) & 0x7FFFFFFF
        ext = {"consumerGroup": event.group}
        encoded: dict[str, bytes] = {}
        sent = 0
        for conn in channels:
            if getattr(conn, "closing", True) or getattr(conn, "grpc_session", False):  # 5.x: QueryAssignment
                continue
            data = encoded.get(conn.serialize_type)
            if data is None:
                data = encoded[conn.serialize_type] = RemotingCommand(
                    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=self._notify_opaque, flag=2, ext_fields=ext,
                    serialize_type=conn.serialize_type).encode()
            send = getattr(conn, "send_soon", None) or conn.send
            send(data)
            sent += 1
        self.metrics.notifications_sent += sent

    def _on_connection_closed(self, conn) -> None:
        # ClientHousekeepingService.onChannelClose: producer then consumer doChannelCloseEvent (on Java's
        # NettyEventExecutor thread)
        if self._java_threads is not None:
            self._java_threads.run(clientlog.NETTY_EVENT_EXECUTOR, self.registry.close_channel, conn)
        else:
            self.registry.close_channel(conn)

    # ------------------------------------------------------------------ addresses and topics
    def advertised_addr(self, conn=None) -> str:
        """The ip:port clients should use: brokerIP1 if set, else the local address the client reached us on;
        without a client (REGISTER_BROKER, the boot line) the address bound by ``listenHost``, or for every
        interface brokerIP1's 4.9.8 default (RemotingUtil.getLocalAddress): not 127.0.0.1, which a client on
        another host would take for its own."""
        ip = self.config.broker_ip1 or (conn.local_ip if conn is not None and conn.local_ip else self._own_ip())
        if ip in ("0.0.0.0", "::"):
            ip = "127.0.0.1"
        if ":" in ip:
            ip = f"[{ip}]"
        return f"{ip}:{self.ports.get('main', self.config.listen_port)}"

    def _own_ip(self) -> str:
        host = self.config.listen_host
        if host and host not in ("0.0.0.0", "::"):
            return host
        if self._local_ip is None:
            from engine.broker.local_address import local_address

            self._local_ip = local_address()
        return self._local_ip

    def ensure_topic(self, topic: str, remote_ip: str = ""):
        """The TopicConfig a standalone broker routes ``topic`` with, as a name server would answer from this
        broker's registrations; None: no route (TOPIC_NOT_EXIST).

        A retry (``%RETRY%``) or dead-letter (``%DLQ%``) topic is routed only once the broker has created it (a
        retry topic by its group's first heartbeat: 1 queue, perm 6), with the queues and perm it was created with:
        a name server knows it only from the REGISTER_BROKER that follows. Another unknown topic is created with
        ``defaultTopicQueueNums`` queues, perm 6, as a producer's first send creates it from TBW102 when
        ``autoCreateTopicEnable`` (so offsets can be committed for it); with autoCreateTopicEnable=false, past
        ``autoCreateMaxTopics``, past the asking address's ``autoCreateTopicsPerIp`` or for a name TopicValidator
        refuses there is no route."""
        tc = self.registry.topic_config(topic)
        if tc is not None:
            return tc
        from engine.registry.store import TopicConfig

        if (topic.startswith(("%RETRY%", "%DLQ%")) or not self.config.auto_create_topic_enable
                or not valid_topic_name(topic) or not self._may_auto_create_topic(remote_ip, topic)
                or not self.registry.store.may_auto_create(self.registry.store.topics, topic)):
            return None
        n = self.config.default_topic_queue_nums
        tc = TopicConfig(topic, read_queue_nums=n, write_queue_nums=n)
        # derivable: the next route query creates it again, so its write may be deferred (Store)
        self.registry.update_topic_config(tc, derivable=True)
        self._charge_auto_created_topic(remote_ip)
        return tc

    def _may_auto_create_topic(self, remote_ip: str, topic: str) -> bool:
        """Whether the client at ``remote_ip`` may auto-create one more topic (``autoCreateTopicsPerIp``): route
        queries and sends prove nothing, so one host may not fill the table every client shares. A refusal is
        counted (``auto_create_refused_total{kind="topic_ip_share"}``) and logged at most once a minute."""
        limit = self.config.auto_create_topics_per_ip
        if not limit or not remote_ip:
            return True
        key = auto_create_share_key(remote_ip)
        if self._auto_created_topics.get(key, 0) < limit:
            return True
        store = self.registry.store
        store.auto_create_refused["topic_ip_share"] += 1
        store._refusal_log.log(logging.WARNING, "topic_ip_share", "not auto-creating topic %s for %s: that address "
                               "created %d topics (autoCreateTopicsPerIp=%d)", clip(topic, 64), key, limit, limit)
        return False

    def _charge_auto_created_topic(self, remote_ip: str) -> None:
        if self.config.auto_create_topics_per_ip and remote_ip:
            key = auto_create_share_key(remote_ip)
            self._auto_created_topics[key] = self._auto_created_topics.get(key, 0) + 1

    #: TopicValidator.SYSTEM_TOPIC_SET (4.9.8) before the broker adds its start topics (TopicConfigManager)
    SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
                               "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                               "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})

    def is_system_topic(self, topic: str) -> bool:
        """TopicValidator.isSystemTopic (4.9.8): its set, the topics this broker put in the table at start (the
        cluster name, the broker name, the reply topic ...: TopicValidator.addSystemTopic) or the ``rmq_sys_``
        prefix."""
        return (topic in self.SYSTEM_TOPICS or topic in self.registry.store.topics.start_topics
                or topic.startswith("rmq_sys_"))

    def update_and_create_topic(self, tc, remote_addr: str = ""):
        """AdminBrokerProcessor.updateAndCreateTopic (4.9.8): TopicValidator's checks, then the topic is put in
        the table (written to topics.json at once) and registered with the name servers at once. A new topic needs
        room in the table (``maxTopicConfigs``, every topic counted): without ACL the request proves nothing.
        Returns None when applied, else (code, remark)."""
        topic = tc.topic_name
        refused = _validate_topic(topic)
        if refused is not None:
            return refused
        if self.is_system_topic(topic):
            return ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
        store = self.registry.store
        limit = self.config.max_topic_configs
        if limit and store.topics.get(topic) is None and len(store.topics.table) >= limit:
            store.auto_create_refused["topic_table"] += 1
            store._refusal_log.log(logging.WARNING, "topic_table", "not creating topic %s for %s: the table holds "
                                   "%d topics (maxTopicConfigs=%d)", topic, clip(remote_addr, 64), limit, limit)
            return ResponseCode.SYSTEM_ERROR, f"the topic table is full (maxTopicConfigs={limit})"
        log.info("updateAndCreateTopic called by %s", clip(remote_addr, 64))
        old = self.registry.topic_config(topic)
        self.registry.update_topic_config(tc)  # not derivable: written at once
        # TopicConfigManager.updateTopicConfig's line, TopicConfig.toString() in it
        if old is not None:
            log.info("update topic config, old:[%s] new:[%s]", old, tc)
        else:
            log.info("create new topic [%s]", tc)
        if self._namesrv is not None:  # registerIncrementBrokerData: a changed topic is registered too
            self._namesrv.request_register(topic)
        return None

    def msg_check(self, topic, default_topic, client_default_topic_queue_nums: int, unit_mode: bool,
                  remote_address: str, remote_ip: str = ""):
        """The topic part of AbstractSendMessageProcessor.msgCheck (4.9.8): the topic name is checked, and a topic
        the broker does not have is created from the default topic (createTopicInSendMessageMethod; a retry topic
        that cannot be is created with 1 queue, perm 6) and registered with the name servers at once. This is how
        a topic appears behind a name server: a producer whose topic has no route sends through TBW102's route.
        Returns None when the topic exists (now), else Java's refusal as (code, remark)."""
        from engine.registry.topic_config_manager import FLAG_UNIT, FLAG_UNIT_SUB, PERM_READ, PERM_WRITE

        refused = _validate_topic(topic)
        if refused is not None:
            return refused
        if topic in NOT_ALLOWED_SEND_TOPICS:
            return ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
        topics = self.registry.store.topics
        if topics.get(topic) is not None:
            return None
        retry = topic.startswith("%RETRY%")
        # msgCheck's WARN before it tries to create the topic (ctx.channel().remoteAddress(): "/ip:port"), within the
        # client-management log budget: the topic is the client's
        self.registry.client_log.log(clientlog.log, logging.WARNING, "send_unknown_topic",
                                     "the topic %s not exist, producer: /%s", topic, remote_address)
        if not self._may_auto_create_topic(remote_ip, topic):
            return (ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                    "\nSee http://rocketmq.apache.org/docs/faq/ for further details.")
        sys_flag = (FLAG_UNIT_SUB if retry else FLAG_UNIT) if unit_mode else 0  # TopicSysFlag.buildSysFlag
        tc = topics.create_topic_in_send_message_method(topic, default_topic or "", remote_address,
                                                        client_default_topic_queue_nums, sys_flag,
                                                        self.config.auto_create_topic_enable)
        if tc is None and retry:
            tc, _ = topics.create_topic_in_send_message_back_method(topic, 1, PERM_READ | PERM_WRITE, None, sys_flag)
        if tc is None:
            return (ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                    "\nSee http://rocketmq.apache.org/docs/faq/ for further details.")
        self._charge_auto_created_topic(remote_ip)
        return None

    # ------------------------------------------------------------------ lifecycle (asyncio)
    async def start_async(self) -> "Broker":
        self.loop = asyncio.get_running_loop()
        if self.config.grpc_server_port:
            from engine.broker.grpc_endpoint import GrpcEndpoint

            self.grpc = GrpcEndpoint(self)  # a missing grpc extra fails the start before any port is bound
        self.ports = await self.server.start()
        if self.grpc is not None:
            self.ports["grpc"] = await self.grpc.start()
        cfg = self.config
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))
        self._tasks.append(asyncio.ensure_future(self._periodic(cfg.flush_consumer_offset_interval / 1000.0,
                                                                self._persist_offsets)))
        self._tasks.append(asyncio.ensure_future(self._periodic(1.0, self._tick)))
        if cfg.metrics_port:
            self._metrics_endpoint = MetricsEndpoint(self.render_metrics, cfg.metrics_host, cfg.metrics_port,
                                                     metrics=self.metrics)
            try:
                self.ports["metrics"] = await self._metrics_endpoint.start()
            except OSError as e:  # the same line as the other ports': which property, which address, why
                why = os.strerror(e.errno).lower() if e.errno else str(e)
                raise OSError(f"metricsPort {cfg.metrics_port}: cannot bind {cfg.metrics_host}:{cfg.metrics_port}: "
                              f"{why}") from None
        if cfg.namesrv_addr.strip():
            # BrokerController.start: registerBrokerAll at start, then at a fixed rate from +10 s every
            # registerNameServerPeriod (clamped to [10 s, 60 s]); a new topic (a retry topic, an auto-created one)
            # is pushed at once (TopicConfigManager -> registerBrokerAll), several at once coalesced into one call
            clock, sleep = self._namesrv_timers or (time.monotonic, asyncio.sleep)
            self._namesrv = NamesrvRegistrar(self, clock=clock, sleep=sleep)
            await self._namesrv.register_all()
            self._tasks.append(asyncio.ensure_future(self._namesrv.run_periodic(
                10.0, cfg.register_name_server_period / 1000.0)))
            self._tasks.append(asyncio.ensure_future(self._namesrv.run_on_demand()))
            self.registry.store.on_topic_created = self._namesrv.request_register
        mode = f"name server {cfg.namesrv_addr}" if cfg.namesrv_addr.strip() else "standalone (answers routes itself)"
        log.info("The broker[%s, %s] boot success. serializeType=JSON, %s", cfg.broker_name,
                 self.advertised_addr(), mode)
        return self

    async def stop_async(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        if self._namesrv is not None:
            await self._namesrv.unregister_all()
            await self._namesrv.close()
        if self.grpc is not None:
            await self.grpc.stop()
        await self.server.stop()
        if self._metrics_endpoint is not None:
            await self._metrics_endpoint.stop()
        self._persist_all()
        if self.recorder is not None:
            self.recorder.close()
        log.info("broker %s shut down", self.config.broker_name)

    async def _periodic(self, period: float, fn, first: float | None = None, is_async: bool = False) -> None:
        await asyncio.sleep(period if first is None else first)
        while True:
            t0 = time.monotonic()
            try:
                if is_async:
                    await fn()
                else:
                    fn()
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def _housekeeping(self) -> None:
        """ClientHousekeepingService: scanNotActiveChannel every 10 s, first after 10 s; close what expired.
        Expired rebalance locks are dropped on the same beat (the lock table stays bounded)."""
        await self._periodic(10.0, self._housekeeping_pass)

    def _housekeeping_pass(self) -> None:
        self.scan_expired()
        self.rebalance_lock_manager.purge_expired()

    def scan_expired(self, now: int | None = None) -> int:
        """One pass of the expiry scan (``now``: the registry clock's time, default its current one); the expired
        connections are closed. Returns how many."""
        if self._java_threads is not None:  # Java's ClientHousekeepingService thread
            channels = self._java_threads.run(clientlog.CLIENT_HOUSEKEEPING_THREAD, self.registry.scan_expired, now)
        else:
            channels = self.registry.scan_expired(now)
        for conn in channels:
            if hasattr(conn, "close"):
                conn.close(f"channel expired (no heartbeat for more than {self.config.channel_expired_timeout} ms)",
                           level=logging.INFO)
        self.metrics.expired_channels += len(channels)
        return len(channels)

    def _tick(self) -> None:
        flush = getattr(self.registry, "flush_notifications", None)
        if flush is not None and self.config.notify_coalesce_window_ms:
            flush()
        if self.recorder is not None:
            self.recorder.flush_if_due()
        persist_due = getattr(self.registry, "persist_due", None)
        if persist_due is not None:  # auto-created groups and retry topics, written at most once a second
            persist_due()

    def _persist_offsets(self) -> None:
        persist = getattr(self.registry, "persist_offsets", None) or getattr(self.registry, "persist", None)
        if persist is not None:
            persist()

    def _persist_all(self) -> None:
        persist = getattr(self.registry, "persist", None)
        if persist is not None:
            try:
                persist()
            except Exception:
                log.exception("persisting broker state failed")
        store = getattr(self.registry, "store", None)
        if store is not None:
            store.close()

    # ------------------------------------------------------------------ metrics
    def render_metrics(self) -> str:
        stats = getattr(self.registry, "group_stats", None)
        store = getattr(self.registry, "store", None)
        text = render(self.metrics, len(self.server.connections), stats() if stats is not None else (),
                      max_group_series=self.config.metrics_max_group_series,
                      auto_create_refused=store.auto_create_refused if store is not None else None,
                      recorder=self.recorder, hb_cache=self.server.hb_cache)
        if self.server.io_pool is not None:  # ioWorkers > 0: connections held by each worker process
            text += self.server.io_pool.render_metrics()
        return text

    # ------------------------------------------------------------------ lifecycle (blocking, own thread)
    def start(self, timeout: float = 30.0) -> "Broker":
        """Start on a background thread with its own event loop; returns once the ports are bound."""
        if self._thread is not None:
            raise RuntimeError("broker already started")
        self._thread = threading.Thread(target=self._thread_main, name=f"broker-{self.config.broker_name}",
                                        daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError("broker did not start in time")
        if self._start_error is not None:
            raise self._start_error
        return self

    def _thread_main(self) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.start_async())
        except BaseException as e:
            self._start_error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.stop_async())
            loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop from any thread: persist state, close connections, stop the loop."""
        if self._thread is None:
            return
        loop = self.loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)
        self._thread = None

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the broker's loop and return its result (for embedding code and tests)."""
        if self.loop is None:
            raise RuntimeError("broker not started")
        if self._thread is None or threading.current_thread() is self._thread:
            return fn(*args)
        fut = asyncio.run_coroutine_threadsafe(_as_coro(fn, *args), self.loop)
        return fut.result(30)

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _as_coro(fn, *args):
    return fn(*args)


# ---------------------------------------------------------------------------------------------------------------
# REGISTER_BROKER to the name servers (BrokerOuterAPI.registerBrokerAll)


def _raise_if_cancelling() -> None:
    """End the current task if it was asked to: Python 3.11's asyncio.wait_for can swallow a cancel that arrives as
    the call it waits for completes, and a registration loop would then wait on for ever, holding the broker's stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class NamesrvRegistrar:
    """Registers the broker with every configured name server, keeping one connection to each."""

    def __init__(self, broker: Broker, timeout: float = 6.0, clock=time.monotonic, sleep=asyncio.sleep):
        self.broker = broker
        self.timeout = timeout
        self.clock, self.sleep = clock, sleep
        self._conns: dict[tuple, tuple] = {}  # (host, port) -> (reader, writer, decoder)
        self._opaque = 0
        self._lock = asyncio.Lock()  # one registration at a time: they share each name server's connection
        self._wanted = asyncio.Event()  # a new topic asks for a registration (coalesced)
        #: registrations done (start, periodic, on demand) and the on-demand ones among them
        self.registrations = 0
        self.on_demand_registrations = 0
        self._data_version = {"counter": 0, "stateVersion": 0, "timestamp": int(time.time() * 1000)}

    def request_register(self, topic: str | None = None) -> None:
        """A topic appeared: register soon; requests made before that registration starts share it."""
        self._wanted.set()

    async def run_on_demand(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            self.on_demand_registrations += 1
            try:
                await self.register_all()
            except Exception:
                log.exception("registerBrokerAll for a new topic failed")
            _raise_if_cancelling()

    async def run_periodic(self, first_s: float, period_s: float) -> None:
        """scheduleAtFixedRate(registerBrokerAll, first_s, period_s): the k-th run is due at start + first + k x
        period, whatever the runs before it took."""
        start = self.clock()
        k = 0
        while True:
            await self.sleep(max(0.0, start + first_s + k * period_s - self.clock()))
            k += 1
            try:
                await self.register_all()
            except Exception:
                log.exception("registerBrokerAll Exception")
            _raise_if_cancelling()

    def _header(self) -> dict:
        cfg = self.broker.config
        addr = self.broker.advertised_addr()
        host, _, port = addr.rpartition(":")
        return {
            "brokerName": cfg.broker_name,
            "brokerAddr": addr,
            "clusterName": cfg.broker_cluster_name,
            "haServerAddr": f"{host}:{int(port) + 1}",
            "brokerId": str(cfg.broker_id),
            "enableActingMaster": "false",
            "compressed": "false",
        }

    def _body(self) -> bytes:
        """RegisterBrokerBody (uncompressed JSON): the topic configs this broker knows and its data version."""
        topics = {}
        getter = getattr(self.broker.registry, "topic_configs", None)
        for tc in (getter() if getter is not None else ()):
            d = tc.to_dict() if hasattr(tc, "to_dict") else dict(tc)
            name = d.get("topicName")
            if name:
                topics[name] = d
        self._data_version["counter"] += 1
        body = {"filterServerList": [],
                "topicConfigSerializeWrapper": {"dataVersion": dict(self._data_version), "topicConfigTable": topics}}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    async def _invoke(self, addr: tuple, code: int, ext: dict, body: bytes = b""):
        from engine import FrameDecoder

        conn = self._conns.get(addr)
        if conn is None or conn[1].is_closing():
            reader, writer = await asyncio.wait_for(asyncio.open_connection(addr[0], addr[1]), self.timeout)
            conn = self._conns[addr] = (reader, writer, FrameDecoder())
        reader, writer, decoder = conn
        self._opaque = (self._opaque + 1) & 0x7FFFFFFF
        cmd = RemotingCommand(code, opaque=self._opaque, ext_fields=ext, body=body)
        writer.write(cmd.encode())
        try:
            await asyncio.wait_for(writer.drain(), self.timeout)
            deadline = time.monotonic() + self.timeout
            while True:
                data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    raise ConnectionError("name server closed the connection")
                for c in decoder.feed(data):
                    if c.is_response and c.opaque == cmd.opaque:
                        return c
        except BaseException:
            self._drop(addr)
            raise

    def _drop(self, addr) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn[1].close()

    async def register_all(self) -> None:
        async with self._lock:
            self.registrations += 1
            await self._register_all()

    async def _register_all(self) -> None:
        header = self._header()
        body = self._body()
        header["bodyCrc32"] = str(zlib.crc32(body) & 0x7FFFFFFF)  # UtilAll.crc32
        metrics = self.broker.metrics
        for addr in self.broker.config.namesrv_addr_list:
            try:
                resp = await self._invoke(addr, RequestCode.REGISTER_BROKER, header, body)
                # BrokerOuterAPI.registerBrokerAll's lines (4.9.8); Java puts the exception on the lines after
                if resp.code == ResponseCode.SUCCESS:
                    metrics.register_broker_ok += 1
                    log.info("register broker[%s]to name server %s:%d OK", self.broker.config.broker_id, *addr)
                else:
                    metrics.register_broker_failed += 1
                    log.warning("registerBroker Exception, %s:%d (CODE: %d  DESC: %s)", addr[0], addr[1],
                                resp.code, clip(resp.remark or "", 255))
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                metrics.register_broker_failed += 1
                log.warning("registerBroker Exception, %s:%d (%s)", addr[0], addr[1], e or type(e).__name__)

    async def unregister_all(self) -> None:
        async with self._lock:
            await self._unregister_all()

    async def _unregister_all(self) -> None:
        cfg = self.broker.config
        ext = {"brokerName": cfg.broker_name, "brokerAddr": self.broker.advertised_addr(),
               "clusterName": cfg.broker_cluster_name, "brokerId": str(cfg.broker_id)}
        for addr in cfg.namesrv_addr_list:
            try:
                resp = await self._invoke(addr, RequestCode.UNREGISTER_BROKER, ext)
                if resp.code == ResponseCode.SUCCESS:
                    log.info("unregisterBroker OK, NamesrvAddr: %s:%d", *addr)
                else:
                    log.warning("unregisterBroker Exception, %s:%d (CODE: %d  DESC: %s)", addr[0], addr[1],
                                resp.code, clip(resp.remark or "", 255))
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                log.warning("unregisterBroker Exception, %s:%d (%s)", addr[0], addr[1], e or type(e).__name__)

    async def close(self) -> None:
        for addr in list(self._conns):
            self._drop(addr)


# ---------------------------------------------------------------------------------------------------------------
# rmqhb serve


def serve_main(argv=None) -> int:
    """rmqhb serve -c broker.properties [--property value ...] [-p] [--metrics-port N] [--record DIR]"""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="rmqhb serve",
        description="Run the broker front end (like mqbroker). Any broker property can be overridden with "
                    "--<propertyName> VALUE, e.g. --listenPort 10911 --namesrvAddr 127.0.0.1:9876.",
    )
    p.add_argument("-c", "--configFile", help="broker.properties file")
    p.add_argument("-p", "--printConfigItem", action="store_true", help="print the effective config and exit")
    p.add_argument("-m", "--printImportantConfig", action="store_true", help="print the explicitly set items and exit")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (metricsPort)")
    p.add_argument("--record", metavar="DIR", help="record every heartbeat into zstd segments in DIR (recordDir)")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.add_argument("--lenient-config", action="store_true",
                   help="keep unknown property names (listed at start-up) instead of refusing to start")
    try:
        args, rest = p.parse_known_args(argv)
    except SystemExit as e:  # argparse: -h (0) or a bad command line (mqbroker: ServerUtil.parseCmdLine -> -1)
        return 0 if e.code in (0, None) else EXIT_FAILURE
    # logback's broker pattern (engine.registry.clientlog): one parser reads this broker's log and a Java broker's
    handler = logging.StreamHandler()
    handler.setFormatter(JavaLogFormatter())
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO), handlers=[handler])
    try:
        overrides = parse_overrides(rest, lenient=args.lenient_config)
        if args.metrics_port is not None:
            overrides["metricsPort"] = str(args.metrics_port)
        if args.record:
            overrides["recordDir"] = args.record
        config = BrokerConfig.load(args.configFile, overrides, lenient=args.lenient_config)
    except ConfigFileError as e:
        print(str(e), file=sys.stderr)
        return EXIT_FAILURE
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_CONFIG
    if config.log_format == "java":  # logback_broker.xml's pattern and Java's thread names
        handler.setFormatter(clientlog.JavaBrokerFormatter())
    if args.printConfigItem or args.printImportantConfig:
        for name, value in config.to_properties():
            if args.printImportantConfig and name not in config.explicit:
                continue
            print(f"{name}={value}")
        return 0
    if config.log_dir:  # broker.log as logback's RocketmqBrokerAppender writes and rolls it
        try:
            log_file = clientlog.BrokerLogFile(os.path.expanduser(config.log_dir))
        except OSError as e:
            print(f"logDir {config.log_dir}: cannot write broker.log there ({e.strerror or e}; a symlinked "
                  "broker.log is refused)", file=sys.stderr)
            return EXIT_FAILURE
        log_file.setFormatter(handler.formatter)
        logging.getLogger().addHandler(log_file)
    log_unused_properties(config)
    _raise_nofile()
    if not os.environ.get("RMQHB_DEBUG"):  # grpc's C core prints its own raw line for what our error line says
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    return asyncio_run(_serve(config))


def log_unused_properties(config: BrokerConfig) -> None:
    """Once at start: the Java broker properties that were set and that this broker does not use (thread pools,
    the message store, HA...), and the unknown names ``--lenient-config`` kept."""
    java = config.java_unused_properties()
    if java:
        log.warning("accepted, not used by this broker: %s", ", ".join(java))
    unknown = config.unknown_properties()
    if unknown:
        log.warning("unknown properties kept (--lenient-config), not used: %s", ", ".join(unknown))


def _raise_nofile() -> None:
    """A standalone broker takes the descriptor hard limit (mqbroker's start scripts expect a raised ulimit):
    every client connection is a descriptor."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError) as e:
        log.info("could not raise RLIMIT_NOFILE: %s", e)


async def _serve(config: BrokerConfig) -> int:
    try:
        broker = Broker(config)  # BrokerController.initialize(): the store files load, or the broker exits -3
    except (ConfigError, ValueError) as e:
        log.error("broker failed to start: %s", e)
        return EXIT_CONFIG
    except OSError as e:
        log.error("broker failed to start: %s", e)
        return EXIT_FAILURE
    try:
        await broker.start_async()
    except (ConfigError, OSError, ValueError) as e:  # BrokerController.start() threw: mqbroker exits -1
        log.error("broker failed to start: %s", e)
        for t in broker._tasks:  # the timers started before the failing port: ended, not destroyed pending
            t.cancel()
        await asyncio.gather(*broker._tasks, return_exceptions=True)
        return EXIT_FAILURE
    # The start-up heap (modules, config, tables loaded from the store: ~26k objects) lives as long as the process;
    # frozen, no gen-2 collection walks it again: a full pass with 1k connections took 14 ms before, 0.8 ms after
    # (offline; BENCHMARKS.md, issue 4), and such a pass stalls every connection's answers. Only
    # the standalone daemon does this: an embedding application owns its own heap.
    import gc

    gc.freeze()
    # A full collection walks the whole heap, every gRPC session's stream task, futures and coroutine included:
    # considered after every 10 gen-1 passes (the default), registering 10,000 sessions ran 8 of them, 2.4 s of
    # the broker's 4.2 CPU-s. After every 100, none ran during it (2.3-2.8 CPU-s; BENCHMARKS.md, issue 30). Young
    # passes stay as frequent (their pauses stay short); Python's own rule (a full pass only once the long-lived
    # objects grew by 25 %) still bounds what uncollected cycles can hold.
    gc.set_threshold(700, 10, 100)
    print(f"The broker[{config.broker_name}, {broker.advertised_addr()}] boot success. serializeType=JSON"
          + (f" and name server is {config.namesrv_addr}" if config.namesrv_addr else ""), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    await stop.wait()
    log.info("shutdown requested, persisting state")
    await broker.stop_async()
    return 0


def asyncio_run(coro):
    loop = new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
