"""Broker metadata persisted as JSON under a store directory: topic configs, subscription-group configs and
consumer offsets (RocketMQ's TopicConfigManager, SubscriptionGroupManager and ConsumerOffsetManager).

The managers have modules of their own (issue 15): :mod:`engine.registry.topic_config_manager`,
:mod:`engine.registry.subscription_group_manager` and :mod:`engine.registry.consumer_offset_manager`, over the base of
:mod:`engine.registry.config_manager`. This module holds what they share on disk (the atomic writes and the loading rules
below) and :class:`Store`, which composes the three and decides when each is written; every name it had before the
split is still importable from here.

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
from pathlib import Path

from engine.registry.config_manager import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    ConfigManager,
    DataVersion,
    KeyedConfigManager,
    StoreError,
)
from engine.registry.consumer_offset_manager import QUERY_NOT_FOUND, ConsumerOffsetManager
from engine.codec.errors import clip
from engine.logutil import RateLimitedLog
from engine.registry.subscription_group_manager import (
    CID_RMQ_SYS_PREFIX,
    GROUP_MAX_LENGTH,
    SYSTEM_CONSUMER_GROUPS,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    validate_group,
)
from engine.registry.topic_config_manager import (
    FLAG_UNIT,
    FLAG_UNIT_SUB,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    TopicConfigManager,
)

log = logging.getLogger("engine.registry.store")

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

#: names that moved to the manager modules (issue 15), still importable from here
_REEXPORTED = (INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, CID_RMQ_SYS_PREFIX, GROUP_MAX_LENGTH)
_Table, _ConfigTable = ConfigManager, KeyedConfigManager


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
                 auto_create_max_topics: int = 0, recover_corrupt: bool = False, max_offset_entries: int = 0):
        #: a file whose every copy is unusable is moved aside (True) instead of stopping the load (StoreError)
        self.recover_corrupt = recover_corrupt
        #: auto-creation (heartbeats' groups and retry topics, route queries' topics) stops once a table holds this
        #: many entries, the broker's start topics not counted (0 = no limit); explicit changes (admin, config
        #: files) are not limited
        self.auto_create_max = {"group": auto_create_max_groups, "topic": auto_create_max_topics}
        #: committed offsets (one per group, topic and queue id) held at once; a new one past it is refused, an
        #: existing one still moves (0 = no limit)
        self.max_offset_entries = max_offset_entries
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

    def config_file(self, name: str) -> _JsonFile:
        """The persisted document ``name`` under ``config_dir`` (a manager's file; in memory when no directory)."""
        return _JsonFile(self.config_dir / name if self.config_dir is not None else None)

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
        if not limit:
            return False
        held = len(manager.table)
        if manager is self.topics:
            held -= manager.start_topic_count()  # the broker's own start topics (TBW102, ...) are not counted
        return held >= limit

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

    def may_add_offset(self) -> bool:
        """Whether the offset table may take one more entry; a refusal is counted (``offsets.refused``) and logged
        (at most once a minute)."""
        limit = self.max_offset_entries
        if not limit or self.offsets.entries < limit:
            return True
        self.offsets.refused += 1
        self._refusal_log.log(logging.WARNING, "offset", "not storing a new consumer offset: the consumer offset "
                              "table holds %d entries (maxConsumerOffsetEntries=%d)", self.offsets.entries, limit)
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

