"""Broker metadata persisted as JSON under a store directory: topic configs, subscription-group configs and
consumer offsets (RocketMQ's TopicConfigManager, SubscriptionGroupManager and ConsumerOffsetManager).

Files, as the Java broker names them under ``<storePathRootDir>/config/``:

* ``topics.json``            ``{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig}}``
* ``subscriptionGroup.json`` ``{"dataVersion": {...}, "subscriptionGroupTable": {name: SubscriptionGroupConfig}}``
* ``consumerOffset.json``    ``{"dataVersion": {...}, "offsetTable": {"topic@group": {"queueId": offset}}}``

Writes are atomic and keep one generation back (:func:`atomic_write`): the new text goes to ``<file>.tmp`` and is
fsynced, the current file is linked (or copied) to ``<file>.bak.tmp``, the temp file is renamed over the file (the
commit), ``.bak.tmp`` is renamed to ``<file>.bak`` and the directory is fsynced. At every instant, a kill leaves
the last written version and the one before it where loading finds them. Loading falls back to the backup with a
logged warning when the file is missing, unreadable or corrupt, and starts empty with a logged error when both are;
it never raises. Java writes ``offsetTable`` maps with bare numeric keys (``{0:12}``, fastjson); we write standard
JSON (``{"0":12}``, which fastjson also reads) and read both.

Explicit config changes are written at once, as Java persists them in the request that made them; changes a
heartbeat makes (an auto-created group, a retry topic) are written at most once a second (:class:`Store`); offsets
are written by :meth:`Store.persist_offsets`, which the server calls on a timer
(``flushConsumerOffsetInterval``, 5 s) and at shutdown. One event loop owns a store; with
``background_writes=True`` (the broker) the timed writes are encoded on it and written (fsyncs included, 10-20 ms
here) by one writer thread, so a new group does not stall every connection for a disk write.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .errors import clip
from .logutil import RateLimitedLog

log = logging.getLogger("engine.store")

__all__ = [
    "ConsumerOffsetManager",
    "DataVersion",
    "FLAG_UNIT",
    "FLAG_UNIT_SUB",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "QUERY_NOT_FOUND",
    "SYSTEM_CONSUMER_GROUPS",
    "Store",
    "StoreError",
    "SubscriptionGroupConfig",
    "SubscriptionGroupManager",
    "TopicConfig",
    "TopicConfigManager",
    "atomic_write",
    "validate_group",
]

#: PermName bits (C/constant/PermName.java).
PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
#: TopicSysFlag bits (C/sysflag/TopicSysFlag.java).
FLAG_UNIT, FLAG_UNIT_SUB = 1, 2
#: ResponseCode.QUERY_NOT_FOUND: a consumer offset that was never committed.
QUERY_NOT_FOUND = 22

#: Groups SubscriptionGroupManager#init creates at start (the last five with consumeBroadcastEnable, the default).
SYSTEM_CONSUMER_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_RMQ_SYS_TRANS",
)
CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"
GROUP_MAX_LENGTH = 120
_GROUP_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class StoreError(ValueError):
    """A persisted file does not have the expected shape (the message names the JSON path)."""


def validate_group(group) -> tuple[bool, str]:
    """TopicValidator.validateGroup: non-blank, only ``[%|a-zA-Z0-9_-]``, at most 120 characters."""
    if group is None or not str(group).strip():
        return False, "The specified group is blank."
    if not _GROUP_CHARS.fullmatch(group):
        return False, f"The specified group: {group}, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(group) > GROUP_MAX_LENGTH:
        return False, f"The specified group: {group}, is longer than group max length: {GROUP_MAX_LENGTH}"
    return True, ""


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


@dataclass
class TopicConfig:
    """TopicConfig with the Java defaults (16 queues, perm READ|WRITE, SINGLE_TAG). ``to_dict`` uses Java keys."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "attributes": dict(self.attributes),
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, d, path="$") -> "TopicConfig":
        if not isinstance(d, dict):
            raise StoreError(f"{path}: expected an object")
        name = _get(d, "topicName", str, None, path)
        if not name:
            raise StoreError(f"{path}.topicName: missing")
        return cls(
            topic_name=name,
            read_queue_nums=_get(d, "readQueueNums", int, 16, path, INT32_MIN, INT32_MAX),
            write_queue_nums=_get(d, "writeQueueNums", int, 16, path, INT32_MIN, INT32_MAX),
            perm=_get(d, "perm", int, PERM_READ | PERM_WRITE, path, INT32_MIN, INT32_MAX),
            topic_filter_type=_get(d, "topicFilterType", str, "SINGLE_TAG", path),
            topic_sys_flag=_get(d, "topicSysFlag", int, 0, path, INT32_MIN, INT32_MAX),
            order=_get(d, "order", bool, False, path),
            attributes=_str_map(_or_empty(d.get("attributes")), f"{path}.attributes"),
        )


