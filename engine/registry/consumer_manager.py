"""ConsumerManager and ConsumerGroupInfo (org.apache.rocketmq.broker.client) over the registry's channel table.

RocketMQ's ConsumerManager holds ``consumerTable`` (consumer group -> ConsumerGroupInfo: the group's channels,
its subscription table and its consume type / model / where) and ``topicGroupTable`` (topic -> groups that
subscribed to it). Here:

* the consumer table maps a group name to a :class:`ConsumerGroup` (the live ConsumerGroupInfo: members are slots
  of the shared channel table, :class:`engine.registry._channel_table.ChannelTable` (the registry's
  ``channel_table``), keyed ``gid * 2 + CONSUMER`` with a member array per key; group ids are interned by the
  registry and shared with producer groups of the same name);
* :class:`ConsumerGroupInfo` is the snapshot a query returns (``ClientRegistry.consumer_group_info``), and
  :class:`ConsumerConnection` the data of GET_CONSUMER_CONNECTION_LIST (203).

The manager does registerConsumer (with ConsumerGroupInfo.updateChannel / updateSubscription), the light V2
registration without subscriptions, unregisterConsumer, doChannelCloseEvent, scanNotActiveChannel and the
queries, with Java's log lines and the ConsumerIdsChangeListener events (:class:`ConsumerGroupEvent`) through the
table's listener. What ClientManageProcessor decides before registering (the V2 fingerprint table, subscription
group configs and their auto-creation, retry topics, the 4.x / 5.x choice) stays in the table's heartbeat, and so
do the per-group epochs of the fast path (``table._touch``) and the CHANGE coalescing (``table._change``).
"""
from __future__ import annotations

import enum
import logging

from engine.registry import clientlog as jl
from engine.registry.client_channel import CONSUMER, Connection, Members
from engine.codec.enums import ConsumeType, MessageModel

__all__ = ["ConsumerConnection", "ConsumerGroup", "ConsumerGroupEvent", "ConsumerGroupInfo", "ConsumerManager",
           "subscription_to_dict"]

_BROADCASTING = MessageModel.BROADCASTING
_PASSIVELY = ConsumeType.CONSUME_PASSIVELY


class ConsumerGroupEvent(enum.Enum):
    """ConsumerGroupEvent: what ConsumerManager reports to its ConsumerIdsChangeListener."""

    CHANGE = "CHANGE"
    UNREGISTER = "UNREGISTER"
    REGISTER = "REGISTER"
    CLIENT_REGISTER = "CLIENT_REGISTER"
    CLIENT_UNREGISTER = "CLIENT_UNREGISTER"

    # members are singletons compared by identity: hashed by identity too (Enum's own hash is a Python call, and
    # the registry tests membership of these in its wanted set several times per request)
    __hash__ = object.__hash__


_REGISTER = ConsumerGroupEvent.REGISTER
_CLIENT_REGISTER = ConsumerGroupEvent.CLIENT_REGISTER
_CLIENT_UNREGISTER = ConsumerGroupEvent.CLIENT_UNREGISTER
_UNREGISTER = ConsumerGroupEvent.UNREGISTER


def subscription_to_dict(sd) -> dict:
    """A SubscriptionData in Java's JSON shape (fastjson key order)."""
    return {
        "classFilterMode": bool(sd.class_filter_mode),
        "codeSet": list(sd.codes),
        "expressionType": sd.expression_type,
        "subString": sd.sub_string,
        "subVersion": sd.sub_version,
        "tagsSet": list(sd.tags),
        "topic": sd.topic,
    }


def _enum_name(e):
    return None if e is None else e.name


