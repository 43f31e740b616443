"""What the client managers share over the registry's channel table (issue 15): the membership kinds, a view of a
group's member array, and the per-registration records a query returns (RocketMQ's ClientChannelInfo and Connection).

The channel table itself (one slot per channel in flat columns, memberships, member arrays) is
:class:`engine.registry._channel_table.ChannelTable` (Cython; twin ``_channel_table_py``), which
:class:`engine.registry.client_registry.ClientRegistry` owns as ``channel_table`` with the interning around it;
:class:`engine.registry.producer_manager.ProducerManager` and the consumer side work over it. A membership key is
``gid * 2 + kind``: the group id interned by the registry, and the kind below.
"""
from __future__ import annotations

from engine.codec.enums import LanguageCode

__all__ = ["CONSUMER", "PRODUCER", "ClientChannelInfo", "Connection", "Members"]

#: membership kinds; a membership key is gid * 2 + kind
CONSUMER, PRODUCER = 0, 1


class Members:
    """A group's member slots: a view of the channel table's member array of the group's key (removal there is by
    swapping the last member in, so the order is insertion order until a member leaves)."""

    __slots__ = ("table", "key")

    def __init__(self, table, key: int):
        self.table = table
        self.key = key

    @property
    def n(self) -> int:
        return self.table.group_size(self.key)

    def tolist(self) -> list:
        return self.table.group_slots(self.key)

    def __len__(self) -> int:
        return self.table.group_size(self.key)


class ClientChannelInfo:
    """One registration: the channel, the client id, language and version of the request that made it, its last
    update time (ms, registry clock) and the channel's remote address."""

    __slots__ = ("channel", "client_id", "language", "version", "last_update_timestamp", "remote_addr")

    def __init__(self, channel, client_id, language, version, last_update_timestamp=0, remote_addr=""):
        self.channel = channel
        self.client_id = client_id
        self.language = language
        self.version = version
        self.last_update_timestamp = last_update_timestamp
        self.remote_addr = remote_addr

    def _key(self):
        return (self.client_id, self.language, self.version, self.last_update_timestamp, self.remote_addr)

    def __eq__(self, other):
        if not isinstance(other, ClientChannelInfo):
            return NotImplemented
        return self.channel is other.channel and self._key() == other._key()

    __hash__ = None

    def __repr__(self):
        lang = self.language.name if isinstance(self.language, LanguageCode) else self.language
        return (f"ClientChannelInfo(client_id={self.client_id!r}, language={lang}, version={self.version}, "
                f"remote_addr={self.remote_addr!r}, last_update_timestamp={self.last_update_timestamp})")


class Connection:
    """An entry of a connection list (body of GET_CONSUMER/PRODUCER_CONNECTION_LIST)."""

    __slots__ = ("client_id", "client_addr", "language", "version")

    def __init__(self, client_id, client_addr, language, version):
        self.client_id = client_id
        self.client_addr = client_addr
        self.language = language
        self.version = version

    def to_dict(self) -> dict:
        lang = self.language.name if isinstance(self.language, LanguageCode) else self.language
        return {"clientAddr": self.client_addr, "clientId": self.client_id, "language": lang,
                "version": self.version}

    def __repr__(self):
        return f"Connection({self.to_dict()!r})"