@dataclass
class SubscriptionGroupConfig:
    """SubscriptionGroupConfig with the defaults of PROTOCOL.md 6.12. ``to_dict`` uses Java keys."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    group_retry_policy: dict = field(default_factory=lambda: {"type": "CUSTOMIZED"})
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    subscription_data_set: list | None = None
    attributes: dict = field(default_factory=dict)

    _JAVA_KEYS = {
        "group_name": "groupName",
        "consume_enable": "consumeEnable",
        "consume_from_min_enable": "consumeFromMinEnable",
        "consume_broadcast_enable": "consumeBroadcastEnable",
        "consume_message_orderly": "consumeMessageOrderly",
        "retry_queue_nums": "retryQueueNums",
        "retry_max_times": "retryMaxTimes",
        "group_retry_policy": "groupRetryPolicy",
        "broker_id": "brokerId",
        "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
        "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
        "group_sys_flag": "groupSysFlag",
        "consume_timeout_minute": "consumeTimeoutMinute",
        "subscription_data_set": "subscriptionDataSet",
        "attributes": "attributes",
    }

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue  # fastjson omits nulls
            out[self._JAVA_KEYS[f.name]] = dict(value) if isinstance(value, dict) else value
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, d, path="$") -> "SubscriptionGroupConfig":
        if not isinstance(d, dict):
            raise StoreError(f"{path}: expected an object")
        name = _get(d, "groupName", str, None, path)
        if not name:
            raise StoreError(f"{path}.groupName: missing")
        policy = _get(d, "groupRetryPolicy", dict, None, path)
        subs = d.get("subscriptionDataSet")
        if subs is not None and not isinstance(subs, list):
            raise StoreError(f"{path}.subscriptionDataSet: expected an array")
        i32 = (INT32_MIN, INT32_MAX)
        i64 = (INT64_MIN, INT64_MAX)
        return cls(
            group_name=name,
            consume_enable=_get(d, "consumeEnable", bool, True, path),
            consume_from_min_enable=_get(d, "consumeFromMinEnable", bool, True, path),
            consume_broadcast_enable=_get(d, "consumeBroadcastEnable", bool, True, path),
            consume_message_orderly=_get(d, "consumeMessageOrderly", bool, False, path),
            retry_queue_nums=_get(d, "retryQueueNums", int, 1, path, *i32),
            retry_max_times=_get(d, "retryMaxTimes", int, 16, path, *i32),
            group_retry_policy=dict(policy) if policy is not None else {"type": "CUSTOMIZED"},
            broker_id=_get(d, "brokerId", int, 0, path, *i64),
            which_broker_when_consume_slowly=_get(d, "whichBrokerWhenConsumeSlowly", int, 1, path, *i64),
            notify_consumer_ids_changed_enable=_get(d, "notifyConsumerIdsChangedEnable", bool, True, path),
            group_sys_flag=_get(d, "groupSysFlag", int, 0, path, *i32),
            consume_timeout_minute=_get(d, "consumeTimeoutMinute", int, 15, path, *i32),
            subscription_data_set=list(subs) if subs is not None else None,
            attributes=_str_map(_or_empty(d.get("attributes")), f"{path}.attributes"),
        )


# --------------------------------------------------------------------------------------------------------------
# Atomic files


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # platforms without directory fds: the renames are still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _samefile(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _committed_backup(path: Path) -> Path | None:
    """``<file>.bak.tmp`` when an interrupted write left it holding the version before the current one.

    It is made (link or copy) after ``.tmp`` is complete and before the commit renames ``.tmp`` over the file, and
    the next write settles it before making a new ``.tmp``. So while ``.tmp`` exists, or while ``.bak.tmp`` is still
    the current file's inode, the commit did not happen and ``.bak.tmp`` is the current version again (a copy of
    it cannot be told from the previous version by name or inode, hence the ``.tmp`` rule).
    """
    bak_tmp = path.with_name(path.name + ".bak.tmp")
    if not os.path.lexists(bak_tmp) or os.path.lexists(path.with_name(path.name + ".tmp")):
        return None
    return None if _samefile(bak_tmp, path) else bak_tmp


def _settle_backup(path: Path) -> None:
    """Finish the backup step of a write that was interrupted (a kill, or an OSError between the renames): a
    ``.bak.tmp`` made after the commit takes the place of ``.bak`` (it is newer); one made before it is dropped."""
    part = path.with_name(path.name + ".bak.part")
    if os.path.lexists(part):
        os.unlink(part)  # a backup copy cut short: it never got a name that loaders read
    bak_tmp = path.with_name(path.name + ".bak.tmp")
    if _committed_backup(path) is not None:
        os.replace(bak_tmp, path.with_name(path.name + ".bak"))
    elif os.path.lexists(bak_tmp):
        os.unlink(bak_tmp)


def atomic_write(path: Path, data: bytes, backup: str = "previous") -> None:
    """Replace ``path`` with ``data`` atomically, keeping the version before it as ``path.bak``.

    ``backup`` says what ``.bak`` holds afterwards:

    * ``"previous"``: the file being replaced (its inode, by a hard link, or a copy where links are not
      supported); when there is no file to replace and no ``.bak`` either (a first write), a copy of ``data``,
      so that a damaged file still has a complete backup; an existing ``.bak`` beside a missing file is kept;
    * ``"keep"``: ``.bak`` is left alone (the current file is known to be bad and must not become the backup);
    * ``"new"``: a copy of ``data`` (nothing on disk is usable).

    Steps, and what a kill between any two of them leaves (N-1 in ``.bak``, N current, N+1 being written):

    1. N+1 to ``.tmp``, fsynced                       (N, N-1); a stale ``.tmp`` is overwritten next time
    2. ``.bak.tmp`` = a hard link of N (or a copy)    (N, N-1); ``.bak.tmp`` is N again: ignored while ``.tmp``
                                                      exists (and while it is the current file's inode)
    3. rename ``.tmp`` -> file: the commit            (N+1, N-1) with N in ``.bak.tmp``, which loaders read as
                                                      the backup (no ``.tmp`` left, not the current inode)
    4. rename ``.bak.tmp`` -> ``.bak``                (N+1, N)
    5. fsync of the directory (the renames survive power loss)

    So the loaders always find the last acknowledged version and the one before it. ``.bak`` is never a link of
    the current file, so damage written into the current file in place never reaches the backup. The next write
    first settles a ``.bak.tmp`` left by an interrupted one (:func:`_settle_backup`).
    """
    if backup not in ("previous", "keep", "new"):
        raise ValueError(f"backup must be 'previous', 'keep' or 'new', not {backup!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    bak = path.with_name(path.name + ".bak")
    bak_tmp = path.with_name(path.name + ".bak.tmp")
    part = path.with_name(path.name + ".bak.part")  # a backup copy being written; never read
    _settle_backup(path)
    _write_synced(tmp, data)
    if backup == "previous" and path.exists():
        try:
            os.link(path, bak_tmp)  # the old inode survives the commit below under the .bak.tmp name
        except OSError:
            _write_synced(part, path.read_bytes())  # complete and synced before it gets a name loaders read
            os.replace(part, bak_tmp)
        os.replace(tmp, path)
        os.replace(bak_tmp, bak)
    else:
        os.replace(tmp, path)
        if backup == "new" or (backup == "previous" and not bak.exists()):
            # there never was an earlier version: the backup is this one, in a file of its own
            _write_synced(part, data)
            os.replace(part, bak)
    _fsync_dir(path.parent)


_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def _parse_json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        # fastjson writes Map<Integer, Long> with bare numeric keys ({0:12}); quote them and retry
        return json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))


class _JsonFile:
    """One persisted JSON document with the load-with-fallback and atomic-write rules of this module."""

    def __init__(self, path: Path | None):
        self.path = path
        # what load() found: "main" (the file is a valid document, safe to keep as .bak), the backup Path it
        # fell back to, or None (nothing usable: the next write is a first write)
        self._loaded = None
        # writes may come from the loop (explicit changes) and the writer thread (timed ones): one at a time, and a
        # document encoded earlier never replaces one encoded later
        self._lock = threading.Lock()
        self._encoded = 0  # sequence number of the last document encoded
        self._written = 0  # ... and of the last one on disk

    def load(self, parse, recover: bool = False):
        """``parse(obj)`` validates a decoded document; returns its result, or None for a fresh store.

        Tries the file, then the backup: ``.bak.tmp`` when a write was interrupted after its commit (it is newer
        than ``.bak``, see :func:`atomic_write`), then ``.bak``. Read only: what is left over is
        settled by the next write. When no copy loads and some copy holds data (anything but whitespace and NUL
        bytes), StoreError (as Java's initialize() fails and the broker exits when its .bak does not decode): the
        next write would replace that data with an empty table. ``recover`` instead moves the copies aside
        (``<name>.corrupt-<time>``, never overwritten) and starts empty. Copies that are all missing or empty
        start empty with an error logged, as Java does.
        """
        if self.path is None:
            return None
        pending = _committed_backup(self.path)
        candidates = [self.path] + ([pending] if pending is not None else [])
        candidates.append(self.path.with_name(self.path.name + ".bak"))
        if not any(os.path.lexists(p) for p in candidates):
            return None  # fresh store
        errors = []
        had_data = False
        for p in candidates:
            try:
                raw = p.read_bytes()
                had_data = had_data or bool(raw.strip(b" \t\r\n\x00"))
                text = raw.decode("utf-8")
                if not text.strip():
                    raise StoreError("empty file")
                result = parse(_parse_json(text))
            except FileNotFoundError:
                errors.append(f"{p.name}: missing")
                continue
            except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
                errors.append(f"{p.name}: {type(e).__name__}: {e}")
                continue
            if p is self.path:
                self._loaded = "main"
            else:
                log.warning("%s is unusable (%s); loaded the backup %s", self.path, errors[0], p)
                self._loaded = p
            return result
        if not had_data:
            log.error("%s and its backup are empty or missing (%s); starting with an empty table", self.path,
                      "; ".join(errors))
            return None
        if not recover:
            raise StoreError(f"{self.path} and its backup are unusable ({'; '.join(errors)}); not starting over "
                             "them: move them aside, or set storeRecoverCorruptFiles=true to have them moved aside "
                             "and start with an empty table")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        moved = []
        for p in candidates:
            if os.path.lexists(p):
                target = p.with_name(f"{p.name}.corrupt-{stamp}")
                n = 1
                while os.path.lexists(target):
                    target, n = p.with_name(f"{p.name}.corrupt-{stamp}-{n}"), n + 1
                os.rename(p, target)
                moved.append(target.name)
        _fsync_dir(self.path.parent)
        log.error("%s and its backup are unusable (%s); moved aside as %s (storeRecoverCorruptFiles), starting with "
                  "an empty table", self.path, "; ".join(errors), ", ".join(moved))
        return None

    def next_seq(self) -> int:
        """The sequence number of a document snapshotted now (on the owner's thread: snapshots are ordered)."""
        self._encoded += 1
        return self._encoded

    @staticmethod
    def encode(document: dict) -> bytes:
        return json.dumps(document, indent=1, ensure_ascii=False).encode("utf-8")

    def write_encoded(self, seq: int, data: bytes) -> None:
        """Write an encoded document unless a later one is already on disk (any thread)."""
        if self.path is None:
            return
        with self._lock:
            if seq > self._written:
                self._write_locked(data)
                self._written = seq

    def _write_locked(self, data: bytes) -> None:
        if self._loaded == "main":
            backup = "previous"
        elif self._loaded is None:
            backup = "new"  # a fresh store, or nothing on disk was usable
        else:
            # the current file is bad and must not become the backup; the one loaded stays (a .bak.tmp becomes
            # .bak when the write settles it). A .bak.tmp that was passed over is unusable: it must not replace
            # the good .bak that was loaded.
            backup = "keep"
            bak_tmp = self.path.with_name(self.path.name + ".bak.tmp")
            if self._loaded != bak_tmp and os.path.lexists(bak_tmp):
                os.unlink(bak_tmp)
        atomic_write(self.path, data, backup=backup)
        self._loaded = "main"


# --------------------------------------------------------------------------------------------------------------
# Managers


class _Table:
    """A table persisted as one JSON document: ``{"dataVersion": ..., TABLE_KEY: {key: item}}`` (with the
    constant members of ``EXTRA``), loaded with the fallbacks of :class:`_JsonFile`."""

    FILE_NAME = TABLE_KEY = ""
    EXTRA: dict = {}

    def __init__(self, store: "Store"):
        self._store = store
        self.table: dict = {}
        self.data_version = DataVersion()
        self.file = _JsonFile(store.config_dir / self.FILE_NAME if store.config_dir else None)

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
        return _JsonFile.encode({"dataVersion": data_version, **self.EXTRA,
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


class _ConfigTable(_Table):
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


class TopicConfigManager(_ConfigTable):
    """The topic table (TopicConfigManager): ``topics.json``."""

    FILE_NAME, TABLE_KEY, KEY_ATTR = "topics.json", "topicConfigTable", "topic_name"

    def put(self, config, derivable: bool = False):
        old = super().put(config, derivable)
        if old is None:
            self._store.topic_created(config.topic_name)
        return old

    def _item_from_json(self, key, value, path):
        return TopicConfig.from_dict(value, path)

    def is_order_topic(self, topic: str) -> bool:
        tc = self.table.get(topic)
        return tc is not None and tc.order

    def create_topic_in_send_message_back_method(self, topic: str, queue_nums: int, perm: int, is_order: bool,
                                                 topic_sys_flag: int) -> tuple[TopicConfig, bool]:
        """createTopicInSendMessageBackMethod: an existing topic only gets its order flag adjusted.

        Returns ``(config, changed)`` where ``changed`` says whether the table was modified (created or updated);
        ``(None, False)`` when the table is at its auto-create limit (:meth:`Store.may_auto_create`).
        """
        tc = self.table.get(topic)
        if tc is not None:
            if is_order is not None and tc.order != is_order:  # None (4.x): the order flag is left alone
                # replaced, not changed in place: a queued write's snapshot (a shallow copy of the table, encoded
                # later on the writer thread) keeps the config object as it was
                tc = self.table[topic] = replace(tc, order=is_order)
                self._changed(derivable=True)  # the next heartbeat sets it again
                return tc, True
            return tc, False
        if not self._store.may_auto_create(self, topic):
            return None, False
        tc = TopicConfig(topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm,
                         topic_sys_flag=topic_sys_flag, order=bool(is_order))
        self.table[topic] = tc
        log.info("create new topic %s", tc)
        self._changed(derivable=True)  # a retry topic: the next heartbeat of the group creates it again
        self._store.topic_created(topic)
        return tc, True


class SubscriptionGroupManager(_ConfigTable):
    """The subscription-group table (SubscriptionGroupManager): ``subscriptionGroup.json``, with the system
    groups of ``init()``."""

    FILE_NAME, TABLE_KEY, KEY_ATTR = "subscriptionGroup.json", "subscriptionGroupTable", "group_name"
    EXTRA = {"forbiddenTable": {}}

    def __init__(self, store: "Store"):
        super().__init__(store)
        for name in SYSTEM_CONSUMER_GROUPS:
            self.table[name] = SubscriptionGroupConfig(name)

    def _item_from_json(self, key, value, path):
        return SubscriptionGroupConfig.from_dict(value, path)

    def find(self, group: str, auto_create: bool, enable_create_sys_group: bool) -> tuple:
        """findSubscriptionGroupConfig: ``(config or None, created)``.

        A missing group is created with the defaults when auto-create is on, or when it is a ``CID_RMQ_SYS_``
        group and creating system groups is on, provided validateGroup accepts the name.
        """
        config = self.table.get(group)
        if config is not None:
            return config, False
        if not (auto_create or (enable_create_sys_group and group is not None
                                and group.startswith(CID_RMQ_SYS_PREFIX))):
            return None, False
        ok, _ = validate_group(group)
        if not ok:
            return None, False
        if not self._store.may_auto_create(self, group):
            return None, False
        config = SubscriptionGroupConfig(group)
        self.table[group] = config
        log.debug("auto-created subscription group %s", group)  # Java's line is the registry's (engine.clientlog)
        self._changed(derivable=True)  # the next heartbeat of the group creates it again
        return config, True

    def load(self) -> None:
        system = dict(self.table)
        super().load()
        self.table = {**system, **self.table}  # Java: init() first, then the file's entries over them


class ConsumerOffsetManager(_Table):
    """Committed consumer offsets: ``"topic@group" -> {queueId: offset}`` (ConsumerOffsetManager):
    ``consumerOffset.json``, written by :meth:`Store.persist_offsets` (the broker's timer), not on every commit."""

    FILE_NAME, TABLE_KEY = "consumerOffset.json", "offsetTable"
    SEPARATOR = "@"

    def __init__(self, store: "Store"):
        super().__init__(store)
        self.dirty = False

    def commit_offset(self, client_host: str, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = topic + self.SEPARATOR + group
        queues = self.table.get(key)
        if queues is None:
            self.table[key] = {queue_id: offset}
        else:
            stored = queues.get(queue_id)
            queues[queue_id] = offset
            if stored is not None and offset < stored:
                log.debug("update consumer offset less than store. clientHost=%s, key=%s, queueId=%s, "
                          "requestOffset=%s, storeOffset=%s", client_host, key, queue_id, offset, stored)
        self.dirty = True

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
            del self.table[k]
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

    def write_failed(self) -> None:
        self.dirty = True  # the next flush retries


class Store:
    """The three persisted tables of a broker under ``store_dir/config`` (``None``: in memory only).

    ``Store(path)`` loads what is on disk at once. When a config file is written:

    * an explicit change (``put``/``delete``: the admin API, acknowledged to its caller) is written in the call
      that made it, as Java's managers persist in the request;
    * a derivable one (a subscription group or retry topic auto-created by a heartbeat, a topic auto-created by a
      route query, a retry topic's order flag) is written at most once per ``derivable_write_delay_s`` (1 s):
      changes coalesce until the delay since the first unwritten one has passed, then one write takes them all,
      from :meth:`persist_due` (the broker calls it every second), from the next change after the delay, from the
      next explicit change of the same file, or from :meth:`persist` at shutdown. The next heartbeat recreates
      whatever a kill inside the window loses. Java writes the whole JSON file with every auto-created group;
      in a storm of new groups that was most of the broker's CPU (O(groups) writes of an O(groups) file).
      ``derivable_write_delay_s=0`` writes them at once too.

    ``sync_config_writes=False`` defers every config write to :meth:`persist`. Consumer offsets are written by
    :meth:`persist_offsets` (the broker's ``flushConsumerOffsetInterval`` timer, 5 s, as ConsumerOffsetManager).

    ``background_writes=True``: the timed writes (derivable config, offsets) are snapshotted in the caller's thread
    (a shallow copy of the table, with a sequence number) and JSON-encoded and written by one writer thread in
    order, so the event loop never encodes a whole document and an older document never replaces a later one;
    explicit changes stay synchronous (encoded and written before their caller is answered). A failed background
    write (any exception) is logged and leaves the file dirty for the next write; :meth:`persist` waits for the
    writer and then writes what is left; :meth:`close` stops the thread.
    """

    def __init__(self, store_dir=None, *, sync_config_writes: bool = True, derivable_write_delay_s: float = 1.0,
                 clock=time.monotonic, background_writes: bool = False, auto_create_max_groups: int = 0,
                 auto_create_max_topics: int = 0, recover_corrupt: bool = False):
        #: a file whose every copy is unusable is moved aside (True) instead of stopping the load (StoreError)
        self.recover_corrupt = recover_corrupt
        #: auto-creation (heartbeats' groups and retry topics, route queries' topics) stops once a table holds this
        #: many entries (0 = no limit); explicit changes (admin, config files) are not limited
        self.auto_create_max = {"group": auto_create_max_groups, "topic": auto_create_max_topics}
        #: kind -> auto-creations refused by the limit
        self.auto_create_refused: Counter = Counter()
        self._refusal_log = RateLimitedLog(log)
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.config_dir = self.store_dir / "config" if self.store_dir is not None else None
        self.sync_config_writes = sync_config_writes
        self.derivable_write_delay_s = derivable_write_delay_s
        self._clock = clock
        self._dirty_configs: set = set()
        self._due: dict = {}  # manager -> clock time its unwritten derivable changes are to be written
        self.background_writes = background_writes
        self._writer: ThreadPoolExecutor | None = None
        self._queued: list = []  # a manager per background write not finished yet (list ops are atomic)
        self.topics = TopicConfigManager(self)
        self.groups = SubscriptionGroupManager(self)
        self.offsets = ConsumerOffsetManager(self)
        self.load()
        #: called with the name of each topic created after loading (a retry topic, an auto-created or an admin
        #: topic): the broker pushes it to the name servers at once, as TopicConfigManager does
        self.on_topic_created = None

    def topic_created(self, topic: str) -> None:
        hook = self.on_topic_created
        if hook is not None:
            try:
                hook(topic)
            except Exception:
                log.exception("on_topic_created hook failed for %s", clip(topic, 64))

    def load(self) -> None:
        self.topics.load()
        self.groups.load()
        self.offsets.load()

    def at_auto_create_limit(self, manager) -> bool:
        """Whether ``manager`` (topics or groups) holds as many entries as auto-creation may reach."""
        limit = self.auto_create_max["group" if manager is self.groups else "topic"]
        return bool(limit) and len(manager.table) >= limit

    def may_auto_create(self, manager, name: str) -> bool:
        """Whether ``manager`` (topics or groups) may auto-create one more entry; a refusal is counted and logged
        (at most once a minute)."""
        if not self.at_auto_create_limit(manager):
            return True
        kind = "group" if manager is self.groups else "topic"
        limit = self.auto_create_max[kind]
        self.auto_create_refused[kind] += 1
        self._refusal_log.log(logging.WARNING, kind, "not auto-creating %s %s: the table holds %d entries "
                              "(autoCreateMax%s=%d)", kind, clip(name, 64), len(manager.table),
                              "SubscriptionGroups" if kind == "group" else "Topics", limit)
        return False

    def _config_changed(self, manager, derivable: bool = False) -> None:
        if self.config_dir is None:
            return
        if not self.sync_config_writes:
            self._dirty_configs.add(manager)
        elif derivable and self.derivable_write_delay_s > 0:
            now = self._clock()
            due = self._due.get(manager)
            if due is None:
                self._due[manager] = now + self.derivable_write_delay_s
            elif now >= due:
                self._write(manager, background=True)
        else:
            self._write(manager)  # also takes the file's unwritten derivable changes

    def _write(self, manager, background: bool = False) -> None:
        self._due.pop(manager, None)
        self._dirty_configs.discard(manager)
        # the snapshot and its sequence number are taken here, in order; the encoding runs with the write
        snapshot, seq = manager.snapshot(), manager.file.next_seq()
        if background and self.background_writes:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
            self._queued.append(manager)
            self._writer.submit(self._write_snapshot, manager, seq, snapshot, True)
        else:
            self._write_snapshot(manager, seq, snapshot)

    def _write_snapshot(self, manager, seq: int, snapshot, background: bool = False) -> None:
        try:
            manager.file.write_encoded(seq, manager.encode_snapshot(snapshot))
        except Exception as e:
            # on the writer thread nobody else would see the failure (it would stay in the future): whatever
            # failed, the file is left dirty; a synchronous write's caller still gets a failure that is not I/O
            if not (background or isinstance(e, OSError)):
                raise
            # keep serving from memory; the next write retries (Java logs and carries on the same way)
            if manager is self.offsets:
                manager.write_failed()
            else:
                self._dirty_configs.add(manager)
            log.exception("persisting %s failed", manager.file.path)
        finally:
            if background:
                self._queued.remove(manager)

    def persist_due(self) -> int:
        """Write the config files whose derivable changes have waited ``derivable_write_delay_s``; returns how many
        files were written (the broker calls this every second)."""
        if not self._due:
            return 0
        now = self._clock()
        due = [m for m, t in self._due.items() if now >= t]
        for manager in due:
            self._write(manager, background=True)
        return len(due)

    @property
    def pending_config_writes(self) -> int:
        """Config files with changes not yet on disk (deferred derivable changes, failed or deferred writes)."""
        return len(self._dirty_configs | set(self._due) | (set(self._queued) - {self.offsets}))

    def persist_offsets(self, background: bool = True) -> None:
        """Write consumerOffset.json if an offset changed since the last write (in the writer thread when
        ``background_writes`` and ``background``)."""
        if self.config_dir is not None and self.offsets.dirty:
            self.offsets.data_version.next_version()
            self.offsets.dirty = False
            self._write(self.offsets, background=background)

    def flush(self) -> None:
        """Wait until the background writes queued so far are on disk (or have failed)."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def persist(self) -> None:
        """Write every changed table, synchronously, after the queued background writes (shutdown, or the timer
        when ``sync_config_writes`` is off)."""
        if self.config_dir is None:
            return
        self.flush()
        for manager in list(self._dirty_configs | set(self._due)):
            self._write(manager)
        self.persist_offsets(background=False)

    def close(self) -> None:
        """Finish the queued background writes and stop the writer thread (the store stays usable, synchronously
        until the next background write starts a new thread)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)