class ConsumerConnection:
    """Data of GET_CONSUMER_CONNECTION_LIST (203): connections, subscription table, consume type/model/where."""

    __slots__ = ("connections", "subscription_table", "consume_type", "message_model", "consume_from_where")

    def __init__(self, connections, subscription_table, consume_type, message_model, consume_from_where):
        self.connections = connections
        self.subscription_table = subscription_table
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where

    def to_dict(self) -> dict:
        """Java's ConsumerConnection JSON (nulls omitted, as fastjson does)."""
        out = {"connectionSet": [c.to_dict() for c in self.connections]}
        for key, value in (("consumeFromWhere", self.consume_from_where), ("consumeType", self.consume_type),
                           ("messageModel", self.message_model)):
            if value is not None:
                out[key] = value.name
        out["subscriptionTable"] = {t: subscription_to_dict(s) for t, s in self.subscription_table.items()}
        return out


class ConsumerGroupInfo:
    """A snapshot of one consumer group (ConsumerGroupInfo): members, subscription table and settings."""

    __slots__ = ("group", "channels", "subscription_table", "consume_type", "message_model", "consume_from_where",
                 "last_update_timestamp")

    def __init__(self, group, channels, subscription_table, consume_type, message_model, consume_from_where,
                 last_update_timestamp):
        self.group = group
        self.channels = channels  # list of ClientChannelInfo, table order
        self.subscription_table = subscription_table
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.last_update_timestamp = last_update_timestamp

    @property
    def client_ids(self) -> list:
        return [c.client_id for c in self.channels]

    def __repr__(self):
        return (f"ConsumerGroupInfo({self.group!r}, clients={self.client_ids!r}, "
                f"topics={sorted(self.subscription_table)!r}, {_enum_name(self.consume_type)}, "
                f"{_enum_name(self.message_model)}, {_enum_name(self.consume_from_where)})")


class ConsumerGroup:
    """A live consumer group of the consumer table (Java's ConsumerGroupInfo): member slots, the subscription
    table, the consume settings and the epoch of its last change a repeated heartbeat would observe."""

    __slots__ = ("name", "gid", "key", "members", "subscriptions", "consume_type", "message_model",
                 "consume_from_where", "epoch", "retry_topic")

    def __init__(self, name, gid, channel_table, consume_type, message_model, consume_from_where):
        self.name = name
        self.gid = gid
        self.key = gid * 2 + CONSUMER
        self.members = Members(channel_table, self.key)  # a view of the table's member array
        self.subscriptions = {}  # topic -> SubscriptionData (the objects of the heartbeat that set them)
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.epoch = 0  # registry tick of the last change a repeated heartbeat would observe
        self.retry_topic = "%RETRY%" + name  # MixAll.getRetryTopic, built once (its hash is then cached too)


