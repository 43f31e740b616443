"""ProducerManager (org.apache.rocketmq.broker.client.ProducerManager) over the registry's channel table.

RocketMQ's ProducerManager holds two tables: ``groupChannelTable`` (producer group -> its channels) and
``clientChannelTable`` (client id -> the channel last registered for it). Here:

* the group table maps a group name to a :class:`ProducerGroup`, whose members are slots of the shared channel
  table (:class:`engine.registry._channel_table.ChannelTable`, the registry's ``channel_table``: one slot per
  channel, memberships keyed ``gid * 2 + PRODUCER`` with a member array per key; group ids interned by the
  registry and shared with consumer groups of the same name);
* the client channel table is the channel table's client slot column (``client_slot`` / ``set_client_slot`` /
  ``drop_client_slot``): an int32 column indexed by the client id's pool id (the registry's
  :class:`engine.registry._intern_py.StringPool`), holding the slot, -1 when none; an entry holds one reference on
  its pool id, taken and dropped here (the native rules, engine.registry._rules, do the same in C).

The manager does what Java's does on a heartbeat (registerProducer), an UNREGISTER_CLIENT naming a producer group
(unregisterProducer), a closed channel (doChannelCloseEvent), the expiry scan (scanNotActiveChannel) and the admin
queries (GET_PRODUCER_CONNECTION_LIST 204, findChannel), with Java's log lines and the ProducerChangeListener
events (:class:`ProducerGroupEvent`) through the table's listener. Membership bookkeeping (slot columns,
timestamps, per-membership client info) is the table's: the manager calls it, it does not copy it.

Rules that differ between RocketMQ 4.9 and 5.x (``table._rules4``): 4.9 keeps a group emptied by a close or the
expiry scan and logs nothing about it (its GET_PRODUCER_CONNECTION_LIST answers SUCCESS with no connection), 5.x
drops it ("unregister a producer group[...]" / "SCAN: ... all clear"); the expiry line's prefix. Under 4.x rules
the emptied group is dropped from the group table all the same and its name kept in :attr:`ProducerManager.emptied`
(4.9 keeps every such name for ever; here at most ``maxRegisteredGroups`` names and
:data:`EMPTY_PRODUCER_GROUPS_MAX_BYTES`, the oldest forgotten first).
"""
from __future__ import annotations

import enum
import logging
import sys
import time
from collections import OrderedDict

from engine.registry import clientlog as jl
from engine.registry.client_channel import PRODUCER, Connection, Members

__all__ = ["EMPTY_PRODUCER_GROUPS_MAX_BYTES", "PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS", "ProducerConnection",
           "ProducerGroup", "ProducerGroupEvent", "ProducerManager"]

#: ProducerManager.CHANNEL_EXPIRED_TIMEOUT: Java does not make the producer expiry configurable.
PRODUCER_CHANNEL_EXPIRED_TIMEOUT_MS = 120_000

#: bytes of the emptied producer group names kept under 4.x rules (each name's string plus
#: :data:`_EMPTIED_ENTRY_BYTES`): a client chooses the names (up to a frame each) and 4.9 keeps them for ever; past
#: it (or past ``maxRegisteredGroups`` names) the oldest is forgotten, and its query answers as 5.x's ("not exist")
EMPTY_PRODUCER_GROUPS_MAX_BYTES = 16 << 20
#: an OrderedDict entry (hash table slot, link node, the cost int) in CPython 3.11, rounded up
_EMPTIED_ENTRY_BYTES = 160


class ProducerGroupEvent(enum.Enum):
    """ProducerGroupEvent: what ProducerManager reports to its ProducerChangeListener."""

    GROUP_UNREGISTER = "GROUP_UNREGISTER"
    CLIENT_UNREGISTER = "CLIENT_UNREGISTER"

    # members are singletons compared by identity: hashed by identity too (Enum's own hash is a Python call, and
    # the registry tests membership of these in its wanted set several times per request)
    __hash__ = object.__hash__


_CLIENT_UNREGISTER = ProducerGroupEvent.CLIENT_UNREGISTER
_GROUP_UNREGISTER = ProducerGroupEvent.GROUP_UNREGISTER


class ProducerConnection:
    """Data of GET_PRODUCER_CONNECTION_LIST (204)."""

    __slots__ = ("connections",)

    def __init__(self, connections):
        self.connections = connections

    def to_dict(self) -> dict:
        return {"connectionSet": [c.to_dict() for c in self.connections]}


