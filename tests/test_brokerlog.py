"""Broker-log parser (native and twin) and the log analyses, without Spark: the shared 4.9.8 sample log, parity
under hypothesis, damaged lines, rolled/gzipped files, zones, and generated logs with exact-match findings."""
import gzip
import importlib
import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import strict

from engine.recording import _brokerlog_py as twin
from engine.bindings import brokerlog as bl
from engine.codec.errors import RemotingError

SAMPLE = Path(os.environ.get("ENGINE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared")) / "samples" / \
    "rocketmq-4.9.8-broker.log"

try:
    native = importlib.import_module("engine.recording._brokerlog")
except ImportError:  # pragma: no cover - not built
    native = None

IMPLS = ["twin"] + (["native"] if native is not None else [])
if native is None and strict():
    raise RuntimeError("engine.recording._brokerlog is not built (required under CI=true / ENGINE_REQUIRE_NATIVE=1)")


def _parse(impl):
    return native.parse_lines if impl == "native" else twin.parse_lines


def _compact(batch):
    out = []
    for r in batch.to_pylist():
        hm = datetime.fromtimestamp(r["ts_ms"] / 1000, timezone.utc).strftime("%H:%M:%S")
        c = r["client_id"].split("-")[1] if r["client_id"] else None
        a = r["addr"].split(":")[1] if r["addr"] else None
        out.append((hm, r["kind"], r["role"], r["group"], c, a))
    return out