class ConsumerManager:
    """The consumer groups and the topic -> groups table over a shared channel table.

    :param table: the channel table (:class:`engine.registry.client_registry.ClientRegistry`): slots, memberships, the string
        pool, group-id interning, the listener and its wanted events, change epochs, CHANGE delivery, Java's log
        lines and the rules in force.

    Invariants (checked by :meth:`check_invariants`):

    * every group in :attr:`group_table` has at least one member (an emptied group is dropped) and is
      ``by_gid[group.gid]``; its member slots are distinct slots in use holding the group's membership key;
    * :attr:`topic_groups` has no empty set; it may name groups that are gone or no longer subscribe to the topic
      (Java's clearTopicGroupTable only clears a dropped group's current topics, and the expiry scan keeps them).
    """

    __slots__ = ("table", "ct", "group_table", "by_gid", "topic_groups")

    def __init__(self, table):
        self.table = table
        #: the channel table (slots, memberships, member arrays): ``table.channel_table``
        self.ct = table.channel_table
        #: consumerTable: group name -> ConsumerGroup
        self.group_table: dict[str, ConsumerGroup] = {}
        #: group id -> ConsumerGroup or None (the table's group-id allocator grows it with every new id)
        self.by_gid: list = []
        #: topicGroupTable: topic -> names of the groups that subscribed to it
        self.topic_groups: dict[str, set] = {}

    # ---------------------------------------------------------------------------------------------- groups
    def new_group(self, name, consume_type, message_model, consume_from_where) -> ConsumerGroup:
        table = self.table
        gid = table._acquire_gid(name)
        g = ConsumerGroup(name, gid, self.ct, consume_type, message_model, consume_from_where)
        self.group_table[name] = g
        self.by_gid[gid] = g
        table._touch(g)
        return g

    def drop_group(self, g: ConsumerGroup) -> None:
        del self.group_table[g.name]
        self.by_gid[g.gid] = None
        self.table._release_gid(g.gid)

    def clear_topic_groups(self, g: ConsumerGroup) -> None:
        """clearTopicGroupTable: only the group's current topics (Java keeps older ones, and so do we)."""
        topic_groups = self.topic_groups
        for topic in g.subscriptions:
            groups = topic_groups.get(topic)
            if groups is not None:
                groups.discard(g.name)
                if not groups:
                    del topic_groups[topic]

    # ------------------------------------------------------------------------------------------ registration
    def update_channel(self, g: ConsumerGroup, slot: int, req: tuple, cd) -> bool:
        """ConsumerGroupInfo.updateChannel: True only when the channel is new to the group."""
        table = self.table
        if (g.consume_type is not cd.consume_type or g.message_model is not cd.message_model
                or g.consume_from_where is not cd.consume_from_where):
            g.consume_type, g.message_model, g.consume_from_where = (cd.consume_type, cd.message_model,
                                                                     cd.consume_from_where)
            table._touch(g)
        ct = self.ct
        if ct.mem_pos(slot, g.key) < 0:
            table._add_member(g, slot, req)
            table._dirty = True
            self.log_new_consumer(g, cd)
            return True
        cur = ct.member_info(slot, g.key)
        if cur[0] != req[0]:
            # same channel, another client id: Java logs an error and replaces the entry (not a change); the
            # line in the wording of the rules' version (operators' tools, the broker-log scan, read it)
            if table.client_log.allow("client_changed", logging.ERROR):
                old_info, new_info = table._jinfo(slot, g.key), table._jinfo_request()
                if table._rules4:
                    jl.log.error("[BUG] consumer channel exist in broker, but clientId not equal. GROUP: %s OLD: %s "
                                 "NEW: %s ", jl._text(g.name), old_info, new_info)
                else:
                    jl.log.error("ConsumerGroupInfo: consumer channel exists in broker, but clientId is not the same "
                                 "one, group=%s, old clientChannelInfo=%s, new clientChannelInfo=%s",
                                 jl._text(g.name), old_info, new_info)
            table._set_member_info(slot, g.key, req)
            ct.disarm(slot)
            table._dirty = True
        return False

    def update_subscription(self, g: ConsumerGroup, subs) -> bool:
        """ConsumerGroupInfo.updateSubscription: True only when topics were added or removed."""
        table = g.subscriptions
        changed = replaced = False
        topics = set()
        for sd in subs:
            topic = sd.topic
            old = table.get(topic)
            if old is None:
                table[topic] = sd
                changed = True
                self.log_sub_added(g, sd)
            elif sd.sub_version > old.sub_version:
                table[topic] = sd  # a newer subVersion replaces silently
                replaced = True
                if g.consume_type is _PASSIVELY:
                    self.log_sub_replaced(g, old, sd)
            topics.add(topic)
        if len(table) != len(topics):
            self.remove_topics(g, topics)
            changed = True
        if changed or replaced:
            self.table._touch(g)
        return changed

    def remove_topics(self, g: ConsumerGroup, keep) -> None:
        """The end of updateSubscription: drop the subscriptions whose topic is not in ``keep``."""
        table = g.subscriptions
        for topic in [t for t in table if t not in keep]:
            if self.table.client_log.allow("sub_remove", logging.WARNING):
                jl.log.warning("subscription changed, group: %s remove topic %s %s", jl._text(g.name),
                               jl._text(topic), jl.subscription_data(table[topic]))
            del table[topic]

    def register(self, group: str, slot: int, req: tuple, cd, notify: bool) -> int:
        """registerConsumer for the heartbeat being handled (``req`` = (cid, language, version)); ``notify``: the
        group's notifyConsumerIdsChangedEnable. Returns the membership key."""
        table = self.table
        subs = cd.subscriptions
        g = self.group_table.get(group)
        if g is None:
            g = self.new_group(group, cd.consume_type, cd.message_model, cd.consume_from_where)
        topic_groups = self.topic_groups
        for sd in subs:
            groups = topic_groups.get(sd.topic)
            if groups is None:
                topic_groups[sd.topic] = {group}
            else:
                groups.add(group)
        r1 = self.update_channel(g, slot, req, cd)
        if r1 and _CLIENT_REGISTER in table._wants:
            table._emit(_CLIENT_REGISTER, group, client=table._request_info(),
                        topics=frozenset(sd.topic for sd in subs))
        r2 = self.update_subscription(g, subs)
        if (r1 or r2) and notify and (table._rules4 or g.message_model is not _BROADCASTING):
            table._change(group)  # 4.x: BROADCASTING groups are notified too
        if r1 or r2:
            self.log_consumer_data(slot, cd)
        if table._want_register:
            table._emit(_REGISTER, group, client=table._request_info(), subscriptions=subs)
        return g.key

    def register_without_sub(self, group: str, slot: int, req: tuple, cd, notify: bool) -> int:
        """The V2 light registration (heartbeat withoutSub): the channel only, the subscriptions kept."""
        table = self.table
        g = self.group_table.get(group)
        if g is None:
            g = self.new_group(group, cd.consume_type, cd.message_model, cd.consume_from_where)
        topic_groups = self.topic_groups
        for topic in g.subscriptions:
            groups = topic_groups.get(topic)
            if groups is None:
                topic_groups[topic] = {group}
            else:
                groups.add(group)
        if self.update_channel(g, slot, req, cd):
            if notify and g.message_model is not _BROADCASTING:
                table._change(group)
            self.log_consumer_data(slot, cd)
        return g.key

    # Java's lines of a registration, each within its budget (the native rules, engine.registry._rules, call them too)
    def log_new_consumer(self, g: ConsumerGroup, cd) -> None:
        table = self.table
        if table.client_log.allow("new_consumer", logging.INFO):
            jl.log.info("new consumer connected, group: %s %s %s channel: %s", jl._text(g.name),
                        jl._enum(cd.consume_type), jl._enum(cd.message_model), table._jinfo_request())

    def log_sub_added(self, g: ConsumerGroup, sd) -> None:
        if self.table.client_log.allow("sub_add", logging.INFO):
            jl.log.info("subscription changed, add new topic, group: %s %s", jl._text(g.name),
                        jl.subscription_data(sd))

    def log_sub_replaced(self, g: ConsumerGroup, old, sd) -> None:
        if self.table.client_log.allow("sub_change", logging.INFO):
            jl.log.info("subscription changed, group: %s OLD: %s NEW: %s", jl._text(g.name),
                        jl.subscription_data(old), jl.subscription_data(sd))

    def log_consumer_data(self, slot: int, cd) -> None:
        """ClientManageProcessor's line after a registerConsumer that changed something."""
        table = self.table
        if not table.client_log.allow("consumer_data", logging.INFO):
            return
        addr = table._jaddr(slot, self.ct.channel(slot))
        if table._rules4:
            jl.log.info("registerConsumer info changed %s %s", jl.consumer_data(cd), addr)
        else:
            jl.log.info("%sClientManageProcessor: registerConsumer info changed, SDK address=%s, consumerData=%s",
                        "heartBeatV2 " if table._request_v2 else "", addr, jl.consumer_data(cd))

    def log_closed(self, slot: int, key: int, g: ConsumerGroup) -> None:
        """doChannelCloseEvent's line for a membership it removes (the native close, engine.registry._rules, too)."""
        table = self.table
        if table.client_log.allow("closed_consumer", logging.WARNING):
            jl.log.warning("NETTY EVENT: remove not active channel[%s] from ConsumerGroupInfo groupChannelTable, "
                           "consumer group: %s", table._jinfo(slot, key), jl._text(g.name))

    def log_group_removed(self, group: str) -> None:
        if self.table.client_log.allow("consumer_group_removed", logging.INFO):
            jl.log.info("unregister consumer ok, no any connection, and remove consumer group, %s", jl._text(group))

    # ---------------------------------------------------------------------------------------------- removal
    def unregister(self, slot, group: str, notify: bool, request_info) -> None:
        """unregisterConsumer of an UNREGISTER_CLIENT naming ``group`` (``slot`` None: an unknown channel);
        ``notify``: the group's notifyConsumerIdsChangedEnable; ``request_info()`` builds the request's
        ClientChannelInfo for the event. CHANGE goes out even when nothing was removed (PROTOCOL.md 6.6.4)."""
        table = self.table
        g = self.group_table.get(group)
        if g is None:
            return
        old = None
        if slot is not None and self.ct.mem_pos(slot, g.key) >= 0 and table.client_log.allow(
                "unregister_consumer", logging.INFO):
            old = table._jinfo(slot, g.key)  # Java prints the entry it removed
        if slot is not None and table._remove_member(g, slot):
            if old is not None:
                jl.log.info("unregister a consumer[%s] from consumerGroupInfo %s", jl._text(group), old)
            table._emit(_CLIENT_UNREGISTER, group, client=request_info(), topics=frozenset(g.subscriptions))
        if not self.ct.group_size(g.key):
            self.drop_group(g)
            table._emit(_UNREGISTER, group)
            self.clear_topic_groups(g)
            self.log_group_removed(group)
        if notify and (table._rules4 or g.message_model is not _BROADCASTING):
            table._change(group)  # even when nothing was removed (6.6.4); 4.x: BROADCASTING too

    def close_channel(self, slot: int, keys, channel) -> None:
        """doChannelCloseEvent: remove the closed channel's consumer memberships (``keys``: all of the slot's);
        CHANGE to the remaining members unless the group is BROADCASTING (4.x: also then)."""
        table = self.table
        wants_client = _CLIENT_UNREGISTER in table._wants
        for key in keys:
            if key & 1 != CONSUMER:
                continue
            g = self.by_gid[key >> 1]
            info = table._client_info(slot, key) if wants_client else None
            self.log_closed(slot, key, g)
            table._remove_member(g, slot)
            if wants_client:  # the topics are built only for a listener that wants them
                table._emit(_CLIENT_UNREGISTER, g.name, client=info, topics=frozenset(g.subscriptions))
            if not self.ct.group_size(g.key):
                self.drop_group(g)
                table._emit(_UNREGISTER, g.name)
                self.clear_topic_groups(g)
                self.log_group_removed(g.name)
            if table._rules4 or g.message_model is not _BROADCASTING:
                table._change(g.name)  # 4.x: BROADCASTING groups too

    def scan_expired(self, candidates, expired) -> None:
        """scanNotActiveChannel: remove the expired consumer memberships (``expired[i]``: the keys of
        ``candidates[i]`` past their timeout), without UNREGISTER or CHANGE; an emptied group is dropped
        silently and its topicGroupTable entries are kept (Java)."""
        table = self.table
        clog = table.client_log
        ct = self.ct
        wants_client = _CLIENT_UNREGISTER in table._wants
        for slot, keys in zip(candidates, expired):
            for key in keys:
                if key & 1 != CONSUMER:
                    continue
                g = self.by_gid[key >> 1]
                info = table._client_info(slot, key) if wants_client else None
                if clog.allow("expired_consumer", logging.WARNING):
                    jl.log.warning("SCAN: remove expired channel from ConsumerManager consumerTable. channel=%s, "
                                   "consumerGroup=%s", table._jaddr(slot, ct.channel(slot)), jl._text(g.name))
                if wants_client:  # the topics are built only for a listener that wants them
                    table._emit(_CLIENT_UNREGISTER, g.name, client=info, topics=frozenset(g.subscriptions))
                table._remove_member(g, slot)
                if not ct.group_size(g.key):
                    if clog.allow("expired_group_cleared", logging.WARNING):
                        jl.log.warning("SCAN: remove expired channel from ConsumerManager consumerTable, all "
                                       "clear, consumerGroup=%s", jl._text(g.name))
                    self.drop_group(g)  # no UNREGISTER, no CHANGE, topicGroupTable kept (Java)

    # ---------------------------------------------------------------------------------------------- queries
    def consumer_ids(self, group: str) -> list:
        """Client ids of the group's channels in table order (GET_CONSUMER_LIST_BY_GROUP); [] if unknown."""
        g = self.group_table.get(group)
        if g is None:
            return []
        table = self.table
        pool = table._pool
        member_info = self.ct.member_info
        out = []
        for slot in self.ct.group_slots(g.key):
            cid = member_info(slot, g.key)[0]
            out.append(pool.get(cid) if cid >= 0 else None)
        return out

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        g = self.group_table.get(group)
        if g is None:
            return None
        client_info = self.table._client_info
        channels = [client_info(slot, g.key) for slot in self.ct.group_slots(g.key)]
        last = max((c.last_update_timestamp for c in channels), default=0)
        return ConsumerGroupInfo(group, channels, dict(g.subscriptions), g.consume_type, g.message_model,
                                 g.consume_from_where, last)

    def connection(self, group: str) -> ConsumerConnection | None:
        """GET_CONSUMER_CONNECTION_LIST (203) data, or None when the group is not online."""
        g = self.group_table.get(group)
        if g is None:
            return None
        client_info = self.table._client_info
        conns = []
        for slot in self.ct.group_slots(g.key):
            info = client_info(slot, g.key)
            conns.append(Connection(info.client_id, info.remote_addr, info.language, info.version))
        return ConsumerConnection(conns, dict(g.subscriptions), g.consume_type, g.message_model,
                                  g.consume_from_where)

    def find_subscription(self, group: str, topic: str):
        """findSubscriptionData: the group's SubscriptionData for a topic, or None."""
        g = self.group_table.get(group)
        return None if g is None else g.subscriptions.get(topic)

    def topic_consumed_by(self, topic: str) -> set:
        """queryTopicConsumeByWho: groups recorded for the topic (topicGroupTable, with Java's stale entries);
        under 4.x rules the live groups whose subscription table has the topic (4.9 has no topicGroupTable)."""
        if self.table._rules4:
            return {name for name, g in self.group_table.items() if topic in g.subscriptions}
        return set(self.topic_groups.get(topic, ()))

    def groups(self) -> list:
        return list(self.group_table)

    def check_invariants(self) -> None:
        """The manager's own invariants (the table checks the memberships and the pool references)."""
        ct = self.ct
        for name, g in self.group_table.items():
            assert ct.group_size(g.key) > 0, f"empty consumer group {name} kept"
            assert self.by_gid[g.gid] is g and g.key == g.gid * 2 + CONSUMER
            members = ct.group_slots(g.key)
            assert len(set(members)) == len(members), f"consumer group {name} lists a channel twice"
            for pos, slot in enumerate(members):
                assert ct.mem_pos(slot, g.key) == pos
            for topic, sd in g.subscriptions.items():
                assert sd.topic == topic, f"group {name} files {sd.topic} under {topic}"
        for gid, g in enumerate(self.by_gid):
            assert g is None or self.group_table.get(g.name) is g, f"group id {gid} of a dropped consumer group"
        for topic, groups in self.topic_groups.items():
            assert groups, f"empty topicGroupTable entry {topic}"
