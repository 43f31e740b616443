"""Broker-log parsing speed, side by side on one generated 4.9.8-style log (client-management lines, plus the
injected anomalies): lines/s on one core.

    .venv/bin/python bench/bench_brokerlog.py [--lines 1000000] [--spark]

Contenders (each from the file on disk to UTC-timed events):
  native       engine._brokerlog over 10k-line Arrow batches (what each Spark task runs), read + parse + zone
  twin         engine._brokerlog_py, same path (on the first 50k lines: it is ~20x slower)
  python-re    one compiled regular expression per line kind with Python's re (the best pure-Python alternative)
With --spark (local[1], i.e. one core): read_broker_logs (mapInArrow + native parser) against the baseline users
would write, spark.read.text + regexp_extract of the same fields, each counted after a full materialisation.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from engine.bindings import brokerlog as bl

_TS = r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[,.]\d{3})? \S+ .*? - "
_CCI = r"ClientChannelInfo \[channel=.*?R:/([^\]]*)\].*?, clientId=(.*?), language=(.*?), version=(-?\d+), lastUpdateTimestamp=(\d+)\]"
PATTERNS = {
    "register_c": re.compile(_TS + r"new consumer connected, group: (\S+) (\S+) (\S+) channel: " + _CCI),
    "register_p": re.compile(_TS + r"new producer connected, group: (\S+) channel: " + _CCI),
    "sub_add": re.compile(_TS + r"subscription changed, add new topic, group: (\S+) SubscriptionData \[.*?, topic=(.*?), "
                                r"subString=(.*?), tagsSet=.*?, subVersion=(\d+), expressionType=(.*?)\]"),
    "sub_change": re.compile(_TS + r"subscription changed, group: (\S+) OLD: .*? NEW: SubscriptionData \[.*?, topic=(.*?), "
                                   r"subString=(.*?), tagsSet=.*?, subVersion=(\d+), expressionType=(.*?)\]"),
    "consumer_data": re.compile(_TS + r"registerConsumer info changed ConsumerData \[groupName=(.*?), .*\] (\S+)$"),
    "unregister": re.compile(_TS + r"unregister a (consumer|producer)\[(.*?)\] from \S+ " + _CCI),
    "group_removed": re.compile(_TS + r"(?:unregister consumer ok, no any connection, and remove consumer group, (\S+)"
                                      r"|unregister a producer group\[(.*?)\] from groupChannelTable)$"),
    "closed": re.compile(_TS + r"NETTY EVENT: remove (?:not active )?channel\[" + _CCI + r".*group: (\S+)$"),
    "expired": re.compile(_TS + r"SCAN: remove expired channel.*?(?:\[|channel=)([^\],]+).*?(?:group name: |consumerGroup=)(\S+)$"),
}
_SUBS = re.compile(r"topic=(.*?), subString=(.*?), tagsSet=.*?, expressionType=(.*?)\]")


def parse_re(path):
    """Events as tuples with Python's re (each pattern tried until one matches)."""
    out = 0
    pats = list(PATTERNS.values())
    with open(path, "r", errors="replace") as f:
        for line in f:
            for p in pats:
                m = p.match(line)
                if m:
                    out += 1
                    if p is PATTERNS["consumer_data"]:
                        sorted(set(_SUBS.findall(line)))
                    break
    return out


def run_native(path, native, limit=None):
    tz = bl.resolve_tz("+08:00")[0]
    n = 0
    for batch, stats, _ in bl.file_events("b", str(path), 0, tz, native=native):
        n += stats["lines"]
        if limit and n >= limit:
            break
    return n


def timed(fn, *a):
    t = time.perf_counter()
    n = fn(*a)
    return n, time.perf_counter() - t


