# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Native rule paths of :class:`ClientRegistry` (twin: its Python paths in engine/registry/, which are the
specification: the same state, answers, events and log lines): ``heartbeat`` (``ClientRegistry.heartbeat`` and
``_heartbeat`` with ``ConsumerManager.register`` and ``ProducerManager.register``), ``heartbeat_repeat`` (the
repeat route's check of its token), ``consumer_ids`` (the consumer list), ``open_channel`` and ``close_channel``
(with the managers' ``close_channel``).
A registry builds them when its listener wants no event but CHANGE and its channel table and string pool are the
native ones (:meth:`HeartbeatRules.usable`); their methods then stand in for the registry's
(``ClientRegistry._use_rules``).

A heartbeat they take when it changes no more than the channel's memberships, its groups' subscriptions and
consume settings, and the times: every consumer group named exists with its subscription-group config and its
retry topic (under 5.x rules also with the order flag the heartbeat implies, and its V2 fingerprint unchanged);
every producer group exists; the channel's memberships hold the request's client id; it is not a light V2 one and
stays within the budgets even if every group it names were new; it is the native decoder's model (whose fields,
like the table's and the pool's, they reach directly through the .pxd files). Any other heartbeat they decline
having changed nothing, and the Python path takes it. Opens and closes they take whole. Java's log lines and
CHANGE go through the managers' and the registry's own methods.
"""
import logging

from engine.codec.enums import ConsumeType, LanguageCode, MessageModel
from engine.registry import clientlog
from engine.registry.consumer_manager import ConsumerGroupEvent

from engine.codec._heartbeat cimport ConsumerData, HeartbeatData, ProducerData, SubscriptionData
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)

from engine.registry._channel_table cimport ChannelTable, c_pack_ipv4
from engine.registry._channel_table import ChannelTableError
from engine.registry._channel_table import pack_ipv4 as _native_pack_ipv4
from engine.registry._intern cimport StringPool

__all__ = ["HeartbeatRules"]

cdef object _ACTIVELY = ConsumeType.CONSUME_ACTIVELY
cdef object _PASSIVELY = ConsumeType.CONSUME_PASSIVELY
cdef object _BROADCASTING = MessageModel.BROADCASTING
cdef int _NO_LANGUAGE = 255
cdef int _INFO = logging.INFO
cdef int _WARNING = logging.WARNING
cdef object _JAVA = LanguageCode.JAVA
DEF FEW_KEYS = 8  # refreshed keys a request dedupes in C (more: the table's refresh)


cdef class HeartbeatRules:
    """The native rule path of one registry (built by it; see the module docstring)."""

    cdef object reg, consumers, producers, topic_configs, group_configs, digest, logs_at, pack_ipv4
    #: the logger's level cache (logging.Logger._cache, cleared in place by setLevel), None: ask logs_at
    cdef object log, log_cache
    cdef bint c_pack
    cdef object python_heartbeat, python_repeat
    #: heartbeats these rules took and declined (handle, heartbeat)
    cdef readonly unsigned long long taken, declined
    cdef ChannelTable ct
    cdef StringPool pool
    cdef dict cgroups, pgroups, fingerprints, topic_groups, stale
    cdef list cby_gid, pby_gid
    #: whether ClientRegistry._change would do anything (the notify switch and the wanted events are fixed)
    cdef bint want_change
    #: the request's ClientRegistry._dirty (this path's own: the registry's is the Python path's scratch flag)
    cdef bint dirty
    #: the request as ClientRegistry._request holds it ((channel, client id, language, version, now, slot)),
    #: published there (built from these fields) only for a log line that prints it
    cdef object req_channel, req_client_id, req_language, req_version, req_now
    cdef Py_ssize_t req_slot
    #: the request's client info as the table stores it: pool id (a reference held for the request), language
    #: code, version
    cdef int32_t req_cid, req_ver
    cdef uint8_t req_code
    cdef bint request_v2, published
    #: whether the logger writes INFO / WARNING lines, asked once a request (-1: not asked yet)
    cdef int info_on, warning_on
    cdef object result_v1, result_same
    cdef bint reject_pull, rules4
    cdef Py_ssize_t max_per_channel, max_groups
    cdef long long max_memberships

    @staticmethod
    def usable(table, pool) -> bool:
        """Whether the rules can work over this channel table and string pool (the native ones)."""
        return type(table) is ChannelTable and type(pool) is StringPool

    def __init__(self, reg, digest, result_v1, result_same, pack_ipv4, python_heartbeat):
        cfg = reg.config
        self.pack_ipv4 = pack_ipv4
        self.c_pack = pack_ipv4 is _native_pack_ipv4  # the same function, called in C
        self.python_heartbeat = python_heartbeat  # the unbound ClientRegistry.heartbeat
        self.python_repeat = type(reg).heartbeat_repeat
        self.reg = reg
        self.ct = reg.channel_table
        self.pool = reg._pool
        self.consumers = reg.consumers
        self.producers = reg.producers
        self.cgroups = reg.consumers.group_table
        self.pgroups = reg.producers.group_table
        self.fingerprints = reg._fingerprints
        self.topic_groups = reg.consumers.topic_groups
        self.cby_gid = reg.consumers.by_gid
        self.pby_gid = reg.producers.by_gid
        self.stale = reg.producers.stale
        self.topic_configs = reg.store.topics  # TopicConfigManager: its table is replaced by a load
        self.group_configs = reg.store.groups
        self.digest = digest
        self.log = clientlog.log
        self.logs_at = self.log.isEnabledFor  # the level may change at any time: asked per request
        # Logger.isEnabledFor answers from the logger's _cache dict while it holds the level (setLevel and
        # logging.disable clear it in place); read here without a Python call, asked through logs_at on a miss
        cache = getattr(self.log, "_cache", None)
        self.log_cache = (cache if type(self.log) is logging.Logger and type(cache) is dict
                          and type(self.log).isEnabledFor is logging.Logger.isEnabledFor else None)
        self.want_change = (cfg.notify_consumer_ids_changed_enable
                            and ConsumerGroupEvent.CHANGE in reg._wants)
        self.result_v1, self.result_same = result_v1, result_same  # the answers of a heartbeat they take
        self.reject_pull = reg._reject_pull
        self.rules4 = reg._rules4
        self.max_per_channel = cfg.max_groups_per_channel
        self.max_groups = cfg.max_groups
        self.max_memberships = cfg.max_memberships

    # ------------------------------------------------------------------------------------------- the entries
    def handle(self, channel, hb, language=_JAVA, version=0):
        """ClientRegistry.heartbeat: the fast path of an armed slot, then these rules, then the Python path
        (``ClientRegistry._heartbeat``) for what they decline. A heartbeat of the twin decoder's model goes to
        the registry's Python method whole."""
        cdef ChannelTable ct = self.ct
        cdef HeartbeatData h
        cdef ConsumerData cd
        cdef int64_t armed
        cdef Py_ssize_t s
        if type(hb) is not HeartbeatData:
            return self.python_heartbeat(self.reg, channel, hb, language, version)
        h = <HeartbeatData>hb
        s = ct.c_find(channel)
        if s >= 0:
            armed = ct._armed[s]  # s: the table's own answer, below its top (the columns' and lists' length)
            if armed and self.reg._config_epoch < armed:
                by = ct._armed_by[s]
                if ((by is not None and by[0] is hb and by[1] == language and by[2] == version)
                        or self._digest_or_none(hb, language, version) == ct._fkey[s]):
                    for o in h.consumers:
                        if type(o) is ConsumerData:
                            cd = <ConsumerData>o
                            consume_type, group = cd.consume_type, cd.group
                        else:  # a native HeartbeatData built by hand may hold the twin's ConsumerData
                            consume_type, group = o.consume_type, o.group
                        if self.reject_pull and consume_type is _ACTIVELY:
                            continue
                        g = self.cgroups.get(group)
                        if g is None or g.epoch >= armed:
                            break
                    else:
                        ct.touch(s, self.reg._clock())
                        return self.result_v1 if h.fingerprint == 0 or self.rules4 else self.result_same
        result = self._take(channel, s, h, language, version)
        if result is not None:
            self.taken += 1
            return result
        self.declined += 1
        return self.reg._heartbeat(channel, None if s < 0 else s, hb, language, version)

    def heartbeat_repeat(self, token):
        """ClientRegistry.heartbeat_repeat (its twin): the token's answer once more, the slot touched, while the
        slot's arming, the config and every group of the token hold; else None, nothing done. A token the registry
        did not make (not a tuple with an int slot) goes to the Python method."""
        cdef ChannelTable ct = self.ct
        cdef tuple t
        cdef Py_ssize_t s, i, n
        cdef int64_t armed
        if type(token) is not tuple or len(<tuple>token) < 3 or type((<tuple>token)[0]) is not int:
            return self.python_repeat(self.reg, token)
        t = <tuple>token
        slot = t[0]
        if not 0 <= slot < ct._top:
            return None  # as a slot the table refuses (ChannelTableError) in the twin
        s = slot
        # the same arming (a new one is another object; a freed slot has none) and not disarmed since (zero tick)
        if not ct.c_in_use(s) or ct._armed_by[s] is not t[1]:
            return None
        armed = ct._armed[s]
        if self.reg._config_epoch >= armed:
            return None
        n = len(t)
        for i in range(2, n - 1, 2):
            g = self.cgroups.get(t[i])
            if g is not t[i + 1] or g.epoch >= armed:
                return None
        ct.touch(s, self.reg._clock())
        return t[n - 1]

    def consumer_ids(self, group):
        """ConsumerManager.consumer_ids (its twin): the client ids of the group's members in member-array order
        (GET_CONSUMER_LIST_BY_GROUP), [] for a group that is not live. In C: a group of 10k members is read in a
        fraction of the Python loop's time, and every member of a group asks for it after each change."""
        cdef ChannelTable ct = self.ct
        cdef StringPool pool = self.pool
        cdef int32_t k, i, n
        cdef int32_t* members
        cdef int64_t cid
        cdef list out = []
        g = self.cgroups.get(group)
        if g is None:
            return out
        k = g.key
        if not 0 <= k < ct._nkeys:
            return out
        n = ct._msize[k]
        members = ct._members[k]
        for i in range(n):  # the member array's first msize entries are live slots (the table's invariant)
            cid = ct.c_member_cid(members[i], k)
            if cid < 0:
                out.append(None)
            elif cid >= pool._top:  # a table holds only ids of its pool (never reached): refused, not read
                raise ChannelTableError(f"client id {cid} of slot {members[i]} is not in the string pool")
            elif pool._len[cid] == 0:
                out.append("")  # the arena may not exist yet
            else:
                out.append(PyUnicode_DecodeUTF8(pool._arena + pool._off[cid], pool._len[cid], "surrogatepass"))
        return out

    def heartbeat(self, channel, slot, hb, language, version):
        """The answer to ``hb`` on ``channel`` (``slot``: its slot, None when not open; ChannelTableError when not
        in use) by these rules, or None when the request is not one they take; then nothing was changed."""
        cdef Py_ssize_t s = -1 if slot is None else self.ct._slot(slot)
        if type(hb) is not HeartbeatData:
            self.declined += 1
            return None
        result = self._take(channel, s, <HeartbeatData>hb, language, version)
        if result is None:
            self.declined += 1
        else:
            self.taken += 1
        return result

    def open_channel(self, channel, remote_addr=""):
        """ClientRegistry.open_channel."""
        cdef ChannelTable ct = self.ct
        cdef Py_ssize_t s = ct.c_find(channel)
        cdef int64_t old
        if s < 0:
            self._new_slot(channel, remote_addr)
        elif remote_addr:
            old = ct._addr[s]
            ct.set_addr(s, self._encode_addr(remote_addr))
            if old < 0:
                self.pool.c_release_id(-(old + 1))

    cdef object _encode_addr(self, addr):
        """ClientRegistry._encode_addr."""
        if not addr or not isinstance(addr, str):
            return 0
        packed = c_pack_ipv4(addr) if self.c_pack else self.pack_ipv4(addr)
        return packed if packed else -(self.pool.c_intern(addr) + 1)

    cdef Py_ssize_t _new_slot(self, channel, remote_addr) except -1:
        """ClientRegistry._new_slot."""
        addr = self._encode_addr(remote_addr)
        try:
            return self.ct.open(channel, addr)
        except BaseException:
            if addr < 0:
                self.pool.c_release(-addr - 1)
            raise

    # ------------------------------------------------------------------------------------------- heartbeat
    cdef object _take(self, channel, Py_ssize_t s, HeartbeatData hb, language, version):
        """The rules on slot ``s`` (-1: the channel is not open)."""
        cdef Py_ssize_t nmem, named, nkeys, ndistinct, i, j
        cdef int code, rc
        cdef int32_t cid, k
        cdef int32_t keys[FEW_KEYS]
        cdef bint v2, has_order, covered_all
        cdef ConsumerData cd
        cdef ProducerData pd
        cdef ChannelTable ct = self.ct
        cdef int64_t cid_now = -2  # the pool id of the client id, looked up once when a membership's is compared
        reg = self.reg
        client_id = hb.client_id
        if type(client_id) is not str:
            return None
        self.pool.c_prefetch(client_id)  # interned after the plan: its index line comes in meanwhile
        v2 = hb.fingerprint != 0 and not self.rules4  # a 4.9 broker's HeartbeatData has no fingerprint
        if v2 and hb.without_sub:
            return None
        if type(version) is not int or not -(1 << 31) <= version < (1 << 31):
            return None  # compared as a Python int: any size declines, none raises
        if language is None:
            code = _NO_LANGUAGE
        elif isinstance(language, int) and not isinstance(language, bool):
            code = language if 0 <= language < _NO_LANGUAGE else _NO_LANGUAGE
        else:
            return None
        nmem = 0 if s < 0 else ct._nmem[s]
        named = len(hb.consumers) + len(hb.producers)
        if (nmem + named > self.max_per_channel or ct._memberships + named > self.max_memberships
                or len(self.cgroups) + len(self.pgroups) + named > self.max_groups):
            return None

        # plan: every condition of the module docstring, before any change
        cdef dict topics = self.topic_configs.table
        cdef dict configs = self.group_configs.table
        for o in hb.consumers:
            if type(o) is not ConsumerData:  # a model built by hand may hold the twin's objects
                return None
            cd = <ConsumerData>o
            group = cd.group
            if type(group) is not str:
                return None
            if self.reject_pull and cd.consume_type is _ACTIVELY:
                continue
            if group not in configs:  # 5.x: not registered; 4.x: registered without a config
                return None
            g = self.cgroups.get(group)
            if g is None:
                return None
            has_order = False
            for o in cd.subscriptions:
                if type(o) is not SubscriptionData:
                    return None
                if not has_order and not self.rules4:
                    tc = topics.get((<SubscriptionData>o).topic)
                    has_order = tc is not None and tc.order
            tc = topics.get(g.retry_topic)
            if tc is None:
                return None
            if self.rules4:
                pass  # 4.9's heartBeat: no fingerprint table, and an existing retry topic is left alone
            else:
                prev = self.fingerprints.get(group)
                if prev is None or prev != hb.fingerprint or bool(tc.order) != has_order:
                    return None
            if s >= 0:
                _live(ct, s)
                k = ct._key(g.key)
                if ct._find(s, k) >= 0:
                    if cid_now == -2:
                        cid_now = self.pool.c_lookup(client_id)
                    if ct.c_member_cid(s, k) != cid_now:
                        return None
        for o in hb.producers:
            if type(o) is not ProducerData:
                return None
            pd = <ProducerData>o
            if type(pd.group) is not str or pd.group not in self.pgroups:
                return None

        # apply, in the Python path's order
        now = self.reg._clock()  # read at each call, as the twin does (a test or an embedder may replace it)
        if s < 0:  # ClientRegistry._slot_for
            addr = getattr(channel, "remote_addr", None)
            s = self._new_slot(channel, addr if isinstance(addr, str) else "")
        self.dirty = False
        self.info_on = self.warning_on = -1
        self.req_channel, self.req_client_id, self.req_language, self.req_version = channel, client_id, language, version
        self.req_now = now
        self.req_slot = s
        self.request_v2 = v2
        cid = self.pool.c_intern(client_id)
        self.req_cid, self.req_code, self.req_ver = cid, <uint8_t>code, <int32_t>version
        refreshed = None  # the keys past the first FEW_KEYS
        try:
            nkeys = 0
            for cd in hb.consumers:
                if self.reject_pull and cd.consume_type is _ACTIVELY:
                    continue
                refreshed = _keep_key(keys, nkeys, self._register_consumer(cd, s, configs[cd.group]), refreshed)
                nkeys += 1
            for pd in hb.producers:
                refreshed = _keep_key(keys, nkeys, self._register_producer(pd.group, s), refreshed)
                nkeys += 1
            covered_all = False
            if nkeys:
                rc = -1
                if nkeys <= FEW_KEYS:
                    # the table's refresh, whose keys are every membership of the slot: without its set
                    ndistinct = 0
                    for i in range(nkeys):
                        for j in range(i):
                            if keys[j] == keys[i]:
                                break
                        else:
                            if ct._find(_live(ct, s), keys[i]) < 0:
                                break  # no longer a member (Python code ran): the table's refresh says so
                            ndistinct += 1
                    else:
                        if ndistinct == ct._nmem[s]:
                            rc = ct.c_refresh_all(s, now)
                    if rc < 0:
                        refreshed = [keys[i] for i in range(nkeys)]
                if rc < 0:
                    rc = ct.refresh(s, refreshed, now)
                if rc != 1:
                    self.dirty = True  # own times dropped (2) or kept (0)
                covered_all = rc != 0
            result = self.result_same if v2 else self.result_v1
            if covered_all and not self.dirty:
                digest = self._digest_or_none(hb, language, version)
                if digest is not None:
                    ct.arm(s, digest, (hb, language, version), reg._tick + 1)
            return result
        finally:
            self.pool.c_release_id(cid)
            # the request's objects are not kept past it
            self.req_channel = self.req_client_id = self.req_language = self.req_version = self.req_now = None
            if self.published:
                self.published = False
                reg._request = None

    cdef object _digest_or_none(self, hb, language, version):
        """client_registry._digest_or_none."""
        try:
            return self.digest(hb, language, version)
        except (TypeError, ValueError, OverflowError):
            return None

    cdef int _publish(self) except -1:
        """ClientRegistry._request and _request_v2 for the log lines that print the request."""
        if not self.published:
            self.reg._request = (self.req_channel, self.req_client_id, self.req_language, self.req_version,
                                 self.req_now, self.req_slot)
            self.reg._request_v2 = self.request_v2
            self.published = True
        return 0

    cdef bint _enabled(self, int level) except -1:
        """clientlog.log.isEnabledFor(level): from the logger's level cache when it holds the level."""
        cache = self.log_cache
        if cache is not None and not self.log.disabled:
            answer = (<dict>cache).get(level)
            if answer is not None:
                return bool(answer)
        return bool(self.logs_at(level))

    cdef bint _info(self) except -1:
        if self.info_on < 0:
            self.info_on = self._enabled(_INFO)
        return self.info_on

    cdef bint _warning(self) except -1:
        if self.warning_on < 0:
            self.warning_on = self._enabled(_WARNING)
        return self.warning_on

    cdef int _touch(self, g) except -1:
        """ClientRegistry._touch."""
        tick = self.reg._tick + 1
        self.reg._tick = tick
        g.epoch = tick
        self.dirty = True
        return 0

    cdef int32_t _register_consumer(self, ConsumerData cd, Py_ssize_t s, sgc) except -1:
        """ConsumerManager.register with updateChannel and updateSubscription for a group that exists and a
        channel whose membership, if any, holds the request's client id; returns the membership key."""
        cdef SubscriptionData sd, old
        cdef set groups
        cdef ChannelTable ct = self.ct
        cdef int32_t k
        reg = self.reg
        group = cd.group
        g = self.cgroups[group]
        for sd in cd.subscriptions:
            groups = self.topic_groups.get(sd.topic)
            if groups is None:
                self.topic_groups[sd.topic] = {group}
            else:
                groups.add(group)
        # updateChannel
        if (g.consume_type is not cd.consume_type or g.message_model is not cd.message_model
                or g.consume_from_where is not cd.consume_from_where):
            g.consume_type, g.message_model, g.consume_from_where = (cd.consume_type, cd.message_model,
                                                                     cd.consume_from_where)
            self._touch(g)
        _live(ct, s)
        k = ct._key(g.key)
        r1 = False
        if ct._find(s, k) < 0:
            self._add_member(k, s)
            self.dirty = True
            if self._info():
                self._publish()
                self.consumers.log_new_consumer(g, cd)
            r1 = True
        # updateSubscription
        cdef dict table = g.subscriptions
        changed = replaced = False
        for sd in cd.subscriptions:
            old_obj = table.get(sd.topic)
            if old_obj is None:
                table[sd.topic] = sd
                changed = True
                if self._info():
                    self.consumers.log_sub_added(g, sd)
            elif (sd.sub_version > (<SubscriptionData>old_obj).sub_version if type(old_obj) is SubscriptionData
                  else sd.sub_version > old_obj.sub_version):  # the twin's, kept from a twin-decoded heartbeat
                table[sd.topic] = sd
                replaced = True
                if g.consume_type is _PASSIVELY and self._info():
                    self.consumers.log_sub_replaced(g, old_obj, sd)
        # the table holds every topic of the request now: more is a removal. The count of distinct topics without
        # a set when they are a few exact str (pairwise ==, which is the set's equality for them)
        if _distinct_topics(cd.subscriptions) != len(table):
            topics = {sd.topic for sd in cd.subscriptions}
            if len(table) != len(topics):
                self.consumers.remove_topics(g, topics)
                changed = True
        if changed or replaced:
            self._touch(g)
        if (r1 or changed) and self.want_change and sgc.notify_consumer_ids_changed_enable \
                and (self.rules4 or g.message_model is not _BROADCASTING):  # 4.x: BROADCASTING groups too
            reg._change(group)
        if (r1 or changed) and self._info():
            self._publish()
            self.consumers.log_consumer_data(s, cd)
        return k

    cdef int _add_member(self, int32_t k, Py_ssize_t s) except -1:
        """ClientRegistry._add_member with the request's client info (the table counts the membership)."""
        cdef ChannelTable ct = self.ct
        cdef int32_t old
        if ct._nmem[_live(ct, s)] == 0:
            # the first registration on the channel sets the slot's own client id / language / version
            old = ct._cid[s]
            self.pool.c_acquire_id(self.req_cid)
            if old >= 0:
                self.pool.c_release_id(old)
            ct.c_set_client(s, self.req_cid, self.req_code, self.req_ver)
        ct._add(s, k)
        if ct._cid[s] != self.req_cid or ct._lang[s] != self.req_code or ct._ver[s] != self.req_ver:
            self.reg._set_member_info(s, k, (self.req_cid, self.req_code, self.req_ver))
        return 0

    cdef int32_t _register_producer(self, group, Py_ssize_t s) except -1:
        """ProducerManager.register for a group that exists; returns the membership key."""
        cdef ChannelTable ct = self.ct
        cdef int32_t k
        g = self.pgroups[group]
        _live(ct, s)
        k = ct._key(g.key)
        if ct._find(s, k) < 0:
            self._add_member(k, s)
            # ProducerManager.set_client_slot: a new clientChannelTable entry holds a reference on its client id
            if ct.c_set_client_slot(self.req_cid, _live(ct, s)) < 0:
                self.pool.c_acquire_id(self.req_cid)
            self.dirty = True
            if self._info():
                self._publish()
                self.producers.log_new_producer(group)
        return k

    # ------------------------------------------------------------------------------------------------ close
    def close_channel(self, channel):
        """ClientRegistry.close_channel (doChannelCloseEvent of both managers, producers first), for a registry
        whose listener wants no event but CHANGE: whether the channel was in any group."""
        cdef ChannelTable ct = self.ct
        cdef Py_ssize_t s = ct.c_find(channel)
        if s < 0:
            return False
        keys = ct._keys(s)
        kinds = ct._kinds[s]
        self.info_on = self.warning_on = -1
        if kinds & 2:
            self._close_producers(s, keys, channel)
        if kinds & 1:
            self._close_consumers(s, keys)
        self._free_slot(s)
        return bool(keys)

    cdef int _close_producers(self, Py_ssize_t s, list keys, channel) except -1:
        """ProducerManager.close_channel."""
        cdef ChannelTable ct = self.ct
        cdef int32_t k
        cdef int64_t cid
        producers = self.producers
        for key in keys:
            k = key
            if not k & 1:
                continue
            g = self.pby_gid[key >> 1]  # a Python index: checked
            if self._info():
                producers.log_closed(s, key, g, channel)
            # ProducerManager.drop_client_slot of the membership's client id, unconditionally, as Java does
            cid = ct.c_member_cid(_live(ct, s), k)
            if ct.c_drop_client_slot(cid, -1):
                self.pool.c_release_id(cid)
            self._remove_member(s, k)
            if not _group_size(ct, k):
                producers.drop_group(g)
                if self._info():
                    producers.log_group_removed(g.name)
        return 0

    cdef int _close_consumers(self, Py_ssize_t s, list keys) except -1:
        """ConsumerManager.close_channel."""
        cdef ChannelTable ct = self.ct
        cdef int32_t k
        consumers = self.consumers
        for key in keys:
            k = key
            if k & 1:
                continue
            g = self.cby_gid[key >> 1]  # a Python index: checked
            if self._warning():
                consumers.log_closed(s, key, g)
            self._remove_member(s, k)
            if not _group_size(ct, k):
                consumers.drop_group(g)
                consumers.clear_topic_groups(g)
                if self._info():
                    consumers.log_group_removed(g.name)
            if self.want_change and (self.rules4 or g.message_model is not _BROADCASTING):
                self.reg._change(g.name)
        return 0

    cdef int _remove_member(self, Py_ssize_t s, int32_t k) except -1:
        """ClientRegistry._remove_member of a membership the slot holds (the table counts it)."""
        cdef int64_t released = self.ct._remove(_live(self.ct, s), k)
        if released >= 0:
            self.pool.c_release_id(released)  # the membership's own client id
        return 0

    cdef int _free_slot(self, Py_ssize_t s) except -1:
        """ClientRegistry._free_slot."""
        cdef ChannelTable ct = self.ct
        cdef int64_t cid, addr
        if self.stale:
            stale = self.stale.pop(s, None)
            if stale:
                self.producers.free_slot(s, stale)
        cid = ct._cid[_live(ct, s)]
        if cid >= 0:
            self.pool.c_release_id(cid)
        addr = ct._addr[s]
        if addr < 0:
            self.pool.c_release_id(-(addr + 1))
        ct.close(s)
        return 0


cdef inline Py_ssize_t _live(ChannelTable ct, Py_ssize_t s) except -1:
    """``s`` when it is a slot in use (the table's cpdef methods' check, for a slot held across Python code)."""
    if not ct.c_in_use(s):
        raise ChannelTableError(f"slot {s} is not in use")
    return s


cdef inline object _keep_key(int32_t* keys, Py_ssize_t nkeys, int32_t k, object refreshed):
    """A request's ``nkeys``-th refreshed key ``k``: the first FEW_KEYS in ``keys`` (deduped in C), every key in
    the ``refreshed`` list once there are more (returned, made on the first key past them)."""
    cdef Py_ssize_t i
    if nkeys < FEW_KEYS:
        keys[nkeys] = k
        return refreshed
    if refreshed is None:
        refreshed = [keys[i] for i in range(FEW_KEYS)]
    refreshed.append(k)
    return refreshed


cdef Py_ssize_t _distinct_topics(tuple subscriptions) except -2:
    """How many distinct topics the subscriptions name, when they are at most FEW_KEYS exact str; else -1."""
    cdef Py_ssize_t n = len(subscriptions)
    cdef Py_ssize_t i, j
    if n > FEW_KEYS:
        return -1
    for i in range(n):
        t = (<SubscriptionData>subscriptions[i]).topic
        if type(t) is not str:
            return -1
        for j in range(i):
            if <str>t == <str>(<SubscriptionData>subscriptions[j]).topic:
                return -1  # a repeated topic: the set counts
    return n


cdef inline Py_ssize_t _group_size(ChannelTable ct, int32_t k) noexcept:
    """ChannelTable.group_size of a key >= 0."""
    return ct._msize[k] if 0 <= k < ct._nkeys else 0