class ProducerGroup:
    """One producer group of the group table: its name, interned id, membership key and member slots."""

    __slots__ = ("name", "gid", "key", "members")

    def __init__(self, name, gid, channel_table):
        self.name = name
        self.gid = gid
        self.key = gid * 2 + PRODUCER
        self.members = Members(channel_table, self.key)  # a view of the table's member array


class ProducerManager:
    """The producer groups and the client channel table over a shared channel table.

    :param table: the channel table (:class:`engine.registry.client_registry.ClientRegistry`): slots, memberships, the string
        pool, group-id interning, the listener, Java's log lines and the rules in force.

    Invariants (checked by :meth:`check_invariants`):

    * every group in :attr:`group_table` has at least one member (an emptied group is dropped, also under 4.x
      rules: there its name goes to :attr:`emptied`, the only query that sees a 4.9 empty group being
      GET_PRODUCER_CONNECTION_LIST) and is ``by_gid[group.gid]``;
    * :attr:`emptied` is empty under 5.x rules, holds no name of :attr:`group_table`, at most the registry's
      ``max_groups`` names and :data:`EMPTY_PRODUCER_GROUPS_MAX_BYTES` (:attr:`emptied_bytes`, their costs' sum);
    * a group's member slots are distinct live slots of the table, each holding the group's membership key;
    * a client channel table entry points at a slot in use, and holds one pool reference on its client id;
      ``stale[slot]`` lists client ids whose entry may point at ``slot`` after its producers left (an
      UNREGISTER_CLIENT with another client id), dropped when the slot is freed.
    """

    __slots__ = ("table", "ct", "group_table", "by_gid", "stale", "emptied", "emptied_bytes")

    def __init__(self, table):
        self.table = table
        #: the channel table (slots, memberships, member arrays): ``table.channel_table``
        self.ct = table.channel_table
        #: groupChannelTable: group name -> ProducerGroup
        self.group_table: dict[str, ProducerGroup] = {}
        #: group id -> ProducerGroup or None (the table's group-id allocator grows it with every new id)
        self.by_gid: list = []
        #: slot -> client ids whose table entry may outlive its producers
        self.stale: dict[int, set] = {}
        #: 4.x rules: name -> counted bytes of the groups 4.9 would keep empty (emptied by a close or the scan),
        #: oldest first (:meth:`keep_emptied`)
        self.emptied: OrderedDict[str, int] = OrderedDict()
        self.emptied_bytes = 0

    # ------------------------------------------------------------------------------------------ registration
    def register(self, group: str, slot: int, req: tuple) -> int:
        """registerProducer for the heartbeat being handled (``req`` = (cid, language, version)); returns the
        membership key."""
        table = self.table
        g = self.group_table.get(group)
        if g is None:
            if self.emptied:
                self.emptied_bytes -= self.emptied.pop(group, 0)  # the kept empty group is live again
            g = ProducerGroup(group, table._acquire_gid(group), self.ct)
            self.group_table[group] = g
            self.by_gid[g.gid] = g
        if self.ct.mem_pos(slot, g.key) < 0:
            table._add_member(g, slot, req)
            self.set_client_slot(req[0], slot)
            table._dirty = True
            self.log_new_producer(group)
        return g.key

    def log_new_producer(self, group: str) -> None:
        table = self.table
        if table.client_log.allow("new_producer", logging.INFO):
            jl.log.info("new producer connected, group: %s channel: %s", jl._text(group), table._jinfo_request())

    def unregister(self, channel, slot, client_id: str, group: str, language, version, request_info) -> None:
        """unregisterProducer of an UNREGISTER_CLIENT naming ``group`` (``slot`` None: an unknown channel);
        ``request_info()`` builds the request's ClientChannelInfo for the event."""
        table = self.table
        ct = self.ct
        g = self.group_table.get(group)
        if g is None or not ct.group_size(g.key):
            return
        member_cid = -1
        if slot is not None and ct.mem_pos(slot, g.key) >= 0:
            member_cid = ct.member_info(slot, g.key)[0]
        removed = slot is not None and table._remove_member(g, slot)
        if removed and table.client_log.allow("unregister_producer", logging.INFO):
            # Java prints the request's ClientChannelInfo (built for the request: now)
            jl.log.info("unregister a producer[%s] from groupChannelTable %s", jl._text(group),
                        jl.client_channel_info(channel, client_id, language, version, int(time.time() * 1000)))
        cid = table._pool.lookup(client_id)
        if cid >= 0:
            self.drop_client_slot(cid)  # the request's client id, unconditionally, as Java does
        if removed and member_cid != cid and self.ct.client_slot(member_cid) == slot:
            self.stale.setdefault(slot, set()).add(member_cid)
        if removed:
            table._emit(_CLIENT_UNREGISTER, group, client=request_info())
        if not ct.group_size(g.key):
            self.drop_group(g, emptied=False)  # 4.9's unregisterProducer removes the group too
            table._emit(_GROUP_UNREGISTER, group)
            if table.client_log.allow("producer_group_removed", logging.INFO):
                jl.log.info("unregister a producer group[%s] from groupChannelTable", jl._text(group))

    def log_closed(self, slot: int, key: int, g: ProducerGroup, channel) -> None:
        """doChannelCloseEvent's line for a membership it removes (the native close, engine.registry._rules, too)."""
        table = self.table
        if table.client_log.allow("closed_producer", logging.INFO):
            jl.log.info("NETTY EVENT: remove channel[%s][%s] from ProducerManager groupChannelTable, producer group: "
                        "%s", table._jinfo(slot, key), table._jaddr(slot, channel), jl._text(g.name))

    def log_group_removed(self, group: str) -> None:
        if not self.table._rules4 and self.table.client_log.allow("producer_group_removed", logging.INFO):
            jl.log.info("unregister a producer group[%s] from groupChannelTable", jl._text(group))

    def close_channel(self, slot: int, keys, channel) -> None:
        """doChannelCloseEvent: remove the closed channel's producer memberships (``keys``: all of the slot's)."""
        table = self.table
        wants_client = _CLIENT_UNREGISTER in table._wants
        for key in keys:
            if key & 1 != PRODUCER:
                continue
            g = self.by_gid[key >> 1]
            info = table._client_info(slot, key) if wants_client else None
            self.log_closed(slot, key, g, channel)
            self.drop_client_slot(self.ct.member_info(slot, key)[0])  # unconditionally, as Java does
            table._remove_member(g, slot)
            if wants_client:
                table._emit(_CLIENT_UNREGISTER, g.name, client=info)
            if not self.ct.group_size(g.key):
                self.drop_group(g)  # 4.9 keeps the empty group (its name: emptied) and says nothing
                table._emit(_GROUP_UNREGISTER, g.name)
                self.log_group_removed(g.name)

    def scan_expired(self, candidates, expired) -> None:
        """scanNotActiveChannel: remove the expired producer memberships (``expired[i]``: the keys of
        ``candidates[i]`` past their timeout); the table closes the channels."""
        table = self.table
        clog = table.client_log
        ct = self.ct
        wants_client = _CLIENT_UNREGISTER in table._wants
        for slot, keys in zip(candidates, expired):
            for key in keys:
                if key & 1 != PRODUCER:
                    continue
                g = self.by_gid[key >> 1]
                info = table._client_info(slot, key) if wants_client else None
                if clog.allow("expired_producer", logging.WARNING):
                    jl.log.warning("%s: remove expired channel[%s] from ProducerManager groupChannelTable, "
                                   "producer group name: %s",
                                   "SCAN" if table._rules4 else "ProducerManager#scanNotActiveChannel",
                                   table._jaddr(slot, ct.channel(slot)), jl._text(g.name))
                self.drop_client_slot(ct.member_info(slot, key)[0], only_slot=slot)
                table._remove_member(g, slot)
                if wants_client:
                    table._emit(_CLIENT_UNREGISTER, g.name, client=info)
                if not ct.group_size(g.key):
                    self.drop_group(g)  # 4.9 keeps the empty group (its name: emptied) and says nothing
                    table._emit(_GROUP_UNREGISTER, g.name)
                    if not table._rules4 and clog.allow("expired_group_cleared", logging.WARNING):
                        jl.log.warning("SCAN: remove expired channel from ProducerManager groupChannelTable, all "
                                       "clear, group=%s", jl._text(g.name))

    def drop_group(self, g: ProducerGroup, emptied: bool = True) -> None:
        """Drop an empty group. ``emptied``: by a close or the expiry scan (the native close calls this too),
        after which 4.9 keeps the group: under 4.x rules its name is kept (:meth:`keep_emptied`); an
        UNREGISTER_CLIENT passes False (4.9 removes the group then)."""
        del self.group_table[g.name]
        self.by_gid[g.gid] = None
        self.table._release_gid(g.gid)
        if emptied and self.table._rules4:
            self.keep_emptied(g.name)

    def keep_emptied(self, name: str) -> None:
        """Remember a group 4.9 keeps empty, within the registry's ``max_groups`` names and
        :data:`EMPTY_PRODUCER_GROUPS_MAX_BYTES`: the oldest names make room (forgotten: answered as 5.x does)."""
        cost = sys.getsizeof(name) + _EMPTIED_ENTRY_BYTES
        if cost > EMPTY_PRODUCER_GROUPS_MAX_BYTES:
            return
        emptied = self.emptied
        limit = self.table.config.max_groups
        while emptied and (len(emptied) >= limit or self.emptied_bytes + cost > EMPTY_PRODUCER_GROUPS_MAX_BYTES):
            self.emptied_bytes -= emptied.popitem(last=False)[1]
        emptied[name] = cost
        self.emptied_bytes += cost

    def free_slot(self, slot: int, stale) -> None:
        """The table frees ``slot``: drop the client channel table entries ``stale`` (popped from
        :attr:`stale`) that still point at it (Java keeps such an entry on the closed channel; a slot is
        reused)."""
        for cid in stale:
            self.drop_client_slot(cid, only_slot=slot)

    # ------------------------------------------------------------------------------------ clientChannelTable
    def set_client_slot(self, cid: int, slot: int) -> None:
        if self.ct.set_client_slot(cid, slot) < 0:
            self.table._pool.acquire(cid)  # a new entry holds a reference on its client id

    def drop_client_slot(self, cid: int, only_slot: int = -1) -> None:
        if self.ct.drop_client_slot(cid, only_slot):
            self.table._pool.release(cid)

    def find_channel(self, client_id: str):
        """findChannel: the channel last registered for a producer client id, or None."""
        table = self.table
        slot = self.ct.client_slot(table._pool.lookup(client_id))
        return self.ct.channel(slot) if slot >= 0 else None

    # ---------------------------------------------------------------------------------------------- queries
    def connection(self, group: str) -> ProducerConnection | None:
        """GET_PRODUCER_CONNECTION_LIST (204) data, or None when the group does not exist (an emptied group kept
        under 4.x rules exists, with no connection, as in 4.9's groupChannelTable)."""
        g = self.group_table.get(group)
        if g is None:
            return ProducerConnection([]) if group in self.emptied else None
        client_info = self.table._client_info
        conns = []
        for slot in self.ct.group_slots(g.key):
            info = client_info(slot, g.key)
            conns.append(Connection(info.client_id, info.remote_addr, info.language, info.version))
        return ProducerConnection(conns)

    def channels(self, group: str) -> list:
        """ClientChannelInfo of each channel of a producer group (table order)."""
        g = self.group_table.get(group)
        return [] if g is None else [self.table._client_info(slot, g.key) for slot in self.ct.group_slots(g.key)]

    def groups(self) -> list:
        return list(self.group_table)

    def nbytes(self) -> int:
        """Bytes of the client channel table (the channel table's client slot column) and the kept empty groups."""
        return self.ct.client_slots_nbytes() + self.emptied_bytes

    def client_table_items(self):
        """(pool id, slot) of every client channel table entry."""
        yield from self.ct.client_slot_items()

    def check_invariants(self) -> None:
        """The manager's own invariants (the table checks the memberships and the pool references)."""
        ct = self.ct
        for name, g in self.group_table.items():
            assert ct.group_size(g.key) > 0, f"empty producer group {name} kept"
            assert self.by_gid[g.gid] is g and g.key == g.gid * 2 + PRODUCER
            members = ct.group_slots(g.key)
            assert len(set(members)) == len(members), f"producer group {name} lists a channel twice"
            for pos, slot in enumerate(members):
                assert ct.mem_pos(slot, g.key) == pos
        for gid, g in enumerate(self.by_gid):
            assert g is None or self.group_table.get(g.name) is g, f"group id {gid} of a dropped producer group"
        emptied = self.emptied
        assert not emptied or self.table._rules4, "empty producer groups kept under 5.x rules"
        assert not any(name in self.group_table for name in emptied), "a live producer group listed as emptied"
        assert len(emptied) <= self.table.config.max_groups
        assert self.emptied_bytes == sum(emptied.values()) <= EMPTY_PRODUCER_GROUPS_MAX_BYTES
        for cid, slot in self.client_table_items():
            assert ct.in_use(slot), f"client table entry {cid} on a free slot"
        for slot in self.stale:
            assert ct.in_use(slot), "stale client entries of a free slot"