def spark_side(path, lines):
    from pyspark.sql import functions as F

    from engine.bindings.spark import spark_session

    spark = spark_session("local[1]", "bench-brokerlog", conf={"spark.sql.files.maxPartitionBytes": str(1 << 30)})
    try:
        def ours():
            df = bl.read_broker_logs(spark, [path], log_tz="+08:00")
            return df.agg(F.count(F.lit(1)), F.sum(F.hash(*df.columns))).collect()[0][0]

        def baseline():
            df = spark.read.text(str(path))
            v = F.col("value")
            cols = {
                "ts": F.regexp_extract(v, r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", 1),
                "kind": F.regexp_extract(v, r" - (new consumer connected|new producer connected|subscription changed, add "
                                            r"new topic|subscription changed|registerConsumer info changed|unregister a "
                                            r"consumer|unregister a producer|unregister consumer ok|NETTY EVENT|SCAN)", 1),
                "group": F.regexp_extract(v, r"(?:group: |consumer\[|producer\[|group, |group name: |consumerGroup=|"
                                             r"groupName=)([^ \],]+)", 1),
                "client_id": F.regexp_extract(v, r"clientId=(.*?), language=", 1),
                "addr": F.regexp_extract(v, r"R:/([^\]]*)\]", 1),
                "language": F.regexp_extract(v, r"language=(.*?), version=", 1),
                "version": F.regexp_extract(v, r"version=(-?\d+), lastUpdate", 1),
                "topic": F.regexp_extract(v, r"NEW: SubscriptionData \[.*?, topic=(.*?), |SubscriptionData \[.*?, topic=(.*?), ", 1),
                "sub_string": F.regexp_extract(v, r"subString=(.*?), tagsSet=", 1),
                "sub_version": F.regexp_extract(v, r"subVersion=(\d+)", 1),
            }
            ev = df.select(*[c.alias(k) for k, c in cols.items()]).where(F.col("kind") != "")
            ev = ev.withColumn("ts_ms", F.unix_timestamp(F.to_timestamp("ts")) * 1000)
            # count() alone would let Spark skip the unused extractions: hash every column
            return ev.agg(F.count(F.lit(1)), F.sum(F.hash(*ev.columns))).collect()[0][0]
        for name, fn in (("spark: read_broker_logs (mapInArrow + native)", ours),
                         ("spark: text + regexp_extract", baseline)):
            fn()  # warm-up
            n, dt = timed(fn)
            print(f"{name:48s} {lines / dt / 1e6:6.2f} M lines/s  ({n:,} events, {dt:.2f} s)")
    finally:
        spark.stop()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=1_000_000, help="about this many lines in the generated log")
    p.add_argument("--spark", action="store_true")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-brokerlog-"))
    clients = 400
    restarts = max(1, args.lines // (clients * 10))
    t = time.perf_counter()
    m = bl.generate_broker_log(tmp / "broker-a" / "broker.log", groups=20, members=clients // 20, restarts=restarts,
                               duration_s=86400, noise=0, seed=1)
    path = tmp / "broker-a" / "broker.log"
    events = sum(v for k, v in m["counts"].items() if k.startswith("event_"))
    print(f"log: {m['lines']:,} lines ({events / m['lines']:.0%} client-management), {path.stat().st_size / 1e6:.0f} MB, "
          f"generated in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    n, dt = timed(run_native, path, True)
    print(f"{'native (read + parse + zone, 10k batches)':48s} {n / dt / 1e6:6.2f} M lines/s")
    lim = min(50_000, n)
    n2, dt = timed(run_native, path, False, lim)
    print(f"{'twin (same path)':48s} {n2 / dt / 1e6:6.2f} M lines/s")
    sub = tmp / "sub.log"
    with open(path, "rb") as f, open(sub, "wb") as g:
        for i, line in enumerate(f):
            if i >= 200_000:
                break
            g.write(line)
    k = min(200_000, n)
    _, dt = timed(parse_re, sub)
    print(f"{'python re (one pattern per kind)':48s} {k / dt / 1e6:6.2f} M lines/s")
    if args.spark:
        spark_side(path, m["lines"])


if __name__ == "__main__":
    main()
