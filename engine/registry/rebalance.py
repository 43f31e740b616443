"""RebalanceLockManager: the broker half of orderly consumers' rebalance (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).

An orderly consumer asks its broker to lock the queues its rebalance assigned to it; it consumes only the queues
the broker granted, and renews the locks every 20 s. Semantics are RocketMQ's
(``broker/.../client/rebalance/RebalanceLockManager.java``):

* a lock is per (consumer group, message queue) and is owned by one clientId;
* the owner's lock (or a request of the owner) renews it; another client gets it only once it has not been renewed
  for more than ``lock_max_live_time_ms`` (Java: ``-Drocketmq.broker.rebalance.lockMaxLiveTime``, 60 s);
* UNLOCK_BATCH_MQ releases only the caller's own locks; a connection that closes keeps its locks until they
  expire (clients unlock on shutdown; a killed one blocks its queues for at most the live time).

A message queue is (topic, brokerName, queueId), as MessageQueue.equals. Unlike Java's table, which keeps expired
entries forever, this one is bounded for untrusted clients: expired entries are purged by :meth:`purge_expired`
(the broker's housekeeping calls it) and at most ``max_entries`` locks exist at once; a lock that would pass the
budget is simply not granted (the client retries at its next renewal, as when another client holds the queue).
Its lines name a client's group, id and queue: they are written within the client-management log budget
(:class:`engine.registry.clientlog.ClientEventLog`, the broker's), those texts escaped and clipped.
"""
from __future__ import annotations

import logging
import time

from engine.registry.clientlog import ClientEventLog

log = logging.getLogger("engine.registry.rebalance")

#: RebalanceLockManager.REBALANCE_LOCK_MAX_LIVE_TIME's default (ms)
LOCK_MAX_LIVE_TIME_MS = 60_000


class RebalanceLockManager:
    """group -> {(topic, brokerName, queueId): [clientId, last update (monotonic s)]}."""

    def __init__(self, lock_max_live_time_ms: int = LOCK_MAX_LIVE_TIME_MS, max_entries: int = 1_000_000,
                 clock=time.monotonic, client_log: ClientEventLog | None = None):
        self.live_s = lock_max_live_time_ms / 1000.0
        self.max_entries = max_entries
        self.clock = clock
        self.table: dict[str, dict[tuple, list]] = {}
        self.entries = 0
        #: locks not granted because the table was at max_entries
        self.refused = 0
        #: the budget of its lines (the broker's client-management log budget; its own one otherwise)
        self.client_log = client_log if client_log is not None else ClientEventLog()

    def _expired(self, entry: list, now: float) -> bool:
        return now - entry[1] > self.live_s

    def try_lock_batch(self, group: str, mqs, client_id: str) -> list:
        """The queues of ``mqs`` (MessageQueue keys) that ``client_id`` now holds: new, renewed or taken over once
        expired; queues held by another live client are left out."""
        now = self.clock()
        locked = []
        group_locks = self.table.get(group)
        for mq in dict.fromkeys(mqs):  # a set, in request order
            entry = group_locks.get(mq) if group_locks is not None else None
            if entry is None:
                if self.entries >= self.max_entries:
                    self.refused += 1
                    continue
                if group_locks is None:
                    group_locks = self.table[group] = {}
                group_locks[mq] = [client_id, now]
                self.entries += 1
                self.client_log.log(log, logging.DEBUG, "lock_batch_new", "tryLockBatch: lock a message queue which "
                                    "has not been locked yet, group=%s, clientId=%s, mq=%s", group, client_id, mq)
                locked.append(mq)
            elif entry[0] == client_id and not self._expired(entry, now):
                entry[1] = now
                locked.append(mq)
            elif self._expired(entry, now):
                self.client_log.log(log, logging.INFO, "lock_batch_expired", "tryLockBatch: try to lock a expired "
                                    "message queue, group=%s, mq=%s, old client id=%s, new client id=%s", group, mq,
                                    entry[0], client_id)
                entry[0], entry[1] = client_id, now
                locked.append(mq)
            else:
                self.client_log.log(log, logging.DEBUG, "lock_batch_held", "tryLockBatch: message queue has been "
                                    "locked by other client, group=%s, mq=%s, locked client id=%s, current client "
                                    "id=%s", group, mq, entry[0], client_id)
        return locked

    def unlock_batch(self, group: str, mqs, client_id: str) -> int:
        """Release the caller's locks among ``mqs``; others' locks stay. Returns how many were released."""
        group_locks = self.table.get(group)
        if group_locks is None:
            return 0
        released = 0
        for mq in dict.fromkeys(mqs):
            entry = group_locks.get(mq)
            if entry is not None and entry[0] == client_id:
                del group_locks[mq]
                released += 1
        self.entries -= released
        if not group_locks:
            del self.table[group]
        return released

    def owner(self, group: str, mq) -> str | None:
        """The clientId holding a live lock on ``mq`` in ``group``, else None."""
        entry = self.table.get(group, {}).get(mq)
        if entry is None or self._expired(entry, self.clock()):
            return None
        return entry[0]

    def is_lock_all_expired(self, group: str) -> bool:
        now = self.clock()
        return all(self._expired(e, now) for e in self.table.get(group, {}).values())

    def purge_expired(self) -> int:
        """Drop expired entries (Java keeps them; an expired entry grants like a missing one, so dropping it
        changes no answer). Returns how many were dropped."""
        now = self.clock()
        dropped = 0
        for group in list(self.table):
            group_locks = self.table[group]
            stale = [mq for mq, e in group_locks.items() if self._expired(e, now)]
            for mq in stale:
                del group_locks[mq]
            dropped += len(stale)
            if not group_locks:
                del self.table[group]
        self.entries -= dropped
        return dropped
