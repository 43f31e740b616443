"""Crash safety: kill -9 at random points while the broker state is persisted (engine.registry.store) and while heartbeats
are recorded (engine.recording.recorder), then restart on the same files, again and again.

What must hold after every kill:

* store: every state file loads, from the current file (its rename is atomic) or, if the current file was lost
  afterwards (a torn write on power loss, simulated by truncating it), from ``.bak``; what loads is one complete
  version (all queues of a snapshot agree), never older than the last write the writer saw return (the backup:
  never older than the one before it); a leftover ``.tmp`` does not disturb load or the next write;
* recorder: every block written before the kill is readable, in order, byte for byte, across restarts that
  append new segments to the same directory (tests/test_recorder.py covers a single kill of one writer; this
  adds restarts, segment rolls at every few blocks and incompressible bodies, so kills land in rolls, in the
  file header of a new segment and in large writes).

A few kills run in the normal suite; the loops of at least 100 kills are marked slow.
"""
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.recording.recorder import iter_records, list_segments, scan_segment, verify
from engine.registry.store import Store, TopicConfig

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

QUEUES = 32
TOPICS = 48


def run_and_kill(script, args, seed, max_acks):
    """Start a writer, let it acknowledge 1..max_acks steps, kill -9 it at a random moment of the next ones.

    Returns the acknowledged values (ints, in order), including acks that were in the pipe at the kill.
    """
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, env=ENV)
    rng = random.Random(seed)
    acks = []
    try:
        for _ in range(rng.randrange(1, max_acks + 1)):
            line = proc.stdout.readline()
            if not line:
                break
            acks.append(int(line))
        time.sleep(rng.random() * 0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acks += [int(x) for x in proc.stdout.read().split()]  # a kill lands after the write returned
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "the writer died before the kill"
    assert acks, "the writer acknowledged nothing"
    return acks


# ---------------------------------------------------------------------------------------------------------------
# Store: consumerOffset.json (timer writes) and topics.json (written in the request that changes it)

STORE_WRITER = r"""
import sys
from engine.registry.store import Store, TopicConfig
directory = sys.argv[1]
QUEUES, TOPICS = %d, %d
store = Store(directory)
i = store.offsets.query_offset("G", "TopicA", 0) + 1      # carry on from what the last incarnation left
while True:
    for topic in ("TopicA", "TopicB"):
        for q in range(QUEUES):
            store.offsets.commit_offset("10.0.0.1", "G", topic, q, i)
    store.persist_offsets()
    if i %% 3 == 0:  # a config change is written at once: a topic, and the stamp saying which step wrote it
        n = 1 + i %% 16
        store.topics.put(TopicConfig("T%%d" %% (i %% TOPICS), read_queue_nums=n, write_queue_nums=n))
        store.topics.put(TopicConfig("STAMP", attributes={"step": str(i)}))
    sys.stdout.write("%%d\n" %% i); sys.stdout.flush()
    i += 1
""" % (QUEUES, TOPICS)


def offsets_version(table):
    """The single step all committed offsets of a loaded table come from (a torn snapshot fails here)."""
    values = {o for queues in table.values() for o in queues.values()}
    assert set(table) == {"TopicA@G", "TopicB@G"}, table.keys()
    assert all(len(q) == QUEUES for q in table.values())
    assert len(values) == 1, f"offsets from different versions in one file: {sorted(values)[:10]}"
    return values.pop()


def topics_step(store):
    stamp = store.topics.get("STAMP")
    return -1 if stamp is None else int(stamp.attributes["step"])


def load_clean(directory, caplog):
    """Store(directory) with no fallback and no error logged: the current files were complete."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(directory)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    return store


def check_store_after_kill(directory, acks, caplog):
    store = load_clean(directory, caplog)
    step = offsets_version(store.offsets.table)
    assert step >= acks[-1], f"lost an acknowledged offsets write: loaded step {step}, acknowledged {acks[-1]}"
    assert step <= acks[-1] + 1, "loaded a step the writer never started"
    topic_acks = [a for a in acks if a % 3 == 0]
    if topic_acks:
        assert topics_step(store) >= topic_acks[-1]
    for name in ("consumerOffset.json", "topics.json"):
        bak = Path(directory) / "config" / (name + ".bak")
        if bak.exists():  # the backup is a complete document too
            json.loads(bak.read_text(encoding="utf-8"))
    return step


def check_backup_fallback(directory, acks, seed, caplog):
    """Lose the current files (deleted, replaced by a torn copy, or damaged in place) and load again: the backups
    hold the step before. ``.bak`` is never a hard link of the current file (atomic_write links the old version
    to ``.bak.tmp``, which loaders ignore while it is the current file), so damage written into the current file's
    inode does not reach the backup."""
    rng = random.Random(seed)
    config = Path(directory) / "config"
    for name in ("consumerOffset.json", "topics.json"):
        path = config / name
        data = path.read_bytes()
        how = rng.random()
        if how < 0.25:
            path.unlink()
        elif how < 0.5:
            with open(path, "r+b") as f:  # in place: the same inode, and any link of it
                f.seek(rng.randrange(0, len(data)))
                f.write(b"\0" * 64)
        else:
            torn = path.with_name(name + ".torn")
            torn.write_bytes(data[: rng.randrange(0, len(data))])
            os.replace(torn, path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(directory)
    step = offsets_version(store.offsets.table)
    assert step >= acks[-1] - 1, f"backup older than the write before the last acknowledged: {step} < {acks[-1]}-1"
    assert any("loaded the backup" in r.getMessage() for r in caplog.records)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)
    return store


def store_kill_cycles(directory, kills, seed, caplog, max_acks=25):
    step = -1
    for k in range(kills):
        acks = run_and_kill(STORE_WRITER, [directory], seed * 1000 + k, max_acks)
        assert acks[0] == step + 1, "a restart did not carry on from the loaded state"
        step = check_store_after_kill(directory, acks, caplog)
        if k == 0:  # a leftover temp file (kill between write and rename) must not disturb anything
            (Path(directory) / "config" / "consumerOffset.json.tmp").write_bytes(b'{"offsetTable": {"tor')
    return step


def test_store_survives_kill_and_restart(tmp_path, caplog):
    store_kill_cycles(tmp_path / "broker", kills=4, seed=1, caplog=caplog)
    assert Store(tmp_path / "broker").offsets.query_offset("G", "TopicB", QUEUES - 1) >= 0


def test_store_falls_back_to_the_backup_when_the_current_file_is_lost(tmp_path, caplog):
    acks = run_and_kill(STORE_WRITER, [tmp_path], 7, 20)
    check_store_after_kill(tmp_path, acks, caplog)
    store = check_backup_fallback(tmp_path, acks, 7, caplog)
    # the next writes replace the torn files (not keeping them as backups): reload is clean again
    store.offsets.commit_offset("h", "G", "TopicA", 0, 10**6)
    store.persist_offsets()
    store.topics.put(TopicConfig("AfterRecovery"))
    again = load_clean(tmp_path, caplog)
    assert again.offsets.query_offset("G", "TopicA", 0) == 10**6 and again.topics.contains("AfterRecovery")
    for name in ("consumerOffset.json.bak", "topics.json.bak"):
        json.loads((tmp_path / "config" / name).read_text(encoding="utf-8"))


def test_store_with_both_files_lost_starts_empty_and_says_so(tmp_path, caplog):
    acks = run_and_kill(STORE_WRITER, [tmp_path], 3, 5)
    assert acks
    for p in (tmp_path / "config").iterdir():
        p.write_bytes(b"\x00" * 7)  # zeroed by the crash: no data left to keep
    with caplog.at_level(logging.ERROR, logger="engine.registry.store"):
        store = Store(tmp_path)
    assert store.offsets.table == {} and store.topics.get("STAMP") is None
    assert any("empty or missing" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


@pytest.mark.slow
def test_store_kill_loop(tmp_path, caplog):
    """100 kills: 10 directories, 10 kill/restart cycles each, every 5th also losing the current files."""
    kills = 0
    for d in range(10):
        directory = tmp_path / f"b{d}"
        step = -1
        for k in range(10):
            acks = run_and_kill(STORE_WRITER, [directory], d * 100 + k, 40)
            assert acks[0] == step + 1
            step = check_store_after_kill(directory, acks, caplog)
            kills += 1
            if k % 5 == 4:
                check_backup_fallback(directory, acks, d * 100 + k, caplog)
                step = offsets_version(Store(directory).offsets.table)
    assert kills == 100


# ---------------------------------------------------------------------------------------------------------------
# Store: a crash between every two steps of atomic_write (in process: the k-th file-system call dies)


class Crash(BaseException):
    """The process dies here. Not an OSError, so nothing in the store handles it."""


#: The calls atomic_write makes that change what is on disk (and the syncs that order them).
STEP_CALLS = ("replace", "link", "unlink", "fsync")


@contextlib.contextmanager
def crash_at(k, links=True):
    """Let the first k of os.replace/link/unlink/fsync run, die at the next one (before it acts).

    Yields the list of calls made; with ``links=False`` os.link fails as on a file system without hard links.
    """
    calls = []
    patch = pytest.MonkeyPatch()
    for name in STEP_CALLS:
        real = getattr(os, name)

        def step(*args, _name=name, _real=real, **kwargs):
            calls.append(_name)
            if len(calls) == k + 1:
                raise Crash(f"killed before os.{_name} (step {k})")
            if _name == "link" and not links:
                raise OSError("hard links not supported")
            return _real(*args, **kwargs)

        patch.setattr(os, name, step)
    try:
        yield calls
    finally:
        patch.undo()


def put_stamp(store, i):
    store.topics.put(TopicConfig("STAMP", attributes={"step": str(i)}))


def loaded_step(directory, caplog):
    """The step a restarted broker loads, and whether it had to fall back to a backup (or found nothing)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.registry.store"):
        store = Store(directory)
    return topics_step(store), bool(caplog.records)


def backup_step(directory, caplog):
    """The step loaded when the current topics.json is damaged *in place* (zeros written into its inode), which
    also hits any hard link of it; the file's bytes are put back afterwards (same inode, links intact)."""
    path = Path(directory) / "config" / "topics.json"
    if not path.exists():
        return loaded_step(directory, caplog)[0]
    data = path.read_bytes()
    with open(path, "r+b") as f:
        f.write(b"\0" * len(data))
    try:
        step, fell_back = loaded_step(directory, caplog)
        assert fell_back
        return step
    finally:
        with open(path, "r+b") as f:
            f.write(data)


def check_generations(directory, written, caplog):
    """After a crash while writing step ``written + 1`` (steps 1..written were acknowledged): the current file
    loads cleanly with ``written`` or ``written + 1``, and the backup holds the step before the current one
    (the current one again only after a first write). Returns the current step."""
    step, fell_back = loaded_step(directory, caplog)
    assert not fell_back, [r.getMessage() for r in caplog.records]
    if written == 0:
        assert step in (-1, 1)
        if step == 1:  # committed a first write: its backup copy may not have been made yet
            assert backup_step(directory, caplog) in (-1, 1)
        return step
    assert step in (written, written + 1), (step, written)
    assert backup_step(directory, caplog) == (step - 1 if step > 1 else 1)
    return step


def settle_after_restart(directory, step, caplog):
    """A restarted broker carries on: its next write leaves the pair (step + 1, step) and no temp files."""
    store = Store(directory)
    put_stamp(store, max(step, 0) + 1)
    current, fell_back = loaded_step(directory, caplog)
    assert current == max(step, 0) + 1 and not fell_back
    assert backup_step(directory, caplog) == (step if step >= 1 else 1)
    assert sorted(os.listdir(Path(directory) / "config")) == ["topics.json", "topics.json.bak"]


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "copy"])
@pytest.mark.parametrize("written", [0, 1, 2, 3])
def test_store_crash_at_every_step_of_a_write(tmp_path, caplog, written, links):
    k = 0
    while True:
        directory = tmp_path / f"k{k}"
        store = Store(directory)
        with crash_at(10**9, links):  # the acknowledged writes, through the same file system
            for i in range(1, written + 1):
                put_stamp(store, i)
        with crash_at(k, links) as calls:
            try:
                put_stamp(store, written + 1)
                crashed = False
            except Crash:
                crashed = True
        step = check_generations(directory, written, caplog)
        if not crashed:
            assert step == written + 1
            break
        with crash_at(10**9, links):
            settle_after_restart(directory, step, caplog)
        k += 1
    # every kill point was visited: the steps of one write (settle, .tmp fsync, link or copy, commit, .bak, dir)
    assert k == len(calls) and k >= (3 if written == 0 else 5), calls


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "copy"])
def test_store_crash_twice_in_a_row_at_every_pair_of_steps(tmp_path, caplog, links):
    """A crash while writing step 3, a restart, and a crash again while writing its next step: every pair of kill
    points. The second write first settles what the first one left (.bak.tmp, .bak.part)."""
    n = 0
    for k1 in range(7):
        for k2 in range(9):
            directory = tmp_path / f"k{k1}-{k2}"
            store = Store(directory)
            with crash_at(10**9, links):
                put_stamp(store, 1)
                put_stamp(store, 2)
            with crash_at(k1, links):
                try:
                    put_stamp(store, 3)
                except Crash:
                    pass
            first = check_generations(directory, 2, caplog)
            store = Store(directory)  # the restart
            with crash_at(k2, links):
                try:
                    put_stamp(store, first + 1)
                except Crash:
                    n += 1
            second = check_generations(directory, first, caplog)
            with crash_at(10**9, links):
                settle_after_restart(directory, second, caplog)
    assert n >= 30  # most pairs did crash twice (a write has 5 to 7 kill points)


