"""ConsumerOffsetManager (org.apache.rocketmq.broker.offset.ConsumerOffsetManager): committed consumer offsets,
``consumerOffset.json`` (``"topic@group" -> {queueId: offset}``).

commitOffset, queryOffset (-1 when none was committed: the processor answers offset 0 under 4.9.8's rules and
QUERY_NOT_FOUND under 5.x's, see Processors.query_consumer_offset), the offsets of a
group being removed with it, and the file's shape: Java writes the queue maps with bare numeric keys (``{0:12}``,
fastjson), this manager writes standard JSON (``{"0":12}``, which fastjson also reads) and reads both; an offset is
an int64. A commit only marks the table dirty: the store writes it on the broker's ``flushConsumerOffsetInterval``
timer and at shutdown (:meth:`engine.registry.store.Store.persist_offsets`). What may be committed (under 5.x rules an
existing group and topic; a queue id and an offset present) is the caller's check (:meth:`engine.registry.client_registry.ClientRegistry.update_consumer_offset`);
how many entries the table may hold is the store's (``max_offset_entries``, the broker's maxConsumerOffsetEntries):
past it a new entry is refused, an existing one still moves.
"""
from __future__ import annotations

import logging

from engine.registry.config_manager import INT64_MAX, INT64_MIN, ConfigManager, StoreError

log = logging.getLogger("engine.registry.store")

__all__ = ["QUERY_NOT_FOUND", "ConsumerOffsetManager"]

#: ResponseCode.QUERY_NOT_FOUND: a consumer offset that was never committed.
QUERY_NOT_FOUND = 22


class ConsumerOffsetManager(ConfigManager):
    """Committed consumer offsets: ``"topic@group" -> {queueId: offset}`` (ConsumerOffsetManager):
    ``consumerOffset.json``, written by :meth:`Store.persist_offsets` (the broker's timer), not on every commit."""

    FILE_NAME, TABLE_KEY = "consumerOffset.json", "offsetTable"
    SEPARATOR = "@"

    def __init__(self, store: "Store"):
        super().__init__(store)
        self.dirty = False
        #: (topic@group, queue id) entries in the table: a commit of a new one stops at the store's
        #: ``max_offset_entries`` (the client chooses the queue id, any int32)
        self.entries = 0
        #: commits refused by that budget
        self.refused = 0

    def commit_offset(self, client_host: str, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """commitOffset; False (nothing stored) when the offset would be a new entry and the table is at the
        store's budget (:meth:`engine.registry.store.Store.may_add_offset`); an existing entry is always updated."""
        key = topic + self.SEPARATOR + group
        queues = self.table.get(key)
        if queues is None or queue_id not in queues:
            if not self._store.may_add_offset():
                return False
            self.entries += 1
        if queues is None:
            self.table[key] = {queue_id: offset}
        else:
            stored = queues.get(queue_id)
            queues[queue_id] = offset
            if stored is not None and offset < stored:
                log.debug("update consumer offset less than store. clientHost=%s, key=%s, queueId=%s, "
                          "requestOffset=%s, storeOffset=%s", client_host, key, queue_id, offset, stored)
        self.dirty = True
        return True

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when none was committed (ConsumerOffsetManager.queryOffset)."""
        queues = self.table.get(topic + self.SEPARATOR + group)
        if queues is not None:
            offset = queues.get(queue_id)
            if offset is not None:
                return offset
        return -1

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(topic + self.SEPARATOR + group) or {})

    def remove(self, group: str, topic: str | None = None) -> int:
        """Drop the offsets of a group (on one topic or all); returns how many topic@group keys went."""
        keys = [k for k in self.table
                if k.rpartition(self.SEPARATOR)[2] == group and (topic is None or k.rpartition(self.SEPARATOR)[0] == topic)]
        for k in keys:
            self.entries -= len(self.table.pop(k))
        if keys:
            self.dirty = True
        return len(keys)

    def _item_to_json(self, queues):
        return {str(q): o for q, o in sorted(queues.items())}

    def snapshot(self):
        # the queue maps are updated in place by commit_offset: copy them too (the encoding still runs later)
        return self.data_version.to_dict(), {k: dict(v) for k, v in self.table.items()}

    def _item_from_json(self, key, queues, path):
        if self.SEPARATOR not in key:
            raise StoreError(f"{path}: key is not topic@group")
        if not isinstance(queues, dict):
            raise StoreError(f"{path}: expected an object")
        out = {}
        for q, o in queues.items():
            try:
                qid = int(q)
            except ValueError:
                raise StoreError(f"{path}: queue id {q!r} is not an integer") from None
            if isinstance(o, bool) or not isinstance(o, int) or not INT64_MIN <= o <= INT64_MAX:
                raise StoreError(f"{path}[{q!r}]: expected an int64 offset")
            out[qid] = o
        return out

    def load(self) -> None:
        super().load()
        self.entries = sum(len(queues) for queues in self.table.values())

    def write_failed(self) -> None:
        self.dirty = True  # the next flush retries