SAMPLE_RUNS = [
    [  # run 1
        ('08:48:06', 'group_created', 'consumer', 'CID_J', None, None),
        ('08:48:06', 'register', 'consumer', 'CID_J', '21494', '58188'),
        ('08:48:06', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:48:06', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:48:06', 'consumer_data', 'consumer', 'CID_J', None, '58188'),
        ('08:48:06', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '21494', '58188'),
        ('08:48:06', 'register', 'producer', 'PID_J', '21494', '58188'),
        ('08:48:26', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:48:27', 'unregister', 'consumer', 'CID_J', '21494', '58188'),
        ('08:48:27', 'group_removed', 'consumer', 'CID_J', None, None),
        ('08:48:27', 'unregister', 'producer', 'PID_J', '21494', '58188'),
        ('08:48:27', 'group_removed', 'producer', 'PID_J', None, None),
        ('08:48:27', 'unregister', 'producer', 'CLIENT_INNER_PRODUCER', '21494', '58188'),
        ('08:48:27', 'group_removed', 'producer', 'CLIENT_INNER_PRODUCER', None, None),
    ],
    [  # run 2
        ('08:49:38', 'register', 'consumer', 'CID_J', '21930', '46828'),
        ('08:49:38', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:49:38', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:49:38', 'consumer_data', 'consumer', 'CID_J', None, '46828'),
        ('08:49:38', 'register', 'producer', 'PID_J', '21930', '46828'),
        ('08:49:38', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '21930', '46828'),
        ('08:49:38', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:49:53', 'unregister', 'consumer', 'CID_J', '21930', '46828'),
        ('08:49:53', 'group_removed', 'consumer', 'CID_J', None, None),
        ('08:49:53', 'unregister', 'producer', 'PID_J', '21930', '46828'),
        ('08:49:53', 'group_removed', 'producer', 'PID_J', None, None),
        ('08:49:53', 'unregister', 'producer', 'CLIENT_INNER_PRODUCER', '21930', '46828'),
        ('08:49:53', 'group_removed', 'producer', 'CLIENT_INNER_PRODUCER', None, None),
    ],
    [  # run 3
        ('08:49:56', 'register', 'consumer', 'CID_J', '21988', '35256'),
        ('08:49:56', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:49:56', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:49:56', 'consumer_data', 'consumer', 'CID_J', None, '35256'),
        ('08:49:56', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '21988', '35256'),
        ('08:49:56', 'register', 'producer', 'PID_J', '21988', '35256'),
        ('08:49:56', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:50:01', 'closed', 'producer', 'CLIENT_INNER_PRODUCER', '21988', '35256'),
        ('08:50:01', 'closed', 'producer', 'PID_J', '21988', '35256'),
        ('08:50:01', 'closed', 'consumer', 'CID_J', '21988', '35256'),
        ('08:50:01', 'group_removed', 'consumer', 'CID_J', None, None),
    ],
    [  # run 4
        ('08:50:11', 'register', 'consumer', 'CID_J', '22076', '42712'),
        ('08:50:11', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:50:11', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:50:11', 'consumer_data', 'consumer', 'CID_J', None, '42712'),
        ('08:50:11', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '22076', '42712'),
        ('08:50:11', 'register', 'producer', 'PID_J', '22076', '42712'),
        ('08:50:11', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:52:46', 'unregister', 'consumer', 'CID_J', '22076', '42712'),
        ('08:52:46', 'group_removed', 'consumer', 'CID_J', None, None),
        ('08:52:46', 'unregister', 'producer', 'PID_J', '22076', '42712'),
        ('08:52:46', 'group_removed', 'producer', 'PID_J', None, None),
        ('08:52:46', 'unregister', 'producer', 'CLIENT_INNER_PRODUCER', '22076', '42712'),
        ('08:52:46', 'group_removed', 'producer', 'CLIENT_INNER_PRODUCER', None, None),
    ],
    [  # run 5
        ('08:54:10', 'register', 'consumer', 'CID_J', '22284', '35120'),
        ('08:54:10', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:54:10', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:54:10', 'consumer_data', 'consumer', 'CID_J', None, '35120'),
        ('08:54:10', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '22284', '35120'),
        ('08:54:10', 'register', 'producer', 'PID_J', '22284', '35120'),
        ('08:54:10', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:54:16', 'closed', 'producer', 'CLIENT_INNER_PRODUCER', '22284', '35120'),
        ('08:54:16', 'closed', 'producer', 'PID_J', '22284', '35120'),
        ('08:54:16', 'closed', 'consumer', 'CID_J', '22284', '35120'),
        ('08:54:16', 'group_removed', 'consumer', 'CID_J', None, None),
    ],
    [  # run 6
        ('08:57:17', 'register', 'consumer', 'CID_J', '23274', '44178'),
        ('08:57:17', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:57:17', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:57:17', 'consumer_data', 'consumer', 'CID_J', None, '44178'),
        ('08:57:17', 'register', 'producer', 'PID_J', '23274', '44178'),
        ('08:57:17', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '23274', '44178'),
        ('08:57:17', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:59:24', 'expired', 'producer', 'CLIENT_INNER_PRODUCER', None, '44178'),
        ('08:59:24', 'expired', 'producer', 'PID_J', None, '44178'),
        ('08:59:24', 'expired', 'consumer', 'CID_J', None, '44178'),
        ('08:59:24', 'group_cleared', 'consumer', 'CID_J', None, None),
        ('08:59:42', 'register', 'consumer', 'CID_J', '23274', '46134'),
        ('08:59:42', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:59:42', 'sub_add', 'consumer', 'CID_J', None, None),
        ('08:59:42', 'consumer_data', 'consumer', 'CID_J', None, '46134'),
        ('08:59:42', 'register', 'producer', 'CLIENT_INNER_PRODUCER', '23274', '46134'),
        ('08:59:42', 'register', 'producer', 'PID_J', '23274', '46134'),
        ('08:59:42', 'sub_change', 'consumer', 'CID_J', None, None),
        ('08:59:52', 'unregister', 'consumer', 'CID_J', '23274', '46134'),
        ('08:59:52', 'group_removed', 'consumer', 'CID_J', None, None),
        ('08:59:52', 'unregister', 'producer', 'PID_J', '23274', '46134'),
        ('08:59:52', 'group_removed', 'producer', 'PID_J', None, None),
        ('08:59:52', 'unregister', 'producer', 'CLIENT_INNER_PRODUCER', '23274', '46134'),
        ('08:59:52', 'group_removed', 'producer', 'CLIENT_INNER_PRODUCER', None, None),
    ],
]

RUN_STARTS = ["08:48:06", "08:49:38", "08:49:56", "08:50:11", "08:54:10", "08:57:17"]


@pytest.mark.parametrize("impl", IMPLS)
def test_sample_every_event_of_the_six_runs(impl):
    lines = SAMPLE.read_bytes().split(b"\n")
    batch, stats = _parse(impl)(lines)
    events = _compact(batch)
    runs = [[] for _ in RUN_STARTS]
    for e in events:
        runs[max(i for i, s in enumerate(RUN_STARTS) if e[0] >= s)].append(e)
    assert runs == SAMPLE_RUNS
    # every client-management line is an event; the rest are the pull / Netty error lines of the README
    assert stats["events"] == 86
    assert {k: v for k, v in stats["counts"].items() if not k.startswith("event_")} == {"other": 25, "blank": 1}


@pytest.mark.parametrize("impl", IMPLS)
def test_sample_fields(impl):
    batch, _ = _parse(impl)(SAMPLE.read_bytes().split(b"\n"))
    rows = batch.to_pylist()
    reg = rows[1]
    assert (reg["client_id"], reg["addr"], reg["language"], reg["version"], reg["consume_type"], reg["message_model"],
            reg["last_update_ms"]) == ("127.0.0.1@JavaDriver-21494-3325534811882", "127.0.0.1:58188", "JAVA", 409,
                                       "CONSUME_PASSIVELY", "CLUSTERING", 1795481286885)
    add = rows[3]
    assert (add["topic"], add["sub_string"], add["expression_type"], add["sub_version"]) == (
        "TopicTest", "TagA || TagB", "TAG", 1795481285872)
    cd = rows[4]
    assert cd["kind"] == "consumer_data" and cd["addr"] == "127.0.0.1:58188"
    assert cd["sub_key"] == '[["%RETRY%CID_J","TAG","*"],["TopicTest","TAG","TagA || TagB"]]'
    ch = rows[7]
    assert (ch["kind"], ch["topic"], ch["old_sub_version"], ch["sub_version"]) == (
        "sub_change", "%RETRY%CID_J", 1795481285873, 1795481306935)


def test_sample_scan_finds_the_expiry():
    f = bl.scan_local([SAMPLE], log_tz="+08:00")
    assert f["expired_clients"] == [{
        "broker": "samples", "client_id": "127.0.0.1@JavaDriver-23274-3877417792690", "addr": "127.0.0.1:44178",
        "expired_ms": 1795481964000, "groups": ["CID_J", "PID_J"], "roles": ["consumer", "producer"],
        "connected_ms": 1795481837000, "cause": "scan", "silent_since_before_ms": 1795481844000,
        "returned_ms": 1795481982000}]
    # 08:59:24 +08:00 is 00:59:24 UTC; the lines' own lastUpdateTimestamp agrees with the zone given
    assert datetime.fromtimestamp(1795481964, timezone.utc).strftime("%H:%M:%S") == "00:59:24"
    assert f["log"]["zone_check"] == {"inferred_utc_offset_min": 480, "log_tz_offset_min": 480, "agrees": True}
    assert f["flapping_clients"] == [] and f["inconsistent_subscriptions"] == [] and f["heartbeat_gaps"] == []
    assert "heartbeat_gaps" in f["unsupported"]
    sizes = {(g["group"], g["role"]): g for g in f["group_sizes"]}
    assert sizes[("CID_J", "consumer")]["members"] == 6 and sizes[("CID_J", "consumer")]["max_members"] == 1
    # the frozen client is out between the SCAN (00:59:24) and its return (00:59:42)
    series = dict(map(tuple, sizes[("CID_J", "consumer")]["series"]))
    assert series[1795481964000] == 0 and series[1795481982000] == 1
    assert f["summary"]["records"] == 86 and f["summary"]["bad_bodies"] == 0 and f["summary"]["clients"] == 6


def test_wrong_zone_is_flagged():
    f = bl.scan_local([SAMPLE], log_tz="UTC")
    assert f["log"]["zone_check"]["agrees"] is False
    assert f["log"]["zone_check"]["inferred_utc_offset_min"] == 480


# --- damaged input ---------------------------------------------------------------------------------------------

DAMAGED = [
    b"",
    b"\tat org.apache.rocketmq.broker.BrokerController.start(BrokerController.java:1)",
    b"Nov 24, 2026 8:48:06 AM org.apache.rocketmq.broker.BrokerStartup main",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - new consumer connected, group: CID_J CONSUME_PASSIVELY",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - new producer connected, group: P channel: ClientChannelInfo [ch",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - subscription changed, group: G something else",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - unregister a producer group[] from groupChannelTable",
    b"2026-13-24 08:48:06 INFO HeartbeatThread_1 - unregister a producer group[P] from groupChannelTable",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - unregister a producer group[P\xff] from groupChannelTable",
    b"2026-11-24 08:48:06,123 INFO HeartbeatThread_1 - unregister a producer group[P] from groupChannelTable\r\n",
    b"2026-11-24 08:48:06 INFO HeartbeatThread_1 - some other message",
]


@pytest.mark.parametrize("impl", IMPLS)
def test_unparseable_lines_are_counted_by_kind(impl):
    batch, stats = _parse(impl)(DAMAGED)
    assert stats["counts"] == {"blank": 1, "continuation": 1, "unknown_format": 2, "malformed_register": 2,
                               "malformed_sub_change": 1, "malformed_group_removed": 1, "invalid_utf8": 1,
                               "other": 1, "event_group_removed": 1}
    assert stats["examples"]["unknown_format"] == DAMAGED[2].decode()
    assert stats["examples"]["invalid_utf8"].endswith("P\ufffd] from groupChannelTable")
    assert batch.to_pylist()[0]["ts_ms"] % 1000 == 123 and batch.to_pylist()[0]["line"] == 9


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_batches_raise_typed_errors(impl):
    parse = _parse(impl)
    for bad, msg in ((pa.array([1, 2]), "log lines must be a string or binary array"),
                     ("a line", "log lines must be a pyarrow array or a list"),
                     ([b"x", 3], "log line 1 is a 'int'")):
        with pytest.raises(twin.BrokerLogError, match=msg) as ei:
            parse(bad)
        assert isinstance(ei.value, RemotingError) and isinstance(ei.value, ValueError)
    with pytest.raises(twin.BrokerLogError, match="base_line"):
        parse([b"x"], "0")


# --- parity ----------------------------------------------------------------------------------------------------

_SAMPLE_LINES = SAMPLE.read_bytes().split(b"\n") if SAMPLE.exists() else [b""]
_PIECES = [b"SubscriptionData [classFilterMode=", b", topic=", b", subString=", b", tagsSet=[", b", subVersion=",
           b", expressionType=", b"]", b"[", b" ", b", ", b"ClientChannelInfo [channel=", b", clientId=", b"R:/",
           b"\"", b"\\", b"\x01", b"\xc3\xa9", b"\xff", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"9" * 19, b"-", b"\n"]


@st.composite
def _lines(draw):
    out = []
    for _ in range(draw(st.integers(0, 8))):
        base = draw(st.sampled_from(_SAMPLE_LINES + DAMAGED + V5 + CHANGED + UNKNOWN_CLIENT))
        kind = draw(st.integers(0, 3))
        if kind == 1 and base:  # cut
            base = base[:draw(st.integers(0, len(base)))]
        elif kind == 2 and base:  # splice a piece in
            i = draw(st.integers(0, len(base)))
            base = base[:i] + draw(st.sampled_from(_PIECES)) + base[i:]
        elif kind == 3:
            base = draw(st.binary(max_size=60))
        out.append(base)
    return out


@pytest.mark.skipif(native is None, reason="engine.recording._brokerlog not built")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lines(), st.sampled_from(["list", "binary", "large_binary", "slice"]), st.integers(0, 2**40))
def test_native_and_twin_agree(lines, form, base):
    if form == "binary":
        lines = pa.array(lines, pa.binary())
    elif form == "large_binary":
        lines = pa.array(lines, pa.large_binary())
    elif form == "slice":
        lines = pa.array([b"pad"] + lines + [None], pa.binary()).slice(1)
    a = b = None
    try:
        a = native.parse_lines(lines, base)
    except Exception as e:  # noqa: BLE001 - compared below
        a = (type(e), str(e))
    try:
        b = twin.parse_lines(lines, base)
    except Exception as e:  # noqa: BLE001
        b = (type(e), str(e))
    if isinstance(a, tuple) and isinstance(a[0], type):
        assert a == b
    else:
        assert a[0].equals(b[0]), (a[0].to_pylist(), b[0].to_pylist())
        assert a[1] == b[1]


@pytest.mark.skipif(native is None, reason="engine.recording._brokerlog not built")
def test_sub_key_escaping_parity():
    line = (b"2026-11-24 08:48:06 INFO T - registerConsumer info changed ConsumerData [groupName=G, consumeType=C, "
            b"messageModel=M, consumeFromWhere=W, unitMode=false, subscriptionDataSet=[SubscriptionData "
            b"[classFilterMode=false, topic=B, subString=a = 'x\"\\\x01\xc3\xa9', tagsSet=[], codeSet=[], subVersion=1, "
            b"expressionType=SQL92], SubscriptionData [classFilterMode=false, topic=A, subString=*, tagsSet=[], "
            b"codeSet=[], subVersion=2, expressionType=TAG], SubscriptionData [classFilterMode=false, topic=A, "
            b"subString=*, tagsSet=[], codeSet=[], subVersion=3, expressionType=TAG]]] 1.2.3.4:5")
    a, b = native.parse_lines([line]), twin.parse_lines([line])
    assert a[0].equals(b[0]) and a[1] == b[1]
    assert a[0].column("sub_key")[0].as_py() == '[["A","TAG","*"],["B","SQL92","a = \'x\\"\\\\\\u0001é\'"]]'


# --- 5.x lines ---------------------------------------------------------------------------------------------------

V5 = [
    b"2025-01-02 03:04:05,678 WARN ClientHousekeepingScheduledThread1 - ProducerManager#scanNotActiveChannel: remove "
    b"expired channel[10.0.0.5:4321] from ProducerManager groupChannelTable, producer group name: PG",
    b"2025-01-02 03:04:05,679 WARN ClientHousekeepingScheduledThread1 - SCAN: remove expired channel from "
    b"ProducerManager groupChannelTable, all clear, group=PG",
    b"2025-01-02 03:04:06,000 INFO HeartbeatThread_1 - ClientManageProcessor: registerConsumer info changed, SDK "
    b"address=10.0.0.6:1234, consumerData=ConsumerData [groupName=CG, consumeType=CONSUME_PASSIVELY, messageModel="
    b"BROADCASTING, consumeFromWhere=CONSUME_FROM_LAST_OFFSET, unitMode=false, subscriptionDataSet=[]]",
    b"2025-01-02 03:04:06,001 INFO HeartbeatThread_1 - heartBeatV2 ClientManageProcessor: registerConsumer info "
    b"changed, SDK address=10.0.0.6:1234, consumerData=ConsumerData [groupName=CG, consumeType=CONSUME_ACTIVELY, "
    b"messageModel=CLUSTERING, consumeFromWhere=CONSUME_FROM_LAST_OFFSET, unitMode=false, subscriptionDataSet=["
    b"SubscriptionData [classFilterMode=false, topic=T, subString=*, tagsSet=[], codeSet=[], subVersion=7, "
    b"expressionType=TAG]]]",
    b"2025-01-02 03:04:07,000 WARN HeartbeatThread_1 - subscription changed, group: CG remove topic T "
    b"SubscriptionData [classFilterMode=false, topic=T, subString=*, tagsSet=[], codeSet=[], subVersion=7, "
    b"expressionType=TAG]",
    b"2025-01-02 03:04:08,000 INFO AdminBrokerThread_1 - create new subscription group, SubscriptionGroupConfig"
    b"{groupName=CG2, consumeEnable=true}",
    b"2025-01-02 03:04:09,000 INFO AdminBrokerThread_1 - delete subscription group OK, subscription group:"
    b"SubscriptionGroupConfig{groupName=CG2, consumeEnable=true}",
]


@pytest.mark.parametrize("impl", IMPLS)
def test_5x_lines(impl):
    batch, stats = _parse(impl)(V5)
    rows = batch.to_pylist()
    assert [(r["kind"], r["role"], r["group"], r["addr"]) for r in rows] == [
        ("expired", "producer", "PG", "10.0.0.5:4321"), ("group_cleared", "producer", "PG", None),
        ("consumer_data", "consumer", "CG", "10.0.0.6:1234"), ("consumer_data", "consumer", "CG", "10.0.0.6:1234"),
        ("sub_remove", "consumer", "CG", None), ("group_created", "consumer", "CG2", None),
        ("group_deleted", "consumer", "CG2", None)]
    assert rows[0]["ts_ms"] % 1000 == 678
    assert rows[2]["sub_key"] == "[]" and rows[3]["sub_key"] == '[["T","TAG","*"]]'
    assert stats["events"] == len(V5)


# --- files, zones ------------------------------------------------------------------------------------------------


def test_rolled_and_gzipped_files_give_the_same_findings(tmp_path):
    one = tmp_path / "one" / "broker-a"
    m = bl.generate_broker_log(one / "broker.log", seed=3)
    whole = bl.scan_local([one], log_tz="+08:00")
    lines = (one / "broker.log").read_bytes().splitlines(keepends=True)
    rolled = tmp_path / "rolled" / "broker-a"
    (rolled / "otherdays").mkdir(parents=True)
    k = len(lines) // 3
    with gzip.open(rolled / "otherdays" / "broker.2.log.gz", "wb") as f:  # oldest
        f.writelines(lines[:k])
    (rolled / "broker.log.1").write_bytes(b"".join(lines[k:2 * k]))
    (rolled / "broker.log").write_bytes(b"".join(lines[2 * k:]))
    split = bl.scan_local([rolled], log_tz="+08:00")
    for key in bl.LOG_FINDING_KEYS:
        assert split[key] == whole[key], key
    assert split["log"]["counts"] == whole["log"]["counts"] == m["counts"]
    assert split["log"]["brokers"] == ["broker-a"] and len(split["log"]["files"]) == 3


def test_broker_names_from_option_and_directory(tmp_path):
    bl.generate_broker_log(tmp_path / "x" / "broker.log", seed=1, inject=False)
    bl.generate_broker_log(tmp_path / "broker-b" / "broker.log", seed=2, inject=False)
    plan = bl.plan_files([tmp_path / "broker-b"], {"broker-a": str(tmp_path / "x")})
    assert [(b, Path(f).parent.name) for b, f, _ in plan] == [("broker-a", "x"), ("broker-b", "broker-b")]


def test_zones():
    import numpy as np

    local = np.array([0, 3_600_000], dtype=np.int64)
    tz, label, source = bl.resolve_tz("+08:00")
    assert bl.to_utc_ms(local, tz).tolist() == [-28_800_000, -25_200_000] and source == "--log-tz"
    tz, _, _ = bl.resolve_tz("Europe/Berlin")
    # 2025-03-30 02:30 does not exist in Berlin, 2025-07-01 12:00 is CEST (+2), 2025-01-01 12:00 is CET (+1)
    walls = [datetime(2025, 7, 1, 12), datetime(2025, 1, 1, 12)]
    ms = np.array([int(w.replace(tzinfo=timezone.utc).timestamp() * 1000) for w in walls], dtype=np.int64)
    assert (ms - bl.to_utc_ms(ms, tz)).tolist() == [7_200_000, 3_600_000]
    tz, label, source = bl.resolve_tz(None)
    assert source.startswith("machine")


# --- generated logs: exact findings ------------------------------------------------------------------------------


@pytest.mark.parametrize("native_parser", [False] + ([True] if native is not None else []))
def test_generated_log_findings_match_the_injected_anomalies(tmp_path, native_parser):
    m = bl.generate_broker_log(tmp_path / "broker-a" / "broker.log", groups=4, members=5, restarts=3, seed=7)
    f = bl.scan_local([tmp_path / "broker-a"], log_tz="+08:00", native=native_parser)
    assert [(r["client_id"], r["groups"], r["reconnect_ms"]) for r in f["flapping_clients"]] == [
        (x["client_id"], x["groups"], x["reconnect_ms"]) for x in m["flapping"]]
    # the report's timeline marks: its first register and every reconnect; one close per NETTY EVENT channel
    # removal (three lines each: consumer, producer and inner producer group), counted once
    (flap,) = f["flapping_clients"]
    assert flap["connect_ms"] == [flap["reconnect_ms"][0] - 60_000] + flap["reconnect_ms"] == m["flapping"][0]["connect_ms"]
    assert flap["closes"] == [[t - 5_000, "closed"] for t in flap["reconnect_ms"]] == m["flapping"][0]["closes"]
    # the deviating member's address: the R:/ address of its register line (ClientChannelInfo), not its clientId's
    log = (tmp_path / "broker-a" / "broker.log").read_text()
    want = sorted(set(re.findall(r"R:/([0-9.]+:\d+)\], clientId=10\.9\.0\.3@odd", log)))
    wide = sorted(set(re.findall(r"R:/([0-9.]+:\d+)\], clientId=10\.9\.0\.4@broadcast", log)))
    assert want and wide and f["member_addresses"] == [
        {"broker": "broker-a", "group": "CID_G0", "client_id": "10.9.0.4@broadcast", "addrs": wide},
        {"broker": "broker-a", "group": "CID_G2", "client_id": "10.9.0.3@odd", "addrs": want}]
    assert [{k: r[k] for k in ("client_id", "addr", "expired_ms", "groups", "connected_ms", "returned_ms")}
            for r in f["expired_clients"]] == m["expired"]
    members = [r for r in f["inconsistent_subscriptions"] if r["source"] == "members"]
    assert [{k: r[k] for k in ("group", "start_ms", "end_ms", "variants")} for r in members] == m["inconsistent"]
    table = [r for r in f["inconsistent_subscriptions"] if r["source"] == "group_table"]
    assert [{k: r[k] for k in ("group", "topic", "flips", "start_ms", "end_ms")} for r in table] == m["flips"]
    assert [(r["group"], r["adds"], r["changes"], r["removes"]) for r in f["retry_topic_churn"]] == [
        (x["group"], x["adds"], x["changes"], x["removes"]) for x in m["retry_churn"]] == [("CID_G0", 4, 0, 4)]
    assert f["log"]["counts"] == m["counts"]
    assert f["log"]["unparseable_by_kind"] == {"malformed_register": 1, "unknown_format": 1}
    assert f["heartbeat_gaps"] == []
    # every steady member is counted: 5 per group, plus the injected clients (the flapper and the BROADCASTING
    # member in group 0)
    sizes = {(g["group"], g["role"]): g["members"] for g in f["group_sizes"]}
    assert sizes[("CID_G3", "consumer")] == 5 and sizes[("CID_G0", "consumer")] == 7
    assert sizes[("CID_G2", "consumer")] == 6 and sizes[("CLIENT_INNER_PRODUCER", "producer")] == 24


def test_analyses_read_only_the_scan_columns(tmp_path):
    """The Spark scan asks its tasks for SCAN_COLUMNS only: the analyses over rows holding just those columns give
    the findings of the full rows (a key the analyses read beyond them fails here, by KeyError or a difference),
    over a generated log with every injected anomaly, the client-id takeovers and the 4.9.8 sample."""
    bl.generate_broker_log(tmp_path / "broker-a" / "broker.log", groups=4, members=5, restarts=3, seed=7)
    (tmp_path / "broker-x").mkdir()
    (tmp_path / "broker-x" / "broker.log").write_bytes(b"\n".join(CHANGED) + b"\n")
    for paths, tz in (([tmp_path / "broker-a", tmp_path / "broker-x"], "+08:00"), ([SAMPLE], "+08:00")):
        table, info = bl.read_local(paths, log_tz=tz)
        rows = table.to_pylist()
        narrow = table.select(list(bl.SCAN_COLUMNS)).to_pylist()
        assert set(narrow[0]) == set(bl.SCAN_COLUMNS) and len(narrow) == len(rows) > 80
        full = bl.analyze_events(rows, info)
        assert bl.analyze_events(narrow, info) == full
        assert full["expired_clients"] and full["group_sizes"]
    assert set(bl.SCAN_COLUMNS) < set(bl.events_schema().names)


def test_event_columns_are_checked():
    assert bl.event_columns() == tuple(bl.events_schema().names)
    assert bl.event_columns(["ts_ms", "kind"]) == ("ts_ms", "kind") and bl.event_columns("kind") == ("kind",)
    for bad in (["kind", "nope"], ["kind", "kind"], []):
        with pytest.raises(bl.EventColumnsError) as e:
            bl.event_columns(bad)
        assert isinstance(e.value, RemotingError) and isinstance(e.value, ValueError)
    with pytest.raises(bl.EventColumnsError, match="unknown: nope"):
        bl.event_columns(["nope"])


def test_generated_log_without_anomalies_has_no_findings(tmp_path):
    bl.generate_broker_log(tmp_path / "b" / "broker.log", restarts=2, inject=False, seed=5)
    f = bl.scan_local([tmp_path / "b"], log_tz="+08:00")
    assert all(f[k] == [] for k in bl.LOG_FINDING_KEYS if k != "group_sizes")
    assert f["log"]["unparseable"] == 0


def test_scan_command_line_routing(tmp_path):
    from engine.recording.recorder import HeartbeatRecorder

    rec_dir = tmp_path / "rec"
    with HeartbeatRecorder(rec_dir) as rec:
        rec.record(1, 1, "10.0.0.1:1", "JAVA", 1, b"{}")
    logs = tmp_path / "broker-a"
    bl.generate_broker_log(logs / "broker.log", inject=False)
    assert not bl.wants_broker_logs([str(rec_dir), "--out", "x", "--master", "local[2]"])
    assert not bl.wants_broker_logs([str(tmp_path / "missing"), "--out", "x"])
    assert bl.wants_broker_logs([str(logs), "--out", "x"])
    assert bl.wants_broker_logs([str(logs / "broker.log"), "--out", "x", "--no-plots"])
    assert bl.wants_broker_logs([str(rec_dir), "--out", "x", "--input", "broker-log"])
    assert bl.wants_broker_logs(["--broker", f"a={logs}", "--out", "x"])
    assert bl.scan_main([str(logs), "--out", str(tmp_path / "o"), "--broker", "nameonly"]) == 2
    assert bl.scan_main([str(tmp_path / "missing.log"), "--out", str(tmp_path / "o")]) == 2
    assert bl.scan_main([str(logs), "--out", str(tmp_path / "o"), "--log-tz", "Mars/Olympus"]) == 2


def test_generate_command_writes_logs_and_a_manifest_the_scan_matches(tmp_path):
    from engine.cli import main

    out = tmp_path / "fleet"
    assert main(["generate", str(out), "--format", "broker-log", "--brokers", "2", "--groups", "4", "--members", "5",
                 "--lines", "3000", "--hours", "3", "--seed", "4"]) == 0
    doc = bl.load_manifest(out)
    assert doc["format"] == bl.MANIFEST_FORMAT and sorted(doc["brokers"]) == ["broker-a", "broker-b"]
    assert all(abs(m["lines"] - 3000) < 600 for m in doc["brokers"].values())
    for m in doc["brokers"].values():  # every kind of anomaly is injected
        assert m["flapping"] and m["expired"] and m["inconsistent"] and m["flips"] and m["retry_churn"]
    f = bl.scan_local([out], log_tz=doc["log_tz"])
    assert bl.compare_with_generated(f, doc) == []
    # the comparison is not vacuous: a missed expiry and an extra flapping client are named
    f["expired_clients"] = f["expired_clients"][1:]
    f["flapping_clients"].append({**f["flapping_clients"][0], "client_id": "someone@else"})
    problems = bl.compare_with_generated(f, doc)
    assert len(problems) == 2 and {p.split(" ")[0] for p in problems} == {"expired_clients", "flapping_clients"}
    # a second run into the same directory is refused; a clean fleet, one broker, gzipped
    assert main(["generate", str(out), "--format", "broker-log"]) == 2
    clean = tmp_path / "clean"
    assert main(["generate", str(clean), "--format=broker-log", "--no-anomalies", "--gzip", "--groups", "2",
                 "--members", "3", "--hours", "1"]) == 0
    doc = bl.load_manifest(clean)
    assert list(doc["brokers"]) == ["clean"] and (clean / "broker.log.gz").exists()
    f = bl.scan_local([clean], log_tz="+08:00")
    assert bl.compare_with_generated(f, doc) == [] and f["flapping_clients"] == f["expired_clients"] == []
    assert main(["generate", str(tmp_path / "x"), "--format", "pcap"]) == 2



def test_scan_input_kind_detection(tmp_path):
    """`rmqhb scan PATH...` takes the kind from --format (alias --input), else from what the paths are."""
    import gzip as gz

    from engine.cli import main
    from engine.recording.recorder import HeartbeatRecorder

    rec = tmp_path / "rec"
    with HeartbeatRecorder(rec) as r:
        r.record(1, 1, "10.0.0.1:1", "JAVA", 1, b"{}")
    logs = tmp_path / "broker-a"
    bl.generate_broker_log(logs / "broker.log", inject=False)
    caps = tmp_path / "caps"
    caps.mkdir()
    (caps / "x.pcap").write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(20))
    with gz.open(caps / "y.pcapng.gz", "wb") as f:
        f.write(b"\x0a\x0d\x0d\x0a" + bytes(20))
    out = ["--out", str(tmp_path / "o")]
    assert bl.input_format([str(rec)] + out) == ("recording", "detected")
    assert bl.input_format([str(logs)] + out) == ("broker-log", "detected")
    assert bl.input_format([str(logs / "broker.log"), str(tmp_path / "broker-a")] + out)[0] == "broker-log"
    assert bl.input_format([str(caps)] + out) == ("pcap", "detected")
    assert bl.input_format([str(caps / "y.pcapng.gz")] + out) == ("pcap", "detected")
    assert bl.input_format([str(rec), str(logs)] + out)[0] is None
    assert bl.input_format([str(rec), "--format", "broker-log"] + out) == ("broker-log", "--format")
    assert bl.input_format([str(rec), "--input=broker-log"] + out) == ("broker-log", "--input")
    assert bl.input_format([str(rec), "--log-tz", "UTC"] + out)[0] == "broker-log"
    assert bl.input_format([str(tmp_path / "missing")] + out) == ("recording", "default")
    assert bl.input_format([str(tmp_path / "manifest-only")] + out)[0] == "recording"
    # the command: mixed kinds and unknown formats are usage errors naming the paths, before any Spark starts
    assert main(["scan", str(rec), str(logs)] + out) == 2
    assert main(["scan", str(rec), "--format", "parquet"] + out) == 2
    assert main(["scan", str(logs), "--format", "recording"] + out) == 2  # no segments there


@pytest.mark.parametrize("native_cut", [False] + ([True] if native is not None else []))
def test_line_batches_cut_files_exactly(tmp_path, native_cut):
    """Lines cut from a plain file (mmap windows) and from its .gz (reads) are the file's lines, line ends kept,
    whatever the window size: empty file, blank lines, CRLF, a line longer than the window, no final newline."""
    import gzip as gz

    text = b"a\n\nb\r\n" + b"x" * 5000 + b"\n" + b"".join(b"line %d\n" % i for i in range(300)) + b"last"
    for name, data in (("empty.log", b""), ("one.log", b"no newline"), ("many.log", text), ("nl.log", b"\n")):
        plain = tmp_path / name
        plain.write_bytes(data)
        with gz.open(str(plain) + ".gz", "wb") as f:
            f.write(data)
        want = data.splitlines(keepends=True)
        for path in (plain, str(plain) + ".gz"):
            for chunk in (64, 4096, 8 << 20):
                arrs = list(bl.line_batches(str(path), batch_lines=7, chunk_bytes=chunk, native=native_cut))
                got = [x for a in arrs for x in a.to_pylist()]
                assert got == want, (path, chunk)
                assert all(len(a) <= 7 for a in arrs)


# --- a channel taken over by another client id (ConsumerGroupInfo.updateChannel) --------------------------------

_CH = b"[id: 0x0a0b0c0d, L:/10.0.0.1:10911 - R:/10.0.0.7:5555]"


def _cci(cid, lut):
    return b"ClientChannelInfo [channel=" + _CH + b", clientId=" + cid + b", language=JAVA, version=409, " \
        b"lastUpdateTimestamp=" + lut + b"]"


CHANGED = [
    b"2025-01-02 03:04:00 INFO HeartbeatThread_1 - new consumer connected, group: CG CONSUME_PASSIVELY CLUSTERING "
    b"channel: " + _cci(b"10.0.0.7@A", b"1735787040000"),
    # 4.x ConsumerGroupInfo (trailing space as Java writes it)
    b"2025-01-02 03:04:30 ERROR HeartbeatThread_2 - [BUG] consumer channel exist in broker, but clientId not equal. "
    b"GROUP: CG OLD: " + _cci(b"10.0.0.7@A", b"1735787040000") + b" NEW: " + _cci(b"10.0.0.7@B", b"1735787070000")
    + b" ",
    # 5.x ConsumerGroupInfo
    b"2025-01-02 03:05:00 ERROR HeartbeatThread_1 - ConsumerGroupInfo: consumer channel exists in broker, but clientId "
    b"is not the same one, group=CG, old clientChannelInfo=" + _cci(b"10.0.0.7@B", b"1735787070000") +
    b", new clientChannelInfo=" + _cci(b"10.0.0.7@C", b"1735787100000"),
    b"2025-01-02 03:06:00 INFO NettyEventExecutor - NETTY EVENT: remove not active channel[" +
    _cci(b"10.0.0.7@C", b"1735787100000") + b"] from ConsumerGroupInfo groupChannelTable, consumer group: CG",
    # malformed: the new ClientChannelInfo is cut
    b"2025-01-02 03:06:01 ERROR HeartbeatThread_1 - ConsumerGroupInfo: consumer channel exists in broker, but clientId "
    b"is not the same one, group=CG, old clientChannelInfo=" + _cci(b"10.0.0.7@B", b"1") + b", new clientChannelInfo="
    b"ClientChannelInfo [channel=",
]


@pytest.mark.parametrize("impl", IMPLS)
def test_client_id_changed_on_a_channel(impl):
    """Java logs an error (4.x '[BUG] ... clientId not equal', 5.x 'ConsumerGroupInfo: ... not the same one') and
    gives the channel's entry to the new client id: a client_changed event with the new ClientChannelInfo."""
    batch, stats = _parse(impl)(CHANGED)
    rows = batch.to_pylist()
    assert [(r["kind"], r["group"], r["client_id"], r["addr"], r["last_update_ms"]) for r in rows] == [
        ("register", "CG", "10.0.0.7@A", "10.0.0.7:5555", 1735787040000),
        ("client_changed", "CG", "10.0.0.7@B", "10.0.0.7:5555", 1735787070000),
        ("client_changed", "CG", "10.0.0.7@C", "10.0.0.7:5555", 1735787100000),
        ("closed", "CG", "10.0.0.7@C", "10.0.0.7:5555", 1735787100000)]
    assert all(r["role"] == "consumer" and r["language"] == "JAVA" and r["version"] == 409 for r in rows)
    assert stats["counts"] == {"event_register": 1, "event_client_changed": 2, "event_closed": 1,
                               "malformed_client_changed": 1}


def test_client_id_changed_hands_the_membership_over(tmp_path):
    """The group keeps one member across the takeovers: A until 03:04:30, B until 03:05:00, C until the close."""
    log = tmp_path / "broker-x" / "broker.log"
    log.parent.mkdir()
    log.write_bytes(b"\n".join(CHANGED) + b"\n")
    f = bl.scan_local([log.parent], log_tz="UTC")
    (cg,) = [g for g in f["group_sizes"] if g["group"] == "CG"]
    assert cg["max_members"] == 1 and cg["members"] == 3
    t0 = 1735787040000
    assert [tuple(x) for x in cg["series"]] == [(t0, 1), (t0 + 120000, 0)]
    assert f["log"]["unparseable_by_kind"] == {"malformed_client_changed": 1}


UNKNOWN_CLIENT = [
    # a client-management statement in a wording the parser does not know (another version's): listed, not "other"
    b"2025-01-02 03:04:00 INFO HeartbeatThread_1 - new consumer registered, group: CG channel: ClientChannelInfo "
    b"[channel=[id: 0x01, L:/1.1.1.1:10911 - R:/2.2.2.2:3], clientId=X, language=JAVA, version=1, "
    b"lastUpdateTimestamp=1]",
    b"2025-01-02 03:04:01 WARN ClientHousekeepingScheduledThread1 - SCAN: drop expired channel[2.2.2.2:3] from "
    b"ProducerManager groupChannelTable, group: P",
    b"2025-01-02 03:04:02 INFO HeartbeatThread_1 - subscription changed (v9), group: CG topic T",
    b"2025-01-02 03:04:03 INFO HeartbeatThread_1 - registerConsumer: info changed for 2.2.2.2:3",
    b"2025-01-02 03:04:04 WARN ClientHousekeepingScheduledThread1 - SCAN: purge consumerTable, group=CG",
    # the rest of a broker's log: not client management ("other")
    b"2025-01-02 03:04:05 WARN PullMessageThread_1 - getConsumerGroupInfo failed, CID_J 127.0.0.1:46134",
    b"2025-01-02 03:04:06 WARN PullMessageThread_1 - the consumer's group info not exist, group: CID_J",
    b"2025-01-02 03:04:07 WARN ClientHousekeepingScheduledThread1 - channel close event, too many consumer groups "
    b"one channel, 9000, 2.2.2.2:3, [CG]",
]


@pytest.mark.parametrize("impl", IMPLS)
def test_client_lines_of_an_unknown_form_are_listed(impl):
    batch, stats = _parse(impl)(UNKNOWN_CLIENT)
    assert batch.num_rows == 0
    assert stats["counts"] == {"unknown_client_message": 5, "other": 3}
    assert stats["examples"] == {"unknown_client_message": UNKNOWN_CLIENT[0].decode()}


def test_unknown_client_lines_are_reported_as_unparseable(tmp_path):
    log = tmp_path / "broker-u" / "broker.log"
    log.parent.mkdir()
    log.write_bytes(b"\n".join(UNKNOWN_CLIENT + SAMPLE.read_bytes().split(b"\n")[:20]))
    f = bl.scan_local([log.parent], log_tz="+08:00")
    assert f["log"]["unparseable_by_kind"] == {"unknown_client_message": 5}
    assert f["log"]["examples"]["unknown_client_message"] == UNKNOWN_CLIENT[0].decode()


_REGISTER = (b"2025-01-02 03:04:05 INFO NettyServerCodecThread_1 - new producer connected, group: PG channel: "
             b"ClientChannelInfo [channel=[id: 0x1, L:/10.0.0.1:10911 - R:/10.0.0.2:5555], clientId=10.0.0.2@1, "
             b"language=JAVA, version=399, lastUpdateTimestamp=1735758245000]")


@pytest.mark.skipif(native is None, reason="engine.recording._brokerlog not built")
def test_utf8_check_at_every_offset_of_a_line():
    # the native check skips ASCII 8 bytes at a time: a valid or broken sequence at each offset (and so at each
    # alignment) of the line, in the group name, gives the twin's answer
    lines = []
    for seq in (b"\xc3\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe4\xb8"):
        for pad in range(0, 17):
            lines.append(_REGISTER.replace(b"group: PG", b"group: " + b"P" * pad + seq + b"G"))
            lines.append(_REGISTER + b" " * pad + seq)  # at the very end
    a, b = native.parse_lines(lines, 0), twin.parse_lines(lines, 0)
    assert a[0].equals(b[0]) and a[1] == b[1]
    assert a[1]["counts"]["invalid_utf8"] == 4 * 2 * 17 and a[0].num_rows == 3 * 2 * 17


@pytest.mark.skipif(native is None, reason="engine.recording._brokerlog not built")
def test_native_columns_outlive_the_batch():
    # the columns point into the parser's own C buffers (no copy): a column kept after the batch, the other
    # columns and the input are gone still holds its values
    import gc

    lines = pa.array([_REGISTER.replace(b"clientId=10.0.0.2@1", b"clientId=10.0.0.2@%d" % i) for i in range(1000)])
    batch, _ = native.parse_lines(lines, 7)
    clients, line = batch.column("client_id"), batch.column("line")
    del batch, lines
    gc.collect()
    [native.parse_lines([_REGISTER.replace(b"PG", b"XX")] * 1000, 0) for _ in range(3)]  # reuse freed memory
    assert clients.to_pylist() == ["10.0.0.2@%d" % i for i in range(1000)]
    assert line.to_pylist() == list(range(7, 1007))