# ---------------------------------------------------------------------------------------------------------------
# Store: deferred writes of derivable config (groups and retry topics auto-created by heartbeats)

DEFERRED_WRITER = r"""
import sys
sys.path.insert(0, sys.argv[2])
from engine.registry.client_registry import ClientRegistry
from engine.registry.store import Store, SubscriptionGroupConfig
from test_registry_model import hb
store = Store(sys.argv[1])
reg = ClientRegistry(store=store)
i = sum(1 for g in store.groups.table if g.startswith("ADMIN"))
while True:
    for j in range(5):  # auto-created by heartbeats: written at most once a second
        reg.heartbeat(j, hb(client_id="10.0.0.1@%%d" %% j, consumers=[("AUTO%%d_%%d" %% (i, j), ["T"])]))
    reg.persist_due()  # the broker's 1 s tick
    reg.update_subscription_group_config(SubscriptionGroupConfig("ADMIN%%d" %% i))  # acknowledged below
    sys.stdout.write("%%d\n" %% i); sys.stdout.flush()
    i += 1
""".replace("%%", "%")


def test_a_kill_inside_the_deferral_window_loses_only_derivable_entries(tmp_path, caplog):
    tests = str(Path(__file__).resolve().parent)
    for k in range(3):
        acks = run_and_kill(DEFERRED_WRITER, [tmp_path, tests], 40 + k, 200)
        store = load_clean(tmp_path, caplog)
        admin = {g for g in store.groups.table if g.startswith("ADMIN")}
        assert {f"ADMIN{i}" for i in range(acks[-1] + 1)} <= admin, "lost an acknowledged admin change"
        auto = {g for g in store.groups.table if g.startswith("AUTO")}
        # what was lost is derivable only; an admin write took every auto-created group made before it
        for i in range(acks[-1] + 1):
            assert {f"AUTO{i}_{j}" for j in range(5)} <= auto


