"""ConfigManager (org.apache.rocketmq.common.ConfigManager): what the broker's persisted tables share.

RocketMQ's TopicConfigManager, SubscriptionGroupManager and ConsumerOffsetManager each extend ConfigManager: one
JSON document per table (``{"dataVersion": ..., <table key>: {...}}``), loaded at start, encoded and written on a
change. Here :class:`ConfigManager` is that base (snapshot, encode, parse, load), :class:`KeyedConfigManager` the
config tables keyed by an item attribute (put/delete with a data-version bump), and :class:`DataVersion` and
:class:`StoreError` what they use. The file itself (atomic writes with a backup, loading with fallbacks, the
corrupt-file rule) and when a table is written are :mod:`engine.registry.store`'s: a manager gets its file from the store
(``store.config_file``) and reports its changes to it (``store._config_changed``).

The managers log on the ``engine.registry.store`` logger, as before they had modules of their own.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

__all__ = ["ConfigManager", "DataVersion", "KeyedConfigManager", "StoreError"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class StoreError(ValueError):
    """A persisted file does not have the expected shape (the message names the JSON path)."""


# --------------------------------------------------------------------------------------------------------------
# Typed field readers for loading: a wrong type is corruption, reported with its JSON path.


def _get(d: dict, key: str, kind, default, path: str, lo=None, hi=None):
    value = d.get(key, default)
    if value is None:
        return default
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise StoreError(f"{path}.{key}: expected an integer, got {type(value).__name__}")
        if lo is not None and not lo <= value <= hi:
            raise StoreError(f"{path}.{key}: {value} out of range")
    elif kind is bool:
        if not isinstance(value, bool):
            raise StoreError(f"{path}.{key}: expected a boolean, got {type(value).__name__}")
    elif kind is str:
        if not isinstance(value, str):
            raise StoreError(f"{path}.{key}: expected a string, got {type(value).__name__}")
    elif kind is dict:
        if not isinstance(value, dict):
            raise StoreError(f"{path}.{key}: expected an object, got {type(value).__name__}")
    return value


def _or_empty(value):
    return {} if value is None else value


def _str_map(value, path: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise StoreError(f"{path}: expected an object of strings")
    return dict(value)


@dataclass
class DataVersion:
    """RocketMQ DataVersion: bumped on every change of a table, sent to the name server with the topic table."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = field(default_factory=lambda: int(time.time() * 1000))

    def next_version(self) -> None:
        self.counter += 1
        self.timestamp = int(time.time() * 1000)

    def to_dict(self) -> dict:
        return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}

    @classmethod
    def from_dict(cls, d, path="$.dataVersion") -> "DataVersion":
        if not isinstance(d, dict):
            raise StoreError(f"{path}: expected an object")
        return cls(
            counter=_get(d, "counter", int, 0, path, INT64_MIN, INT64_MAX),
            state_version=_get(d, "stateVersion", int, 0, path, INT64_MIN, INT64_MAX),
            timestamp=_get(d, "timestamp", int, 0, path, INT64_MIN, INT64_MAX),
        )


# --------------------------------------------------------------------------------------------------------------
# Managers' base


class ConfigManager:
    """A table persisted as one JSON document: ``{"dataVersion": ..., TABLE_KEY: {key: item}}`` (with the
    constant members of ``EXTRA``), loaded with the fallbacks of :class:`engine.registry.store._JsonFile`."""

    FILE_NAME = TABLE_KEY = ""
    EXTRA: dict = {}

    def __init__(self, store: "Store"):
        self._store = store
        self.table: dict = {}
        self.data_version = DataVersion()
        self.file = store.config_file(self.FILE_NAME)  # an engine.registry.store._JsonFile

    def _item_to_json(self, item):
        return item.to_dict()

    def _item_from_json(self, key: str, value, path: str):
        raise NotImplementedError

    def snapshot(self):
        """What a write of the table needs, taken on the owner's thread: the data version and a shallow copy of
        the table (one C-level dict copy). The copy is consistent because a config object in the table is never
        changed in place once there: a change puts a new object. Turning the items into JSON happens in
        :meth:`encode_snapshot`, which may run on the store's writer thread: at 50k groups that is ~0.7 s the event
        loop no longer spends."""
        return self.data_version.to_dict(), dict(self.table)

    def encode_snapshot(self, snapshot) -> bytes:
        data_version, table = snapshot
        return self.file.encode({"dataVersion": data_version, **self.EXTRA,
                                 self.TABLE_KEY: {k: self._item_to_json(v) for k, v in sorted(table.items())}})

    def to_document(self) -> dict:
        return json.loads(self.encode_snapshot(self.snapshot()))

    def _parse(self, doc):
        if not isinstance(doc, dict):
            raise StoreError("$: expected an object")
        table = doc.get(self.TABLE_KEY)
        table = {} if table is None else table
        if not isinstance(table, dict):
            raise StoreError(f"$.{self.TABLE_KEY}: expected an object")
        parsed = {k: self._item_from_json(k, v, f"$.{self.TABLE_KEY}[{k!r}]") for k, v in table.items()}
        dv = DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else DataVersion()
        return parsed, dv

    def load(self) -> None:
        loaded = self.file.load(self._parse, self._store.recover_corrupt)
        if loaded is not None:
            self.table, self.data_version = loaded


class KeyedConfigManager(ConfigManager):
    """A config table keyed by the items' ``KEY_ATTR``; every mutation bumps the data version and is persisted
    through the store (at once, or deferred when ``derivable``, see :class:`Store`)."""

    KEY_ATTR = ""

    def get(self, name: str):
        return self.table.get(name)

    def contains(self, name: str) -> bool:
        return name in self.table

    def put(self, config, derivable: bool = False):
        """Create or replace an entry (UPDATE_AND_CREATE_TOPIC/SUBSCRIPTIONGROUP); returns the previous one.

        ``derivable``: the entry is created again by the traffic that made it (a topic auto-created on a route
        query), so its write may be deferred (:class:`Store`); an admin change is written before returning.
        """
        name = getattr(config, self.KEY_ATTR)
        old = self.table.get(name)
        self.table[name] = config
        self._changed(derivable)
        return old

    def delete(self, name: str):
        old = self.table.pop(name, None)
        if old is not None:
            self._changed()
        return old

    def _changed(self, derivable: bool = False) -> None:
        self.data_version.next_version()
        self._store._config_changed(self, derivable)
