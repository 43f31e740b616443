"""The broker's client registry: producer and consumer tables over struct arrays, with RocketMQ's rules.

This is the client-management half of a RocketMQ broker (ClientManageProcessor, ConsumerManager,
ConsumerGroupInfo, ProducerManager, ClientHousekeepingService; PROTOCOL.md section 6 is the specification) as
an embeddable object with no network code. The server feeds it decoded requests and connection events; it
answers with results and reports consumer-group events to a listener.

Managers (issue 15: named and split as in RocketMQ, over one channel table). The channel table is
:class:`engine.registry._channel_table.ChannelTable` (Cython, twin ``_channel_table_py``; ``registry.channel_table``):
the slot columns, memberships and member arrays below. ``ClientRegistry`` owns it with the interning around it
and is the facade: its public API is the broker's. The producer side
is :class:`engine.registry.producer_manager.ProducerManager` (``registry.producers``: the producer groups and the client
channel table), the consumer side :class:`engine.registry.consumer_manager.ConsumerManager` (``registry.consumers``: the
consumer groups, their live ConsumerGroupInfo, and the topic -> groups table). What ClientManageProcessor decides
before it registers (fingerprints, subscription group configs, retry topics, 4.x or 5.x rules), the fast path,
the events and their coalescing are this module's.

Usage::

    reg = ClientRegistry(RegistryConfig(), clock=lambda: time.monotonic_ns() // 1_000_000, listener=on_event,
                         store=Store("/var/lib/broker"))
    reg.open_channel(conn, "10.0.0.7:53412")            # optional: records the remote address
    result = reg.heartbeat(conn, hb, cmd.language, cmd.version)   # -> HeartbeatResult (ext fields for the answer)
    reg.unregister(conn, client_id, producer_group, consumer_group)
    reg.close_channel(conn)                             # connection closed, errored or idle
    for conn in reg.scan_expired(): conn.close()        # every 10 s

Channels are opaque hashable keys supplied by the caller (a connection object or an int id). Registration is
keyed by channel, as in Java, never by client id.

Layout ("tables over struct arrays", DESIGN.md). One slot per channel in the channel table's flat C columns: latest
heartbeat time, the scan key (oldest membership time), client id, language, version, remote address, live flag,
and up to four (group, position) membership pairs inline (more spill into a dict); the table's budget is
``RegistryConfig.max_channels`` slots (ChannelTableError past it). Groups and client ids are interned to
small ints with reference counts (:class:`engine.registry._intern_py.StringPool` for client ids and addresses); a group keeps
its members as an int32 array of slots, removed by swap (so group order is insertion order until a member
leaves; Java's order is hash order, and clients sort the ids). Per-group state (subscription table, consume
type/model/where) and per-group dicts are Python objects: there are few groups. Python objects per client appear
only in query results.

Timestamps. Java keeps a timestamp per (group, channel) entry; a heartbeat refreshes the entries of the groups it
names. Here a membership is "fresh" (its time is the slot's latest heartbeat) unless a later heartbeat on the
channel left it out, in which case its own older time is kept in a side table. The scan column holds, per slot,
the oldest membership time (producer memberships shifted so one column serves both timeouts: Java's consumer
timeout is ``channelExpiredTimeout``, the producer one a fixed 120 s). The expiry scan (the table's ``scan``: a
vectorised nogil pass over the scan column) finds the slots with an expired membership; only those are then
examined in Python.

Fast path. A heartbeat that repeats the previous one on its channel (same 64-bit digest of the fields the rules
read, :mod:`engine.registry._digest`; a Java client's sets in another HashSet order are the same digest), when nothing it depends on changed since (per-group epochs and a config epoch), is
answered by refreshing two timestamps: the rules would change nothing else. The fast path is armed only after a
slow-path run of the same heartbeat changed nothing, so it only ever replays a verified no-op.

Deviations from Java, all deliberate and small:

* a heartbeat with no clientID, or a group without a name, is answered SYSTEM_ERROR and changes nothing (Java
  applies part of it and then fails with a NullPointerException);
* V2 restart quirk (PROTOCOL.md 5.5): a light heartbeat for a group with no stored fingerprint, or with no live
  registration, is answered ``IS_SUB_CHANGE=true`` so the client sends its subscriptions (Java registers it with
  an empty subscription table); ``RegistryConfig.v2_restart_safe=False`` restores Java's answer;
* with ``notify_coalesce_window_ms > 0`` CHANGE events are coalesced per group (see :meth:`flush_notifications`);
* CHANGE is not delivered at all when the broker-wide ``notify_consumer_ids_changed_enable`` is off (the Java
  listener receives it and drops it);
* topics are not interned to ints: they are never stored per client, only in per-group tables;
* each (group, channel) entry has its own timestamp, as PROTOCOL.md 6.7/6.8 describe. Java inserts the one
  ClientChannelInfo object of a request into every table that request registered it in, so refreshing one entry
  also refreshes its siblings; here an entry a client stops naming expires even if a sibling created by the same
  request is still refreshed (only visible when a client drops a group from its heartbeats without unregistering);
* a producer ``clientChannelTable`` entry that an UNREGISTER_CLIENT with another clientID left behind is dropped
  when its channel closes (Java keeps it pointing at the closed channel; here the slot would be reused).

Not thread-safe: one event loop owns a registry.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from engine import compiled_module, compiled_or_twin
from engine.codec.enums import ConsumeType, LanguageCode, ResponseCode
from engine.registry import clientlog as jl
from engine.registry.store import FLAG_UNIT_SUB, PERM_READ, PERM_WRITE, Store, SubscriptionGroupConfig, TopicConfig
from engine.registry.client_channel import CONSUMER as _CONSUMER, PRODUCER as _PRODUCER, ClientChannelInfo, Connection
from engine.registry.client_channel import Members as _Members
from engine.registry.producer_manager import PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS, ProducerConnection, ProducerGroupEvent
from engine.registry.producer_manager import ProducerManager
from engine.registry.consumer_manager import ConsumerConnection, ConsumerGroupEvent, ConsumerGroupInfo, ConsumerManager
from engine.registry.consumer_manager import subscription_to_dict  # noqa: F401 (part of this module's namespace)

log = logging.getLogger("engine.registry.client_registry")

__all__ = [
    "ChannelTableError",
    "ClientChannelInfo",
    "ClientRegistry",
    "Connection",
    "ConsumerConnection",
    "ConsumerGroupEvent",
    "ConsumerGroupInfo",
    "HeartbeatResult",
    "IMPLEMENTATION",
    "IS_SUB_CHANGE",
    "IS_SUPPORT_HEART_BEAT_V2",
    "ProducerConnection",
    "ProducerGroupEvent",
    "RegistryConfig",
    "RegistryEvent",
    "PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS",
    "RETRY_GROUP_TOPIC_PREFIX",
]

# ---------------------------------------------------------------------------------------------------------------
# Native hot paths or their twins, chosen as engine/__init__.py does (ENGINE_NO_EXTENSIONS=1 forces the twins).

IMPLEMENTATION = {}  # per hot path: "native" or "twin"


def _load(name: str):
    """The compiled module ``_<name>`` or its twin (engine.compiled_or_twin), noted in IMPLEMENTATION."""
    module, native = compiled_or_twin("_" + name)
    IMPLEMENTATION[name] = "native" if native else "twin"
    return module


_monotonic_ms = _load("expiry").monotonic_ms
_heartbeat_digest = _load("digest").heartbeat_digest
_table = _load("channel_table")
_ChannelTable, _pack_ipv4 = _table.ChannelTable, _table.pack_ipv4
StringPool = _load("intern").StringPool
# the native rule path; its twin is this module's (ClientRegistry._heartbeat and the managers' register)
_rules = compiled_module("_rules")
_HeartbeatRules = _rules.HeartbeatRules if _rules is not None else None
IMPLEMENTATION["rules"] = "native" if _rules is not None else "twin"
del _table, _rules
from engine.registry._channel_table_py import MAX_MEMBERSHIPS, ChannelTableError  # noqa: E402 (both tables')

# ---------------------------------------------------------------------------------------------------------------
# Constants

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
IS_SUPPORT_HEART_BEAT_V2 = "IS_SUPPORT_HEART_BEAT_V2"
IS_SUB_CHANGE = "IS_SUB_CHANGE"
_NO_LANGUAGE = 255
_CONSUME_ACTIVELY = ConsumeType.CONSUME_ACTIVELY
_LANGUAGES = {m.value: m for m in LanguageCode}




class RegistryEvent:
    """One event for the listener.

    ``kind`` is a :class:`ConsumerGroupEvent` or :class:`ProducerGroupEvent`; ``group`` the group name.
    CHANGE carries ``channels`` (the channels to send NOTIFY_CONSUMER_IDS_CHANGED to); REGISTER carries
    ``subscriptions`` and ``client``; CLIENT_REGISTER / CLIENT_UNREGISTER carry ``client`` (a
    :class:`ClientChannelInfo`) and, for consumers, ``topics`` (the group's subscribed topics).
    """

    __slots__ = ("kind", "group", "channels", "client", "subscriptions", "topics")

    def __init__(self, kind, group, channels=(), client=None, subscriptions=(), topics=frozenset()):
        self.kind = kind
        self.group = group
        self.channels = channels
        self.client = client
        self.subscriptions = subscriptions
        self.topics = topics

    def __repr__(self):
        extra = []
        if self.channels:
            extra.append(f"channels={list(self.channels)!r}")
        if self.client is not None:
            extra.append(f"client={self.client.client_id!r}")
        if self.topics:
            extra.append(f"topics={sorted(self.topics)!r}")
        return f"RegistryEvent({self.kind.name}, {self.group!r}{''.join(', ' + e for e in extra)})"


#: the most groups per channel a registry may allow: a close or an expiry removes a channel's memberships one by one,
#: each removal linear in them (at 4096 a close costs ~80 ms native, at the table's 65,535 it took 37 s)
MAX_GROUPS_PER_CHANNEL = 4096
assert MAX_GROUPS_PER_CHANNEL <= MAX_MEMBERSHIPS
#: the longest channelExpiredTimeout (ms): the table's producer shift (120 s - timeout) stays within 2**40 ms
MAX_CHANNEL_EXPIRED_TIMEOUT_MS = (1 << 40) + PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS


@dataclass(frozen=True)
class RegistryConfig:
    """Registry settings, named after their BrokerConfig keys (snake_case). Defaults are RocketMQ 5.x's."""

    #: consumer entries expire when silent for more than this (channelExpiredTimeout)
    channel_expired_timeout_ms: int = 120_000
    #: create a missing subscription group on first use (autoCreateSubscriptionGroup)
    auto_create_subscription_group: bool = True
    #: create missing CID_RMQ_SYS_* groups even with auto-create off (enableCreateSysGroup)
    enable_create_sys_group: bool = True
    #: broker-wide switch of NOTIFY_CONSUMER_IDS_CHANGED (notifyConsumerIdsChangedEnable); off: no CHANGE events
    notify_consumer_ids_changed_enable: bool = True
    #: ignore CONSUME_ACTIVELY (pull) consumers in heartbeats (rejectPullConsumerEnable)
    reject_pull_consumer_enable: bool = False
    #: accept non-TAG (SQL92) subscriptions in CHECK_CLIENT_CONFIG (enablePropertyFilter)
    enable_property_filter: bool = False
    #: > 0: CHANGE events of one group within this window are merged into one, delivered by flush_notifications()
    notify_coalesce_window_ms: int = 0
    #: slots allocated up front (the columns grow by half when full)
    initial_capacity: int = 1024
    #: the channel table's budget: open channels (connections and gRPC sessions) at most; one more raises
    #: ChannelTableError (the broker's maxConnections and grpcMaxSessions keep far below it)
    max_channels: int = 1 << 24
    #: groups one channel may be registered in (a Java client instance registers a handful); the heartbeat that
    #: would pass it is refused before any change. Also what bounds the per-membership work of a close or an
    #: expiry (linear in the channel's groups)
    max_groups_per_channel: int = 1024
    #: live consumer and producer groups together; a heartbeat that would create more is refused before any change
    #: (producer groups need no config, 4.x rules register consumer groups without one)
    max_groups: int = 100_000
    #: (group, channel) registrations of all channels together; a heartbeat that would pass it is refused
    max_memberships: int = 1 << 24
    #: answer IS_SUB_CHANGE=true to a light V2 heartbeat the broker cannot serve (see the module docstring)
    v2_restart_safe: bool = True
    #: 5: RocketMQ 5.1.3+ rules (the defaults above); 4: RocketMQ 4.9.x ClientManageProcessor / ConsumerManager
    #: rules: a consumer whose group has no config is registered (notify on, no retry topic), BROADCASTING groups
    #: get CHANGE too, no heartbeat V2 (fingerprints ignored, no ext fields in the answer), no
    #: rejectPullConsumerEnable, the retry topic's order flag is left alone, no CLIENT_REGISTER/CLIENT_UNREGISTER
    #: events, queryTopicConsumeByWho reads the live groups (README: conformance table)
    client_management_rules: int = 5
    #: lines of each kind of the Java client-management log (engine.registry.clientlog) written per minute at most
    client_log_lines_per_minute: int = 6000
    #: bytes of those lines (all kinds together) written per minute at most
    client_log_bytes_per_minute: int = 32 << 20

    def __post_init__(self):
        for name in ("channel_expired_timeout_ms", "notify_coalesce_window_ms", "initial_capacity",
                     "client_log_lines_per_minute", "client_log_bytes_per_minute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RegistryConfig.{name} must be a non-negative int, not {value!r}")
        if isinstance(self.max_channels, bool) or not isinstance(self.max_channels, int) \
                or not 1 <= self.max_channels <= 1 << 30:
            raise ValueError(f"RegistryConfig.max_channels must be an int in [1, 2**30], not {self.max_channels!r}")
        if self.channel_expired_timeout_ms > MAX_CHANNEL_EXPIRED_TIMEOUT_MS:
            # the producer timeout is a fixed 120 s: the channel table shifts producer times by the difference,
            # which it bounds to 2**40 ms (~34.8 years)
            raise ValueError(f"RegistryConfig.channel_expired_timeout_ms must be at most "
                             f"{MAX_CHANNEL_EXPIRED_TIMEOUT_MS}, not {self.channel_expired_timeout_ms}")
        for name, top in (("max_groups_per_channel", MAX_GROUPS_PER_CHANNEL), ("max_groups", 1 << 30),
                          ("max_memberships", 1 << 40)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"RegistryConfig.{name} must be an int in [1, {top}], not {value!r}")
        if self.client_management_rules not in (4, 5) or isinstance(self.client_management_rules, bool):
            raise ValueError(f"RegistryConfig.client_management_rules must be 4 or 5, not "
                             f"{self.client_management_rules!r}")


class HeartbeatResult:
    """The answer to a heartbeat: response code, remark and the V2 ext fields (as strings, as Java sends them).

    ``v2_fields`` False (RocketMQ 4.x rules): the answer carries no ext fields at all, as a 4.9 broker's."""

    __slots__ = ("code", "remark", "is_sub_change", "v2_fields")

    def __init__(self, code=ResponseCode.SUCCESS, remark=None, is_sub_change=True, v2_fields=True):
        self.code = code
        self.remark = remark
        self.is_sub_change = is_sub_change
        self.v2_fields = v2_fields

    @property
    def ext_fields(self) -> dict | None:
        """``{"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"|"false"}``; None for an error answer
        and under 4.x rules."""
        if self.code != ResponseCode.SUCCESS or not self.v2_fields:
            return None
        return {IS_SUPPORT_HEART_BEAT_V2: "true", IS_SUB_CHANGE: "true" if self.is_sub_change else "false"}

    def __repr__(self):
        return (f"HeartbeatResult(code={self.code!r}, remark={self.remark!r}, is_sub_change={self.is_sub_change!r}"
                f"{'' if self.v2_fields else ', v2_fields=False'})")

    def __eq__(self, other):
        if not isinstance(other, HeartbeatResult):
            return NotImplemented
        return ((self.code, self.remark, self.is_sub_change, self.v2_fields)
                == (other.code, other.remark, other.is_sub_change, other.v2_fields))


_RESULT_V1 = HeartbeatResult(is_sub_change=True)  # V1: always IS_SUB_CHANGE=true (5.4)
_RESULT_4 = HeartbeatResult(is_sub_change=True, v2_fields=False)  # 4.x rules: SUCCESS without ext fields
_RESULT_V2_SAME = HeartbeatResult(is_sub_change=False)
_RESULT_V2_CHANGED = HeartbeatResult(is_sub_change=True)


def _digest_or_none(hb, language, version):
    """The fast path's digest of a request, or None when its header does not digest (a language or version that is
    not an int64, from an API caller: the frame codec reads int32s). Such a request neither takes nor arms the fast
    path; before, it raised out of the fast path's check, or out of the arming after the heartbeat was applied."""
    try:
        return _heartbeat_digest(hb, language, version)
    except (TypeError, ValueError, OverflowError):
        return None


def _language_code(language) -> int:
    if language is None:
        return _NO_LANGUAGE
    code = int(language)
    return code if 0 <= code < _NO_LANGUAGE else _NO_LANGUAGE


def _language_of(code: int):
    return None if code == _NO_LANGUAGE else _LANGUAGES.get(code, code)


def _unpack_ipv4(v: int) -> str:
    return f"{(v >> 40) & 255}.{(v >> 32) & 255}.{(v >> 24) & 255}.{(v >> 16) & 255}:{v & 0xFFFF}"


# ---------------------------------------------------------------------------------------------------------------


class ClientRegistry:
    """Producer and consumer tables of a broker (see the module docstring for layout and rules).

    :param config: :class:`RegistryConfig`.
    :param clock: a callable returning the current time in ms (monotonic by default); tests drive it.
    :param listener: called with each :class:`RegistryEvent` (exceptions are logged, never propagated).
    :param store: a :class:`engine.registry.store.Store` (topic configs, subscription groups, offsets); in-memory if None.
    :param events: the event kinds the listener wants (None: all). Leaving REGISTER out keeps the fast path free
        of per-heartbeat event objects.
    """

    def __init__(self, config: RegistryConfig | None = None, clock=None, listener=None, store: Store | None = None,
                 events=None):
        self.config = config if config is not None else RegistryConfig()
        self.store = store if store is not None else Store(None)
        self._clock = clock if clock is not None else _monotonic_ms
        self._listener = listener
        self._events = None if events is None else frozenset(events)
        # kinds the listener gets; event payloads (channel lists, client infos) are only built for these
        every = frozenset(ConsumerGroupEvent) | frozenset(ProducerGroupEvent)
        self._wants = frozenset() if listener is None else (every if self._events is None else self._events & every)
        self._want_register = ConsumerGroupEvent.REGISTER in self._wants
        cfg = self.config
        self._timeout = cfg.channel_expired_timeout_ms
        self._producer_shift = PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS - self._timeout
        #: RocketMQ 4.x rules (RegistryConfig.client_management_rules == 4)
        self._rules4 = rules4 = cfg.client_management_rules == 4
        self._reject_pull = cfg.reject_pull_consumer_enable and not rules4  # 4.x has no rejectPullConsumerEnable
        self._result_v1 = _RESULT_4 if rules4 else _RESULT_V1
        #: Java's client-management log lines, within their budget (engine.registry.clientlog)
        self.client_log = jl.ClientEventLog(cfg.client_log_lines_per_minute,
                                             bytes_per_minute=cfg.client_log_bytes_per_minute)
        # 4.x has no CLIENT_REGISTER / CLIENT_UNREGISTER events
        if rules4:
            self._wants -= {ConsumerGroupEvent.CLIENT_REGISTER, ConsumerGroupEvent.CLIENT_UNREGISTER,
                            ProducerGroupEvent.CLIENT_UNREGISTER}

        self._pool = StringPool(max(64, cfg.initial_capacity))  # client ids and non-IPv4 addresses
        #: the channel table: a slot per open channel with its columns and memberships (engine.registry._channel_table;
        #: the fast path's token per slot is the (hb, language, version) whose digest it holds: a connection reuses
        #: its decoded body when the bytes repeat, so an identical request is recognised by identity)
        self.channel_table = ct = _ChannelTable(max(16, cfg.initial_capacity), cfg.max_channels, self._producer_shift)
        self._find_slot = ct.find  # channel -> slot or None

        self._gid: dict[str, int] = {}
        self._gnames: list = []
        self._grefs: list[int] = []
        self._gfree: list[int] = []
        #: ProducerManager: producer groups and the client channel table, over this channel table
        self.producers = producers = ProducerManager(self)
        self._producers = producers.group_table  # the same objects, for the facade's own reads
        self._pgroup = producers.by_gid  # gid -> ProducerGroup | None (grown by _acquire_gid)
        self._stale_client = producers.stale
        self._fingerprints: dict[str, int] = {}  # ClientManageProcessor.consumerGroupHeartbeatTable
        #: ConsumerManager: consumer groups and the topic -> groups table, over this channel table
        self.consumers = consumers = ConsumerManager(self)
        self._consumers = consumers.group_table  # the same objects: the fast path reads them
        self._cgroup = consumers.by_gid  # gid -> ConsumerGroup | None (grown by _acquire_gid)
        self._topic_groups = consumers.topic_groups  # ConsumerManager.topicGroupTable
        self._pending: dict[str, int] = {}  # coalesced CHANGE: group -> time of the first one in the window
        self._tick = 0
        self._config_epoch = 0
        self._dirty = False
        self._request = None  # (channel, client id, language, version, now, slot) of the heartbeat being handled
        self._request_v2 = False  # that heartbeat takes the V2 path
        #: the native rule path (engine.registry._rules) for the heartbeats it takes, when no event but CHANGE is
        #: wanted; None: every heartbeat takes the Python path below
        self._rules = None
        if (_HeartbeatRules is not None and self._wants <= {ConsumerGroupEvent.CHANGE}
                and _HeartbeatRules.usable(self.channel_table, self._pool)):
            self._use_rules(_HeartbeatRules(self, _heartbeat_digest, self._result_v1, _RESULT_V2_SAME, _pack_ipv4,
                                            ClientRegistry.heartbeat))

    @property
    def _nmemberships(self) -> int:
        """(group, channel) registrations (RegistryConfig.max_memberships): the channel table counts them."""
        return self.channel_table.memberships

    def _use_rules(self, rules) -> None:
        """Take heartbeats, repeats, consumer lists, opens and closes through the native rules (None: the Python
        paths only). Their C methods stand in for :meth:`heartbeat`, :meth:`heartbeat_repeat`,
        :meth:`consumer_ids`, :meth:`open_channel` and :meth:`close_channel` on this instance: the same semantics
        (they are these methods' native twins), without a Python frame per call."""
        self._rules = rules
        for name in ("heartbeat", "heartbeat_repeat", "consumer_ids", "open_channel", "close_channel"):
            self.__dict__.pop(name, None)
        if rules is not None:
            self.heartbeat, self.open_channel, self.close_channel = rules.handle, rules.open_channel, rules.close_channel
            self.heartbeat_repeat, self.consumer_ids = rules.heartbeat_repeat, rules.consumer_ids

    # =========================================================================================== slot storage
    def _new_slot(self, channel, remote_addr) -> int:
        addr = self._encode_addr(remote_addr)
        try:
            return self.channel_table.open(channel, addr)
        except BaseException:
            if addr < 0:
                self._pool.release(-addr - 1)
            raise

    def _free_slot(self, slot: int) -> None:
        if self._stale_client:
            stale = self._stale_client.pop(slot, None)
            if stale:
                self.producers.free_slot(slot, stale)
        ct = self.channel_table
        cid = ct.client(slot)[0]
        if cid >= 0:
            self._pool.release(cid)
        addr = ct.addr(slot)
        if addr < 0:
            self._pool.release(-addr - 1)
        ct.close(slot)

    def _encode_addr(self, addr) -> int:
        if not addr or not isinstance(addr, str):
            return 0
        packed = _pack_ipv4(addr)
        return packed if packed else -(self._pool.intern(addr) + 1)

    def _decode_addr(self, v: int) -> str:
        if v == 0:
            return ""
        return _unpack_ipv4(v) if v > 0 else self._pool.get(-v - 1)

    # ------------------------------------------------------------------------------------------- memberships
    def _mem_keys(self, slot: int) -> list:
        return self.channel_table.mem_keys(slot)

    def _mem_pos(self, slot: int, key: int) -> int:
        """Position of ``slot`` in the member array of membership ``key``, or -1 if not a member."""
        return self.channel_table.mem_pos(slot, key)

    def _member_time(self, slot: int, key: int) -> int:
        return self.channel_table.member_time(slot, key)

    def _member_info(self, slot: int, key: int) -> tuple:
        return self.channel_table.member_info(slot, key)

    def _set_member_info(self, slot: int, key: int, req: tuple) -> None:
        """Make the info of membership ``key`` the request's ``(cid, language, version)``."""
        ct = self.channel_table
        old = ct.set_member_info(slot, key, req[0], req[1], req[2])
        if req != ct.client(slot):
            self._pool.acquire(req[0])  # the table keeps it as the membership's own
        if old >= 0:
            self._pool.release(old)

    # ----------------------------------------------------------------------------------- Java's log lines
    def _wall_ms(self, t: int) -> int:
        """Wall-clock ms of a registry-clock time (Java's lastUpdateTimestamp is System.currentTimeMillis())."""
        return int(time.time() * 1000) - (self._clock() - int(t))

    def _jinfo(self, slot: int, key: int) -> str:
        """ClientChannelInfo.toString() of a stored membership."""
        cid, lang, ver = self._member_info(slot, key)
        return jl.client_channel_info(self.channel_table.channel(slot), self._pool.get(cid) if cid >= 0 else None,
                                      _language_of(lang), ver, self._wall_ms(self._member_time(slot, key)))

    def _jinfo_request(self) -> str:
        """ClientChannelInfo.toString() of the request being handled."""
        channel, client_id, language, version, now, slot = self._request
        return jl.client_channel_info(channel, client_id, _language_of(_language_code(language)), version,
                                      self._wall_ms(now))

    def _jaddr(self, slot: int, channel) -> str:
        """RemotingHelper.parseChannelRemoteAddr."""
        addr = self._decode_addr(self.channel_table.addr(slot)) if slot is not None else ""
        return addr or jl._text(getattr(channel, "remote_addr", "") or "")

    def _client_info(self, slot: int, key: int) -> ClientChannelInfo:
        ct = self.channel_table
        cid, lang, ver = ct.member_info(slot, key)
        return ClientChannelInfo(ct.channel(slot), self._pool.get(cid) if cid >= 0 else None,
                                 _language_of(lang), ver, ct.member_time(slot, key), self._decode_addr(ct.addr(slot)))

    def _add_member(self, group, slot: int, req: tuple) -> None:
        ct = self.channel_table
        if ct.nmem(slot) == 0:
            # the first registration on the channel sets the slot's own client id / language / version
            old = ct.client(slot)[0]
            self._pool.acquire(req[0])
            if old >= 0:
                self._pool.release(old)
            ct.set_client(slot, req[0], req[1], req[2])
        ct.add_member(slot, group.key)  # the table counts it (_nmemberships)
        if req != ct.client(slot):
            self._set_member_info(slot, group.key, req)

    def _remove_member(self, group, slot: int) -> bool:
        released = self.channel_table.remove_member(slot, group.key)
        if released == -2:
            return False
        if released >= 0:
            self._pool.release(released)  # the membership's own client id
        return True

    # ------------------------------------------------------------------------------------------------ groups
    def _acquire_gid(self, name: str) -> int:
        gid = self._gid.get(name)
        if gid is None:
            if self._gfree:
                gid = self._gfree.pop()
                self._gnames[gid] = name
                self._grefs[gid] = 0
            else:
                gid = len(self._gnames)
                self._gnames.append(name)
                self._grefs.append(0)
                self._cgroup.append(None)
                self._pgroup.append(None)
            self._gid[name] = gid
        self._grefs[gid] += 1
        return gid

    def _release_gid(self, gid: int) -> None:
        self._grefs[gid] -= 1
        if self._grefs[gid] == 0:
            del self._gid[self._gnames[gid]]
            self._gnames[gid] = None
            self._gfree.append(gid)

    def _touch(self, group) -> None:
        """Record a change of the group that a repeated heartbeat would see (invalidates fast paths)."""
        self._tick += 1
        group.epoch = self._tick
        self._dirty = True

    def _config_changed(self) -> None:
        self._tick += 1
        self._config_epoch = self._tick
        self._dirty = True

    def _group_channels(self, g) -> tuple:
        return self.channel_table.group_channels(g.key) if g is not None else ()

    # ------------------------------------------------------------------------------------------------ events
    def _emit(self, kind, group, channels=(), client=None, subscriptions=(), topics=frozenset()) -> None:
        if kind not in self._wants:
            return
        try:
            self._listener(RegistryEvent(kind, group, channels, client, subscriptions, topics))
        except Exception:
            log.exception("registry listener failed on %s of group %s", kind.name, group)

    def _change(self, group_name: str) -> None:
        """Fire CHANGE for a group (callers have applied the notify and broadcasting rules)."""
        if not self.config.notify_consumer_ids_changed_enable:
            return
        if ConsumerGroupEvent.CHANGE not in self._wants:
            return
        if self.config.notify_coalesce_window_ms > 0:
            if group_name not in self._pending:
                self._pending[group_name] = self._clock()
            return
        self._emit(ConsumerGroupEvent.CHANGE, group_name, channels=self._group_channels(
            self._consumers.get(group_name)))

    def flush_notifications(self, now: int | None = None, force: bool = False) -> int:
        """Deliver coalesced CHANGE events whose window has passed (all of them with ``force``).

        With ``notify_coalesce_window_ms`` W > 0, the first CHANGE of a group opens a window of W ms; further
        CHANGEs of that group inside it are absorbed; once it has passed, one CHANGE is delivered with the group's
        members at that time (channels closed meanwhile are gone from it; a removed group gives an empty list).
        The server calls this on a timer (W / 2 or finer). Returns the number of events delivered.
        """
        if not self._pending:
            return 0
        now = self._clock() if now is None else now
        window = self.config.notify_coalesce_window_ms
        due = [g for g, t in self._pending.items() if force or now - t >= window]
        for group in due:
            del self._pending[group]
            self._emit(ConsumerGroupEvent.CHANGE, group, channels=self._group_channels(self._consumers.get(group)))
        return len(due)

    # =========================================================================================== channels
    def open_channel(self, channel, remote_addr: str = "") -> None:
        """Note a new connection and its remote address ("ip:port"). Optional: an unknown channel is opened by its
        first heartbeat, with the address taken from ``channel.remote_addr`` when it has a str one."""
        slot = self._find_slot(channel)
        if slot is None:
            self._new_slot(channel, remote_addr)
        elif remote_addr:
            ct = self.channel_table
            old = ct.addr(slot)
            ct.set_addr(slot, self._encode_addr(remote_addr))
            if old < 0:
                self._pool.release(-old - 1)

    def _slot_for(self, channel) -> int:
        slot = self._find_slot(channel)
        if slot is None:
            addr = getattr(channel, "remote_addr", None)
            slot = self._new_slot(channel, addr if isinstance(addr, str) else "")
        return slot

    # =========================================================================================== heartbeat
    def heartbeat(self, channel, hb, language=LanguageCode.JAVA, version: int = 0) -> HeartbeatResult:
        """HEART_BEAT (PROTOCOL.md 6.3, V2 in 5.4): register the producers and consumers of ``hb`` on ``channel``.

        ``language`` and ``version`` are the request header's. Returns the answer: SUCCESS with the V2 ext fields
        (V1: ``IS_SUB_CHANGE`` always "true"), or SYSTEM_ERROR for a body Java would fail on (see the module doc).
        """
        slot = self._find_slot(channel)
        if slot is not None:
            ct = self.channel_table
            armed = ct.armed(slot)
            if armed and self._config_epoch < armed and (
                    ((by := ct.armed_by(slot))[0] is hb and by[1] == language and by[2] == version)
                    or _digest_or_none(hb, language, version) == ct.fkey(slot)):
                consumers = self._consumers
                reject = self._reject_pull
                for cd in hb.consumers:
                    if reject and cd.consume_type is _CONSUME_ACTIVELY:
                        continue
                    g = consumers.get(cd.group)
                    if g is None or g.epoch >= armed:
                        break
                else:
                    now = self._clock()
                    ct.touch(slot, now)
                    v1 = hb.fingerprint == 0 or self._rules4
                    if self._want_register and (v1 or not hb.without_sub):
                        self._request = (channel, hb.client_id, language, version, now, slot)
                        for cd in hb.consumers:
                            if not (reject and cd.consume_type is _CONSUME_ACTIVELY):
                                self._emit(ConsumerGroupEvent.REGISTER, cd.group, client=self._request_info(),
                                           subscriptions=cd.subscriptions)
                        self._request = None
                    return self._result_v1 if v1 else _RESULT_V2_SAME
        return self._heartbeat(channel, slot, hb, language, version)

    def repeat_token(self, channel, hb, language=LanguageCode.JAVA, version: int = 0):
        """A token for :meth:`heartbeat_repeat`, when the heartbeat just handled on ``channel`` (``hb`` with this
        request header) armed the fast path; else None. Also None while REGISTER events are wanted: a repeat
        served on a token emits nothing."""
        slot = self._find_slot(channel)
        if slot is None or self._want_register:
            return None
        ct = self.channel_table
        armed = ct.armed(slot)
        by = ct.armed_by(slot)
        if (not armed or self._config_epoch >= armed or by is None or by[0] is not hb or by[1] != language
                or by[2] != version):
            return None
        # one flat tuple (slot, arming, group name, group, ..., result): a connection holds its token while its
        # repeat route is armed, so its size is per-connection memory (the arming tick is the slot's own column)
        token = [slot, by]
        for cd in hb.consumers:
            if self._reject_pull and cd.consume_type is _CONSUME_ACTIVELY:
                continue
            g = self._consumers.get(cd.group)
            if g is None or g.epoch >= armed:
                return None
            token.append(cd.group)
            token.append(g)
        token.append(self._result_v1 if hb.fingerprint == 0 or self._rules4 else _RESULT_V2_SAME)
        return tuple(token)

    def heartbeat_repeat(self, token) -> HeartbeatResult | None:
        """:meth:`heartbeat` once more for the request ``token`` stands for, on the fast path's own conditions
        (the same arming of the slot, no config or group change since). None when they no longer hold: then
        nothing was done and the request is to go through :meth:`heartbeat`."""
        slot = token[0]
        ct = self.channel_table
        try:
            # the same arming (a new one is another object) and not disarmed since (disarming zeroes the tick)
            if ct.armed_by(slot) is not token[1]:
                return None
            armed = ct.armed(slot)
        except ChannelTableError:  # the slot was freed since
            return None
        if self._config_epoch >= armed:
            return None
        consumers = self._consumers
        for i in range(2, len(token) - 1, 2):
            g = token[i + 1]
            if consumers.get(token[i]) is not g or g.epoch >= armed:
                return None
        ct.touch(slot, self._clock())
        return token[-1]

    def _request_info(self) -> ClientChannelInfo:
        """The ClientChannelInfo Java builds for the request being handled (events carry it)."""
        channel, client_id, language, version, now, slot = self._request
        return ClientChannelInfo(channel, client_id, _language_of(_language_code(language)), version, now,
                                 self._decode_addr(self.channel_table.addr(slot)))

    def _heartbeat(self, channel, slot, hb, language, version) -> HeartbeatResult:
        """The Python rule path: the twin of the native rules, and the path of every heartbeat they decline."""
        client_id = hb.client_id
        if not isinstance(client_id, str):
            return HeartbeatResult(ResponseCode.SYSTEM_ERROR, "HeartbeatData.clientID is null", False)
        for cd in hb.consumers:
            if not isinstance(cd.group, str):
                return HeartbeatResult(ResponseCode.SYSTEM_ERROR, "ConsumerData.groupName is null", False)
        for pd in hb.producers:
            if not isinstance(pd.group, str):
                return HeartbeatResult(ResponseCode.SYSTEM_ERROR, "ProducerData.groupName is null", False)
        nmem = self.channel_table.nmem(slot) if slot is not None else 0
        named = len(hb.consumers) + len(hb.producers)
        cfg = self.config
        if (nmem + named > cfg.max_groups_per_channel or self._nmemberships + named > cfg.max_memberships
                or len(self._consumers) + len(self._producers) + named > cfg.max_groups):
            # the registry's budgets (Java has none): refused before any change. Counted first as if every group
            # named were new (the cheap bound), then, past it, only the distinct groups that would be new
            refusal = self._budget_refusal(slot, hb, nmem)
            if refusal is not None:
                return HeartbeatResult(ResponseCode.SYSTEM_ERROR, refusal, False)
        try:
            language_code = _language_code(language)
            version = int(version)
        except (TypeError, ValueError):
            return HeartbeatResult(ResponseCode.SYSTEM_ERROR, "bad language or version", False)
        if not -(1 << 31) <= version < 1 << 31:
            return HeartbeatResult(ResponseCode.SYSTEM_ERROR, "version must fit in int32", False)
        now = self._clock()
        if slot is None:
            slot = self._slot_for(channel)
        self._dirty = False
        self._request = (channel, client_id, language, version, now, slot)
        pool = self._pool
        cid = pool.intern(client_id)  # held for the request, released in the finally
        try:
            req = (cid, language_code, version)
            topics = self.store.topics
            fingerprint = hb.fingerprint
            rules4 = self._rules4
            v2 = fingerprint != 0 and not rules4  # a 4.9 broker's HeartbeatData has no fingerprint (fastjson drops it)
            light = v2 and hb.without_sub
            self._request_v2 = v2
            sub_change = False
            refreshed = []
            consumers = self.consumers
            for cd in hb.consumers:
                if self._reject_pull and cd.consume_type is _CONSUME_ACTIVELY:
                    continue
                group = cd.group
                if rules4:
                    # ClientManageProcessor.heartBeat of 4.9.x: no fingerprint table, no hasOrderTopicSub; a group
                    # without config is registered anyway (notify on) and gets no retry topic
                    sgc = self._find_subscription_group_config(group)
                    if sgc is not None:
                        self._create_retry_topic(group, sgc.retry_queue_nums, None,
                                                 FLAG_UNIT_SUB if cd.unit_mode else 0)
                    notify = sgc.notify_consumer_ids_changed_enable if sgc is not None else True
                    refreshed.append(consumers.register(group, slot, req, cd, notify))
                    continue
                prev = self._fingerprints.get(group)
                if v2:
                    if prev is not None and prev != fingerprint:
                        sub_change = True
                    elif light and cfg.v2_restart_safe and (prev is None or group not in self._consumers):
                        sub_change = True  # the broker lacks this group's subscriptions: ask for a full heartbeat
                if prev != fingerprint:
                    self._fingerprints[group] = fingerprint
                    g = self._consumers.get(group)
                    if g is not None:
                        self._touch(g)
                    self._dirty = True
                has_order_topic_sub = False
                for sd in cd.subscriptions:
                    if topics.is_order_topic(sd.topic):
                        has_order_topic_sub = True
                        break
                sgc = self._find_subscription_group_config(group)
                if sgc is None:
                    if prev is None and self.store.at_auto_create_limit(self.store.groups):
                        # Java keeps the fingerprint of a skipped group for good; past the auto-create limit that
                        # would let every new group name still grow this table (a later heartbeat of the group only
                        # misses an IS_SUB_CHANGE it cannot use: the group is not registered)
                        self._fingerprints.pop(group, None)
                    continue  # 5.1.1+: not registered, the heartbeat still succeeds
                self._create_retry_topic(group, sgc.retry_queue_nums, has_order_topic_sub,
                                         FLAG_UNIT_SUB if cd.unit_mode else 0)
                if light:
                    refreshed.append(consumers.register_without_sub(group, slot, req, cd,
                                                                    sgc.notify_consumer_ids_changed_enable))
                else:
                    refreshed.append(consumers.register(group, slot, req, cd, sgc.notify_consumer_ids_changed_enable))
            if hb.producers:
                register_producer = self.producers.register
                for pd in hb.producers:
                    refreshed.append(register_producer(pd.group, slot, req))
            covered_all = self._refresh(slot, refreshed, now) if refreshed else False
            result = self._result_v1 if not v2 else (_RESULT_V2_CHANGED if sub_change else _RESULT_V2_SAME)
            if covered_all and not self._dirty:
                # this run changed nothing: the same heartbeat may be answered by the fast path until a change
                digest = _digest_or_none(hb, language, version)
                if digest is not None:
                    self.channel_table.arm(slot, digest, (hb, language, version), self._tick + 1)
            return result
        finally:
            pool.release(cid)
            self._request = None  # the request's channel is not kept past it

    def _budget_refusal(self, slot, hb, nmem: int) -> str | None:
        """The remark refusing ``hb`` when it would pass a budget of the registry, else None. Counts the distinct
        groups it names that the channel (``slot``, None: not open) is not a member of yet, and those that do not
        exist yet: at least what the heartbeat adds (a group it names may still not be registered, e.g. no config)."""
        ct = self.channel_table
        reject = self._reject_pull
        new_memberships = new_groups = 0
        for table, names in ((self._consumers, {cd.group for cd in hb.consumers
                                                if not (reject and cd.consume_type is _CONSUME_ACTIVELY)}),
                             (self._producers, {pd.group for pd in hb.producers})):
            for name in names:
                g = table.get(name)
                if g is None:
                    new_groups += 1
                if g is None or slot is None or ct.mem_pos(slot, g.key) < 0:
                    new_memberships += 1
        cfg = self.config
        if nmem + new_memberships > cfg.max_groups_per_channel:
            return f"a channel is registered in {cfg.max_groups_per_channel} groups at most"
        if self._nmemberships + new_memberships > cfg.max_memberships:
            return f"the broker holds {cfg.max_memberships} group registrations at most"
        if len(self._consumers) + len(self._producers) + new_groups > cfg.max_groups:
            return f"the broker holds {cfg.max_groups} consumer and producer groups at most"
        return None

    def _refresh(self, slot: int, refreshed: list, now: int) -> bool:
        """Set the refreshed memberships' time to ``now``; the others keep their own (older) time.

        Returns whether every membership of the slot was refreshed (a precondition of the fast path).
        """
        code = self.channel_table.refresh(slot, refreshed, now)
        if code != 1:
            self._dirty = True  # own times dropped (2) or kept (0)
        return code != 0

    def _find_subscription_group_config(self, group: str):
        cfg = self.config
        sgc, created = self.store.groups.find(group, cfg.auto_create_subscription_group, cfg.enable_create_sys_group)
        if created:
            self._dirty = True
            if self.client_log.allow("group_created", logging.INFO):
                jl.log.info("auto create a subscription group, %s", jl.subscription_group_config(sgc))
        return sgc

    def _create_retry_topic(self, group, queue_nums, is_order, sys_flag) -> None:
        topic = RETRY_GROUP_TOPIC_PREFIX + group
        topics = self.store.topics
        existed = topics.contains(topic)
        tc, changed = topics.create_topic_in_send_message_back_method(topic, queue_nums, PERM_READ | PERM_WRITE,
                                                                      is_order, sys_flag)
        if changed:  # tc is None (not changed) when the topic table is at its auto-create limit
            self._dirty = True
            if existed or tc.order:
                # isOrderTopic(topic) changed: it feeds hasOrderTopicSub of the groups subscribing to it
                for name in self._topic_groups.get(topic, ()):
                    g = self._consumers.get(name)
                    if g is not None:
                        self._touch(g)

    # =========================================================================================== unregister
    def unregister(self, channel, client_id, producer_group=None, consumer_group=None, language=None,
                   version: int = 0) -> tuple:
        """UNREGISTER_CLIENT (6.4): remove the channel's entry from the named groups; ``""`` counts as absent.

        Returns ``(code, remark)``: SUCCESS, or SYSTEM_ERROR when ``client_id`` is None (a required header field).
        """
        if client_id is None:
            return ResponseCode.SYSTEM_ERROR, "the custom field <clientID> is null"
        slot = self._find_slot(channel)
        req_info = None

        def request_info():
            nonlocal req_info
            if req_info is None:
                addr = self._decode_addr(self.channel_table.addr(slot)) if slot is not None else ""
                req_info = ClientChannelInfo(channel, client_id, language, version, self._clock(), addr)
            return req_info

        if producer_group:
            self.producers.unregister(channel, slot, client_id, producer_group, language, version, request_info)
        if consumer_group:
            sgc = self._find_subscription_group_config(consumer_group)  # may auto-create, as Java's does
            notify = sgc.notify_consumer_ids_changed_enable if sgc is not None else True
            self.consumers.unregister(slot, consumer_group, notify, request_info)
        return ResponseCode.SUCCESS, None

    # =========================================================================================== close
    def close_channel(self, channel) -> bool:
        """A connection closed, errored or went idle (6.6.5, 6.8): remove it from every group and free its slot.

        Producers first, then consumers, as ClientHousekeepingService does. CHANGE goes to the remaining members
        of every consumer group the channel was in unless the group is BROADCASTING (the group's notify flag is
        not consulted here). Returns whether the channel was in any group.
        """
        slot = self._find_slot(channel)
        if slot is None:
            return False
        ct = self.channel_table
        keys = ct.mem_keys(slot)
        removed = bool(keys)
        kinds = ct.kinds(slot)
        if kinds & 2:  # producers first, as ClientHousekeepingService
            self.producers.close_channel(slot, keys, channel)
        if kinds & 1:
            self.consumers.close_channel(slot, keys, channel)
        self._free_slot(slot)
        return removed

    # =========================================================================================== expiry
    def scan_expired(self, now: int | None = None) -> list:
        """scanNotActiveChannel of both managers (6.6.6, 6.8): remove every entry silent for longer than its timeout
        and return the channels to close (each once, in slot order).

        Expired entries go without UNREGISTER and CHANGE (CLIENT_UNREGISTER, and GROUP_UNREGISTER for emptied
        producer groups, still fire); an emptied consumer group is dropped silently. A channel that still has
        fresh entries keeps them until the server closes it and calls :meth:`close_channel`, which then notifies.
        """
        now = self._clock() if now is None else now
        ct = self.channel_table
        # the table's native scan over its scan-key column (the oldest membership time, producer ones shifted)
        candidates = ct.scan(now, self._timeout)
        if not candidates:
            return []
        expired = [ct.expired_keys(slot, now, self._timeout, PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS)
                   for slot in candidates]
        self.producers.scan_expired(candidates, expired)  # ProducerManager's scan runs before ConsumerManager's
        self.consumers.scan_expired(candidates, expired)
        return [ct.channel(slot) for slot, keys in zip(candidates, expired) if keys]

    # =========================================================================================== config checks
    def check_client_config(self, body) -> tuple:
        """CHECK_CLIENT_CONFIG (6.5): ``(code, remark)`` for a CheckClientRequestBody.

        ``body`` is the decoded JSON (a dict with ``subscriptionData``), an object with a ``subscription_data``
        attribute, or None.
        """
        if body is None:
            return ResponseCode.SUCCESS, None
        if isinstance(body, dict):
            sd = body.get("subscriptionData")
        else:
            sd = getattr(body, "subscription_data", None)
        if sd is None:
            return ResponseCode.SUCCESS, None
        if isinstance(sd, dict):
            expression_type, sub_string = sd.get("expressionType"), sd.get("subString")
        else:
            expression_type, sub_string = getattr(sd, "expression_type", None), getattr(sd, "sub_string", None)
        if expression_type is None or expression_type == "" or expression_type == "TAG":
            return ResponseCode.SUCCESS, None
        if not self.config.enable_property_filter:
            return ResponseCode.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {expression_type}"
        from engine.registry.sql92 import FilterError, compile_filter

        try:
            compile_filter(expression_type, sub_string)
        except FilterError as e:
            return ResponseCode.SUBSCRIPTION_PARSE_FAILED, e.args[0] if e.args else None
        return ResponseCode.SUCCESS, None

    # =========================================================================================== queries
    def consumer_ids(self, group: str) -> list:
        """Client ids of the group's channels in table order (GET_CONSUMER_LIST_BY_GROUP); [] if unknown."""
        return self.consumers.consumer_ids(group)

    def consumer_group_info(self, group: str) -> ConsumerGroupInfo | None:
        return self.consumers.group_info(group)

    def consumer_connection(self, group: str) -> ConsumerConnection | None:
        """GET_CONSUMER_CONNECTION_LIST (203) data, or None when the group is not online."""
        return self.consumers.connection(group)

    def producer_connection(self, group: str) -> ProducerConnection | None:
        """GET_PRODUCER_CONNECTION_LIST (204) data, or None when the group does not exist."""
        return self.producers.connection(group)

    def producer_channels(self, group: str) -> list:
        """ClientChannelInfo of each channel of a producer group (table order)."""
        return self.producers.channels(group)

    def find_producer_channel(self, client_id: str):
        """ProducerManager.findChannel: the channel last registered for a producer client id, or None."""
        return self.producers.find_channel(client_id)

    def find_subscription(self, group: str, topic: str):
        """ConsumerManager.findSubscriptionData: the group's SubscriptionData for a topic, or None."""
        return self.consumers.find_subscription(group, topic)

    def topic_consumed_by(self, topic: str) -> set:
        """queryTopicConsumeByWho: groups recorded for the topic (topicGroupTable, with Java's stale entries);
        under 4.x rules the live groups whose subscription table has the topic (4.9 has no topicGroupTable)."""
        return self.consumers.topic_consumed_by(topic)

    def fingerprint(self, group: str):
        """The last V2 fingerprint stored for a consumer group (0 after a V1 heartbeat), or None."""
        return self._fingerprints.get(group)

    def consumer_groups(self) -> list:
        return self.consumers.groups()

    def producer_groups(self) -> list:
        return self.producers.groups()

    def groups(self) -> list:
        """Names of all consumer and producer groups, sorted."""
        return sorted(set(self._consumers) | set(self._producers))

    def channel_info(self, channel) -> ClientChannelInfo | None:
        """The channel's own client id, language, version, latest heartbeat and address (None if unknown)."""
        slot = self._find_slot(channel)
        if slot is None:
            return None
        ct = self.channel_table
        cid, lang, ver = ct.client(slot)
        return ClientChannelInfo(channel, self._pool.get(cid) if cid >= 0 else None, _language_of(lang), ver,
                                 ct.last(slot), self._decode_addr(ct.addr(slot)))

    def channel_groups(self, channel) -> tuple:
        """``(consumer groups, producer groups)`` the channel is registered in."""
        slot = self._find_slot(channel)
        if slot is None:
            return (), ()
        keys = self._mem_keys(slot)
        return (tuple(self._gnames[k >> 1] for k in keys if k & 1 == _CONSUMER),
                tuple(self._gnames[k >> 1] for k in keys if k & 1 == _PRODUCER))

    @property
    def channel_count(self) -> int:
        """Open channels (with or without registrations)."""
        return len(self.channel_table)

    @property
    def registered_channel_count(self) -> int:
        return self.channel_table.registered_count()

    def group_stats(self):
        """(role, group, distinct client ids, channels) per group, for metrics."""
        out = []
        for role, table in (("consumer", self._consumers), ("producer", self._producers)):
            for name, g in table.items():
                slots = self.channel_table.group_slots(g.key)
                clients = {self._member_info(s, g.key)[0] for s in slots}
                out.append((role, name, len(clients), len(slots)))
        return out

    def stats(self) -> dict:
        """Counts for metrics and tests."""
        return {
            "channels": len(self.channel_table),
            "registered_channels": self.registered_channel_count,
            "consumer_groups": len(self._consumers),
            "producer_groups": len(self._producers),
            "consumer_memberships": sum(self.channel_table.group_size(g.key) for g in self._consumers.values()),
            "producer_memberships": sum(self.channel_table.group_size(g.key) for g in self._producers.values()),
            "interned_strings": len(self._pool),
            "interned_groups": len(self._gid),
            "slot_capacity": self.channel_table.capacity,
            "pending_notifications": len(self._pending),
        }

    def nbytes(self) -> int:
        """Bytes of the flat arrays (slot columns, string pool, client table); Python objects not included."""
        return self.channel_table.nbytes() + self._pool.nbytes() + self.producers.nbytes()

    # =========================================================================================== store
    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.store.topics.get(topic)

    def topic_configs(self) -> list:
        return list(self.store.topics.table.values())

    def subscription_group_config(self, group: str) -> SubscriptionGroupConfig | None:
        return self.store.groups.get(group)

    def update_topic_config(self, config: TopicConfig, derivable: bool = False) -> None:
        """Create or replace a topic (admin); invalidates fast paths since order flags feed the rules.

        ``derivable``: auto-created by traffic that will create it again, so its write may wait (engine.registry.store.Store).
        """
        self.store.topics.put(config, derivable)
        self._config_changed()

    def delete_topic_config(self, topic: str) -> bool:
        removed = self.store.topics.delete(topic) is not None
        if removed:
            self._config_changed()
        return removed

    def update_subscription_group_config(self, config: SubscriptionGroupConfig) -> None:
        self.store.groups.put(config)
        self._config_changed()

    def delete_subscription_group_config(self, group: str) -> bool:
        removed = self.store.groups.delete(group) is not None
        if removed:
            self._config_changed()
        return removed

    def update_consumer_offset(self, client_host, group, topic, queue_id, offset) -> tuple:
        """UPDATE_CONSUMER_OFFSET (ConsumerManageProcessor): ``(code, remark)``. 5.x (5.3+) commits only for a
        group and a topic that exist; 4.9 commits any (a 4.x consumer of a group without config keeps its
        offsets), within the table's budget under both."""
        if not self._rules4:
            if not self.store.groups.contains(group):
                return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"Group {group} not exist!"
            if not self.store.topics.contains(topic):
                return ResponseCode.TOPIC_NOT_EXIST, f"Topic {topic} not exist!"
        if queue_id is None:
            return ResponseCode.SYSTEM_ERROR, f"QueueId is null, topic is {topic}"
        if offset is None:
            return ResponseCode.SYSTEM_ERROR, f"Offset is null, topic is {topic}"
        if not self.store.offsets.commit_offset(client_host, group, topic, queue_id, offset):
            return ResponseCode.SYSTEM_ERROR, ("the consumer offset table is full (maxConsumerOffsetEntries="
                                               f"{self.store.max_offset_entries})")
        return ResponseCode.SUCCESS, None

    def query_consumer_offset(self, group, topic, queue_id) -> int:
        """ConsumerOffsetManager.queryOffset: the committed offset, or -1 (the processor answers by the rules)."""
        return self.store.offsets.query_offset(group, topic, queue_id)

    def persist_offsets(self) -> None:
        self.store.persist_offsets()

    def persist(self) -> None:
        self.store.persist()

    def persist_due(self) -> int:
        """Write the config files whose deferred (derivable) changes are due; the broker calls it every second."""
        return self.store.persist_due()

    # =========================================================================================== checks
    def check_invariants(self) -> None:
        """Verify the table invariants (tests and debugging); raises AssertionError on the first violation."""
        pool_refs: dict[int, int] = {}

        def ref(cid):
            pool_refs[cid] = pool_refs.get(cid, 0) + 1

        ct = self.channel_table
        ct.check()  # slots, memberships, member arrays, scan keys, side tables
        for channel, slot in ct.items():
            keys = ct.mem_keys(slot)
            for k in keys:
                g = (self._cgroup if k & 1 == _CONSUMER else self._pgroup)[k >> 1]
                assert g is not None and g.key == k, f"slot {slot} in a dropped group"
            for cid in ct.info_cids(slot):
                ref(cid)
            cid = ct.client(slot)[0]
            if cid >= 0:
                ref(cid)
            addr = ct.addr(slot)
            if addr < 0:
                ref(-addr - 1)
        for slot in self._stale_client:
            assert ct.in_use(slot), f"stale producer client entries of free slot {slot}"
        for table, kind, by_gid in ((self._consumers, _CONSUMER, self._cgroup), (self._producers, _PRODUCER,
                                                                               self._pgroup)):
            for name, g in table.items():
                assert ct.group_size(g.key) > 0, f"empty group {name} kept"
                assert self._gid[name] == g.gid and by_gid[g.gid] is g and self._gnames[g.gid] == name
                members = ct.group_slots(g.key)
                assert len(set(members)) == len(members)
                for pos, slot in enumerate(members):
                    assert ct.mem_pos(slot, g.key) == pos
        assert self._nmemberships == sum(ct.group_size(g.key) for t in (self._consumers, self._producers)
                                         for g in t.values()), "membership count"
        for name, gid in self._gid.items():
            expected = (name in self._consumers) + (name in self._producers)
            assert self._grefs[gid] == expected > 0, f"group id of {name} has {self._grefs[gid]} refs"
        for cid, slot in self.producers.client_table_items():
            assert ct.in_use(slot), f"producer client table entry {cid} on free slot {slot}"
            ref(cid)
        self.producers.check_invariants()
        self.consumers.check_invariants()
        assert len(self._pool) == len(pool_refs), "interned strings without a reference"
        for cid, n in pool_refs.items():
            assert self._pool.refs(cid) == n, f"string {cid}: {self._pool.refs(cid)} refs, {n} expected"
        self._pool.check()