# ---------------------------------------------------------------------------------------------------------------
# Recorder: restarts on the same directory, rolls every few blocks, incompressible bodies

RECORDER_WRITER = r"""
import hashlib, sys
from engine.recording.recorder import HeartbeatRecorder, iter_records
directory = sys.argv[1]
i = sum(1 for _ in iter_records(directory, on_corrupt="raise")) if __import__("os").path.isdir(directory) else 0
rec = HeartbeatRecorder(directory, max_segment_bytes=24_000, block_records=7, max_block_delay_s=3600)
while True:
    # incompressible, 200..2200 bytes: blocks of several KB, a roll every few blocks
    body = hashlib.sha256(b"%d" % i).hexdigest().encode() * (4 + i % 64) + b"#%d" % i
    rec.record(1_718_000_000_000 + i, i % 11, "10.2.0.%d:4100" % (i % 11), i % 3, 479, body)
    i += 1
    if i % 7 == 0:                       # record() wrote the block: acknowledge the records in it
        sys.stdout.write("%d\n" % i); sys.stdout.flush()
"""


def recorder_body(i):
    import hashlib

    return hashlib.sha256(b"%d" % i).hexdigest().encode() * (4 + i % 64) + b"#%d" % i


def check_recording(directory, acked):
    """Records 0..n-1 in order with n >= acked, whole blocks only, damage only as torn segment tails."""
    records = list(iter_records(directory))
    assert len(records) >= acked, f"lost acknowledged records: {len(records)} < {acked}"
    assert len(records) % 7 == 0
    for i, r in enumerate(records):
        assert r.recv_ms == 1_718_000_000_000 + i and r.conn_id == i % 11, i
        assert r.body == recorder_body(i), i
    report = verify(directory)
    assert report.ok and not report.corrupt, report.format()
    return len(records), len(report.torn_tails)


def recorder_kill_cycles(directory, kills, seed, max_acks=12):
    n, torn = 0, 0
    for k in range(kills):
        acks = run_and_kill(RECORDER_WRITER, [directory], seed * 1000 + k, max_acks)
        assert acks[0] == n + 7, "a restart did not append after what it read"
        n, t = check_recording(directory, acks[-1])
        torn += t
    segments = list_segments(directory)
    assert len(segments) >= kills  # every restart opens a segment of its own (and writers roll)
    for seg in segments:
        scan_segment(seg)  # never raises on a torn file
    return n, torn, len(segments)


def test_recorder_survives_kill_and_restart_with_rolls(tmp_path):
    n, _, _ = recorder_kill_cycles(tmp_path / "rec", kills=3, seed=5)
    assert n > 0


@pytest.mark.slow
def test_recorder_kill_loop(tmp_path):
    """100 kills: 10 recordings, 10 kill/restart cycles each."""
    total, torn, segments = 0, 0, 0
    for d in range(10):
        n, t, s = recorder_kill_cycles(tmp_path / f"r{d}", kills=10, seed=d)
        total, torn, segments = total + n, torn + t, segments + s
    assert segments > 100  # the writers rolled segments between kills, so kills also landed around rolls
    print(f"100 kills, {total} records readable in {segments} segments, {torn} torn segment tails seen")
