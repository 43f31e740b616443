"""Spark binding: sessions, segment readers, the Cython decoder in Arrow UDFs, the analyses as ``df.transform``
functions, and ``rmqhb scan``.

Data frames, from raw to findings::

    records     recv_ms, conn_id, remote_addr, language, version, body        read_records (data source / mapInArrow)
    heartbeats  records + error, client_id, fingerprint, without_sub,         read_heartbeats (mapInArrow), or
                producer_groups, consumers[group, ..., subscriptions[...]]    records.transform(decode_pandas(full=True));
                (flat: consumer_groups, consumer_sub_keys instead of consumers: records.transform(decode_pandas()))
    runs        role, group, client_id, conn_id, sub_key, first_ms, last_ms, n
                one row per observation (heartbeats.transform(memberships())) or per pre-aggregated run
                (read_runs: mapInArrow straight from the segment files), then .transform(merge_runs(params))
    findings    runs.transform(inconsistent_subscriptions(...)), flapping_clients(...), heartbeat_gaps(...),
                group_sizes(...)

``scan(spark, dir, method="arrow")`` is the fast path (mapInArrow reads, decompresses, decodes with the compiled
batch decoder and pre-aggregates runs per task); ``method="pandas"`` reads raw records and decodes them with a
pandas UDF (the compiled decoder again); ``method="heartbeats"`` goes through the nested heartbeats frame;
``from_json`` and ``json_loads`` are the baselines of bench/bench_scan.py. All give the same findings, which are
defined (and computed independently) by ``engine.recording.scan_py``.

Executors must import ``engine`` (with its compiled modules) and ``engine.bindings``: install the package into
the Python that ``PYSPARK_PYTHON`` names (``spark_session`` sets it to this interpreter for local runs and
exports this checkout on ``PYTHONPATH``). On a cluster the recording directory must be readable by executors.
"""
from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Tuple

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from engine.recording.scan_py import (CLIENT_INNER_PRODUCER, FINDING_KEYS, ScanParams, connection_marks, deviating_members,
                            parse_key, separate_data_loss)

from . import segments as seg

RECORD_STRUCT = from_arrow_schema(seg.RECORD_SCHEMA)
HEARTBEAT_STRUCT = from_arrow_schema(seg.HEARTBEAT_SCHEMA)
DECODED_STRUCT = from_arrow_type(seg.DECODED_TYPE)
FLAT_DECODED_STRUCT = from_arrow_type(seg.FLAT_DECODED_TYPE)
RUN_STRUCT = from_arrow_schema(seg.RUN_SCHEMA)
_RUN_COLUMNS = [f.name for f in seg.RUN_SCHEMA]

_LOG4J2 = """\
# The Python gateway counts as a shell: Spark resets the root level to its org.apache.spark logger's (and says
# so) unless they are equal.
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


# ---------------------------------------------------------------------------------------------------------------
# session


_private: dict = {}


def private_dir() -> str:
    """This process's private directory (tempfile.mkdtemp: mode 0700, random name), removed at exit: the JVM's
    log4j2 configuration and, for local masters, Spark's local files. A fixed name in the shared temp directory could
    be planted by another user (a symbolic link, a configuration of theirs) or swapped after a check."""
    if _private.get("pid") != os.getpid():
        _private.update(pid=os.getpid(), dir=tempfile.mkdtemp(prefix="rmqhb-spark-"))
        atexit.register(_remove_private_dir, os.getpid(), _private["dir"])
    return _private["dir"]


def _remove_private_dir(pid: int, path: str) -> None:
    if os.getpid() == pid:  # not from a forked child
        shutil.rmtree(path, ignore_errors=True)


def _log4j2_file() -> str:
    path = os.path.join(private_dir(), "log4j2.properties")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2)
    return path


def prepare_environment(local: bool = True) -> None:
    """Environment a SparkSession needs before it starts (SPARK.md): worker Python = this interpreter, loopback
    address for local runs, Java 17 if none is set, and this package importable by the Python workers."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _default_java_home()
    import engine

    root = str(Path(engine.__file__).resolve().parents[1])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + parts)


_JAVA_17_HOMES = ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-17-openjdk-arm64", "/usr/lib/jvm/java-17-openjdk")
#: the Java Spark 4 runs on
JAVA_MIN_VERSION = 17


def _default_java_home() -> None:
    """JAVA_HOME = an installed Java 17 when none is set (as Spark's launcher, which uses JAVA_HOME, else PATH)."""
    if "JAVA_HOME" not in os.environ:
        for cand in _JAVA_17_HOMES:
            if Path(cand, "bin", "java").exists():
                os.environ["JAVA_HOME"] = cand
                break


class JavaUnavailable(RuntimeError):
    """Spark's JVM cannot start here: the message is one line saying why and how to point at a Java 17."""


def java_problem() -> Optional[str]:
    """Why Spark's JVM cannot start here (one line: what is wrong and how to point at a Java 17), or None. Checked
    before a session starts: without it a missing or old Java is a py4j traceback after the launcher failed."""
    import re
    import subprocess

    _default_java_home()
    home = os.environ.get("JAVA_HOME")
    fix = (f"Spark needs Java {JAVA_MIN_VERSION} or later: install one (e.g. apt-get install openjdk-17-jre-headless) "
           "and set JAVA_HOME to its directory (e.g. /usr/lib/jvm/java-17-openjdk-amd64)")
    if home:
        java = Path(home, "bin", "java")
        if not os.access(java, os.X_OK):
            return f"JAVA_HOME={home} has no bin/java; {fix}"
        java = str(java)
    else:
        java = shutil.which("java")
        if not java:
            return f"no Java found (JAVA_HOME is not set and no java on PATH); {fix}"
    try:
        run = subprocess.run([java, "-version"], capture_output=True, text=True, errors="replace", timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{java} -version failed ({type(e).__name__}); {fix}"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', run.stderr + run.stdout)
    if run.returncode != 0 or not m:
        return f"{java} -version failed (exit {run.returncode}); {fix}"
    major = int(m.group(2)) if m.group(1) == "1" and m.group(2) else int(m.group(1))  # "1.8.0" is Java 8
    if major < JAVA_MIN_VERSION:
        return f"{java} is Java {major}; {fix}"
    return None


def _local_cores(master: str) -> int:
    inside = master[len("local"):].strip("[]")
    if inside.isdigit():
        return int(inside)
    return os.cpu_count() or 1


def spark_session(master: Optional[str] = None, app_name: str = "rmqhb", *, test: bool = False,
                  driver_memory: str = "2g", conf: Optional[dict] = None) -> SparkSession:
    """The SparkSession for scans and tests: quiet logs, no UI, Arrow on, UTC; ``test=True`` adds the JVM flags
    that start faster (serial GC, C1 only). Registers the ``rmqhb`` data source. Reuses a running session."""
    master = master or os.environ.get("RMQHB_SPARK_MASTER") or "local[*]"
    local = master.startswith("local")
    prepare_environment(local)
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:  # a JVM is to start: a missing or old Java is one line, not
        problem = java_problem()                      # a py4j traceback after the launcher failed
        if problem:
            raise JavaUnavailable(problem)
    java_opts = f"-Dlog4j2.configurationFile=file:{_log4j2_file()}"
    if local:  # the JVM's own temporary files (native libraries it unpacks, ...) in the private directory too
        java_opts += f" -Djava.io.tmpdir={private_dir()}"
    if test:
        java_opts += " -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": driver_memory,
    }
    if local:
        cores = _local_cores(master)
        settings.update({
            "spark.local.dir": private_dir(),  # shuffle and block files, PySpark's temporary files: not world-readable
            "spark.sql.shuffle.partitions": str(cores),
            "spark.default.parallelism": str(cores),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        })
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    if _cli.get("interrupt"):
        spark = _keeping_our_interrupt(builder.getOrCreate)
    else:
        spark = builder.getOrCreate()
    register_data_source(spark)
    return spark


def _keeping_our_interrupt(fn):
    """fn() while SparkContext's constructor cannot replace our SIGINT handler with its own (cancelAllJobs over
    py4j, then KeyboardInterrupt): a Ctrl-C while the session starts is ours too."""
    import signal

    real = signal.signal

    def keep(sig, handler):
        return signal.getsignal(sig) if sig == signal.SIGINT else real(sig, handler)

    signal.signal = keep
    try:
        return fn()
    finally:
        signal.signal = real


_cli: dict = {}


def _interrupt(signum, frame) -> None:
    """Ctrl-C in `rmqhb scan`. Before and after the Spark session: KeyboardInterrupt (the report's files are
    removed on the way out, the CLI prints one line; a JVM being launched reads EOF when we exit, and ends). While
    it runs: one line, the local JVM (started ignoring SIGINT) killed, its Python workers end with it, the private
    directory removed, exit 130 at once. Unwinding instead calls into a JVM being torn down: 126-139 lines of py4j
    and Java stacks and seconds of wait."""
    from pyspark import SparkContext

    if SparkContext._gateway is None:  # the JVM being launched (spark-submit, then java): not ours to wait for
        _kill_children()
    if SparkContext._gateway is None or SparkContext._active_spark_context is None:
        raise KeyboardInterrupt
    os.write(2, (b"\n" if os.isatty(2) else b"") + b"rmqhb scan: interrupted\n")
    proc = getattr(SparkContext._gateway, "proc", None)  # ended first: it would write on into the private directory
    if proc is not None:
        try:
            proc.kill()
            proc.wait(2)
        except Exception:
            pass
    if _private.get("pid") == os.getpid():
        shutil.rmtree(_private["dir"], ignore_errors=True)
    os._exit(130)


def _kill_children() -> None:
    """SIGKILL this process's child processes (Linux /proc; elsewhere a launched JVM ends at EOF on its stdin)."""
    me = str(os.getpid())
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            if stat[stat.rindex(")") + 2:].split()[1] == me:  # field 4, after "pid (comm) state"
                os.kill(int(pid), 9)
        except (OSError, ValueError, IndexError):
            pass


def _catch_interrupt() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)


# ---------------------------------------------------------------------------------------------------------------
# Python data source: spark.read.format("rmqhb").load(DIR)

try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # Spark < 4: read_records falls back to mapInArrow
    DataSource = None

if DataSource is not None:

    class SegmentPartition(InputPartition):
        def __init__(self, split):
            super().__init__(split.index if split is not None else -1)
            self.split = split

    class SegmentDataSource(DataSource):
        """``spark.read.format("rmqhb").load(DIR)``: the records of a recording, one partition per split.
        Options: ``decode`` ("true": heartbeat columns instead of the raw body), ``splitRecords``, ``dedupe``."""

        @classmethod
        def name(cls):
            return "rmqhb"

        def schema(self):
            decode = {k.lower(): v for k, v in self.options.items()}.get("decode")
            return HEARTBEAT_STRUCT if _truthy(decode) else RECORD_STRUCT

        def reader(self, schema):
            return SegmentReader(dict(self.options))

    class SegmentReader(DataSourceReader):
        def __init__(self, options):
            path = options.get("path")
            if not path:
                raise ValueError("load(DIR) needs the recording directory")
            opts = {k.lower(): v for k, v in options.items()}  # Spark hands option names over lower-cased
            self.decode = _truthy(opts.get("decode"))
            self.dedupe = str(opts.get("dedupe", "true")).lower() != "false"
            self.splits = seg.plan_splits(path, int(opts.get("splitrecords", seg.DEFAULT_SPLIT_RECORDS))).splits

        def partitions(self):
            return [SegmentPartition(s) for s in self.splits] or [SegmentPartition(None)]

        def read(self, partition):
            if partition.split is None:
                return iter(())
            if self.decode:
                return seg.heartbeat_batches(partition.split, dedupe_bodies=self.dedupe)
            return seg.record_batches(partition.split)


def _truthy(v) -> bool:
    return str(v).lower() in ("1", "true", "yes")


def register_data_source(spark: SparkSession) -> bool:
    if DataSource is None:
        return False
    spark.dataSource.register(SegmentDataSource)
    return True


# ---------------------------------------------------------------------------------------------------------------
# readers (mapInArrow over a frame of split numbers: one task per split, one or more splits per segment)


def _run_splits(fn, splits, batches):
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from fn(splits[i])


def _over_splits(spark: SparkSession, plan: seg.Plan, fn, schema) -> DataFrame:
    n = len(plan.splits)
    ids = spark.range(0, n, 1, numPartitions=max(1, n))
    return ids.mapInArrow(functools.partial(_run_splits, fn, plan.splits), schema)


def read_records(spark: SparkSession, directory, *, via: str = "datasource", split_records: int = seg.DEFAULT_SPLIT_RECORDS,
                 plan: Optional[seg.Plan] = None) -> DataFrame:
    """The raw records of a recording (recv_ms, conn_id, remote_addr, language, version, body)."""
    if via == "datasource" and DataSource is not None:
        return spark.read.format("rmqhb").option("splitRecords", split_records).load(str(directory))
    plan = plan or seg.plan_splits(directory, split_records)
    return _over_splits(spark, plan, seg.record_batches, RECORD_STRUCT)


def read_heartbeats(spark: SparkSession, directory, *, split_records: int = seg.DEFAULT_SPLIT_RECORDS,
                    dedupe: bool = True, plan: Optional[seg.Plan] = None) -> DataFrame:
    """Records with their decoded heartbeats (mapInArrow: decompress and decode with the batch decoder)."""
    plan = plan or seg.plan_splits(directory, split_records)
    fn = functools.partial(seg.heartbeat_batches, dedupe_bodies=dedupe)
    return _over_splits(spark, plan, fn, HEARTBEAT_STRUCT)


def _run_split_ranges(fn, ranges, batches):
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from fn(ranges[i])


def read_runs(spark: SparkSession, directory, params: ScanParams = ScanParams(), *, split_records: int = seg.DEFAULT_SPLIT_RECORDS,
              dedupe: bool = True, on_corrupt: str = "skip", plan: Optional[seg.Plan] = None,
              tasks: Optional[int] = None) -> DataFrame:
    """The scan's pre-aggregated runs, straight from the segment files (mapInArrow). Each task takes a range
    of consecutive splits (default: 4 tasks per core) and merges their runs before emitting them; a
    STATS_ROLE row per task carries its bad bodies (n) and time range."""
    plan = plan or seg.plan_splits(directory, split_records)
    n = len(plan.splits)
    tasks = max(1, min(n, tasks or 4 * spark.sparkContext.defaultParallelism))
    bounds = [round(i * n / tasks) for i in range(tasks + 1)]
    ranges = [plan.splits[a:b] for a, b in zip(bounds, bounds[1:])]
    fn = functools.partial(seg.splits_runs, params=params, dedupe_bodies=dedupe, on_corrupt=on_corrupt)
    ids = spark.range(0, len(ranges), 1, numPartitions=len(ranges))
    return ids.mapInArrow(functools.partial(_run_split_ranges, fn, ranges), RUN_STRUCT)


# ---------------------------------------------------------------------------------------------------------------
# decoders over a records frame


def _pandas_decode(dedupe: bool, full: bool, body):
    values = [bytes(b) for b in body]
    if not full:
        return seg.flat_decoded_frame(values, dedupe)
    arr = seg.decode_bodies(values, dedupe)
    return pa.Table.from_arrays(arr.flatten(), names=[f.name for f in seg.DECODED_TYPE]).to_pandas()


@functools.lru_cache(maxsize=None)
def _decode_udf(dedupe: bool, full: bool):
    from pyspark.sql.functions import pandas_udf

    return pandas_udf(functools.partial(_pandas_decode, dedupe, full),
                      returnType=DECODED_STRUCT if full else FLAT_DECODED_STRUCT)


def decode_pandas(dedupe: bool = True, full: bool = False):
    """records -> heartbeats, decoding ``body`` with the compiled batch decoder in a pandas UDF.

    By default the flat columns the analyses need (error, client_id, fingerprint, without_sub, producer_groups,
    consumer_groups, consumer_sub_keys); ``full=True`` gives the nested consumers column of read_heartbeats,
    several times slower because pyspark converts nested pandas values element by element."""

    def transform(df: DataFrame) -> DataFrame:
        keep = [c for c in df.columns if c != "body"]
        return df.withColumn("_hb", _decode_udf(dedupe, full)(F.col("body"))).select(*keep, "_hb.*")

    return transform


#: The JSON fields the analyses need, for the from_json and json.loads baselines.
_SLIM_JSON = (
    "struct<clientID:string,withoutSub:boolean,isWithoutSub:boolean,producerDataSet:array<struct<groupName:string>>,"
    "consumerDataSet:array<struct<groupName:string,subscriptionDataSet:array<struct<topic:string,subString:string,"
    "expressionType:string>>>>>"
)


def decode_from_json():
    """records -> heartbeats (only the fields the analyses use) with Spark's own from_json: the baseline."""

    def transform(df: DataFrame) -> DataFrame:
        j = F.from_json(F.col("body").cast("string"), _SLIM_JSON)
        d = df.withColumn("_j", j)
        subs = lambda c: F.transform(  # noqa: E731
            c["subscriptionDataSet"],
            lambda s: F.struct(s["topic"].alias("topic"), s["subString"].alias("sub_string"),
                               s["expressionType"].alias("expression_type")),
        )
        return d.select(
            "recv_ms", "conn_id",
            F.when(F.col("_j").isNull(), F.lit("malformed JSON")).alias("error"),
            F.col("_j.clientID").alias("client_id"),
            F.coalesce(F.col("_j.withoutSub"), F.col("_j.isWithoutSub"), F.lit(False)).alias("without_sub"),
            F.transform(F.coalesce(F.col("_j.producerDataSet"), F.array()), lambda p: p["groupName"]).alias("producer_groups"),
            F.transform(F.coalesce(F.col("_j.consumerDataSet"), F.array()),
                        lambda c: F.struct(c["groupName"].alias("group"), subs(c).alias("subscriptions"))).alias("consumers"),
        )

    return transform


def _json_loads_rows(body):
    import pandas as pd

    out = {"error": [], "client_id": [], "without_sub": [], "producer_groups": [], "consumers": []}
    for b in body:
        try:
            d = json.loads(bytes(b))
            out["error"].append(None)
        except ValueError as e:
            out["error"].append(str(e)[:80])
            d = {}
        d = d if isinstance(d, dict) else {}
        out["client_id"].append(d.get("clientID"))
        out["without_sub"].append(bool(d.get("withoutSub", d.get("isWithoutSub", False))))
        out["producer_groups"].append([p.get("groupName") for p in d.get("producerDataSet") or []])
        out["consumers"].append([
            {"group": c.get("groupName"),
             "subscriptions": [{"topic": s.get("topic"), "sub_string": s.get("subString"),
                                "expression_type": s.get("expressionType")} for s in c.get("subscriptionDataSet") or []]}
            for c in d.get("consumerDataSet") or []
        ])
    return pd.DataFrame(out)


_SLIM_DECODED = (
    "struct<error:string,client_id:string,without_sub:boolean,producer_groups:array<string>,"
    "consumers:array<struct<group:string,subscriptions:array<struct<topic:string,sub_string:string,expression_type:string>>>>>"
)


@functools.lru_cache(maxsize=None)
def _json_loads_udf():
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import _parse_datatype_string

    return pandas_udf(_json_loads_rows, returnType=_parse_datatype_string(_SLIM_DECODED))


def decode_json_loads():
    """records -> heartbeats (analysis fields) with json.loads in a pandas UDF: the plain-Python baseline."""

    def transform(df: DataFrame) -> DataFrame:
        return df.withColumn("_hb", _json_loads_udf()(F.col("body"))).select("recv_ms", "conn_id", "_hb.*")

    return transform


# ---------------------------------------------------------------------------------------------------------------
# transforms


def memberships():
    """heartbeats -> runs of one observation each: the client, each producer group, each consumer group with
    its subscription set (null for a V2 light heartbeat). A body that failed to decode (or has no clientID)
    becomes a STATS_ROLE row, counted in the summary."""

    def transform(df: DataFrame) -> DataFrame:
        ok = F.col("client_id").isNotNull()
        if "error" in df.columns:
            ok = ok & F.col("error").isNull()
        no_key = F.lit(None).cast("string")
        ob = lambda role, group, key: F.struct(  # noqa: E731
            F.lit(role).alias("role"), F.coalesce(group, F.lit("")).alias("group"), key.alias("sub_key"))
        triples = lambda c: F.array_sort(F.array_distinct(F.transform(  # noqa: E731
            c["subscriptions"],
            lambda s: F.array(F.coalesce(s["topic"], F.lit("")), F.coalesce(s["expression_type"], F.lit("TAG")),
                              F.coalesce(s["sub_string"], F.lit(""))))))
        light = F.coalesce(F.col("without_sub"), F.lit(False))
        if "consumers" in df.columns:
            consumers = F.transform(
                F.coalesce(F.col("consumers"), F.array().cast(df.schema["consumers"].dataType)),
                lambda c: ob("consumer", c["group"], F.when(light, no_key).otherwise(F.to_json(triples(c)))))
        else:  # the flat form of decode_pandas(): keys already computed
            consumers = F.transform(
                F.arrays_zip(F.col("consumer_groups"), F.col("consumer_sub_keys")),
                lambda c: ob("consumer", c["consumer_groups"], c["consumer_sub_keys"]))
        # one pass over the heartbeats (each union branch would re-run the read and the decoder)
        observations = F.when(~ok, F.array(ob(seg.STATS_ROLE, F.lit(""), no_key))).otherwise(F.concat(
            F.array(ob("client", F.lit(""), no_key)),
            F.transform(F.coalesce(F.col("producer_groups"), F.array().cast("array<string>")),
                        lambda g: ob("producer", g, no_key)),
            consumers,
        ))
        return df.select("client_id", "conn_id", "recv_ms", F.explode(observations).alias("o")).select(
            F.col("o.role").alias("role"), F.col("o.group").alias("group"),
            F.when(F.col("o.role") == seg.STATS_ROLE, F.lit("")).otherwise(F.col("client_id")).alias("client_id"),
            F.when(F.col("o.role") == seg.STATS_ROLE, F.lit(0).cast("long")).otherwise(F.col("conn_id")).alias("conn_id"),
            F.col("o.sub_key").alias("sub_key"), F.col("recv_ms").alias("first_ms"), F.col("recv_ms").alias("last_ms"),
            F.lit(1).cast("long").alias("n"))

    return transform


def _member_window():
    return Window.partitionBy("role", "group", "client_id").orderBy(
        F.col("first_ms"), F.col("conn_id"), F.col("sub_key").asc_nulls_first())


def merge_runs(params: ScanParams = ScanParams(), unregisters: Optional[DataFrame] = None,
               conn_ends: Optional[DataFrame] = None):
    """runs -> maximal runs. Observations of a (role, group, client) in (time, connection, set) order: a light
    heartbeat takes the previous set; a run ends at another connection, another set, or a silence over
    min(expiry, gap threshold). Works on single observations and on pre-aggregated runs alike. Statistics rows
    are summed into one. ``unregisters`` (a capture's, the second frame of :func:`capture_cuts`): a run also ends
    at an UNREGISTER_CLIENT of that member (one at or after its last heartbeat, before the next one's first), so
    the member is out from the unregister until its next heartbeat, as in engine.recording.scan_py.member_left;
    ``conn_ends`` (capture_cuts' first frame): and at its connection's first FIN / RST (heartbeats after it on a
    half-closed connection start a new run), so a run's connection end is never between two of its heartbeats."""
    split = params.split_ms

    def transform(df: DataFrame) -> DataFrame:
        cols = df.columns
        if unregisters is not None:
            u = unregisters.groupBy("client_id", "role", "group").agg(F.collect_list("cut_ms").alias("_cuts"))
            df = df.join(F.broadcast(u), ["client_id", "role", "group"], "left").select(*cols, "_cuts")
        if conn_ends is not None:
            df = df.join(F.broadcast(conn_ends.select("conn_id", F.col("cut_ms").alias("_end"))), "conn_id", "left")
        w = _member_window()
        upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        df = df.withColumn("_key", F.last("sub_key", ignorenulls=True).over(upto))
        prev_conn = F.lag("conn_id").over(w)
        prev_last = F.lag("last_ms").over(w)
        new = (prev_conn.isNull() | (F.col("conn_id") != prev_conn)
               | ~F.col("_key").eqNullSafe(F.lag("_key").over(w))
               | ((F.col("first_ms") - prev_last) > split))
        if unregisters is not None:
            df = df.withColumn("_pl", prev_last).withColumn("_cut", F.coalesce(F.exists(
                "_cuts", lambda t: (t >= F.col("_pl")) & (t < F.col("first_ms"))), F.lit(False)))
            new = new | F.col("_cut")
        if conn_ends is not None:  # the same connection (another one starts a run anyway)
            new = new | F.coalesce((F.col("_end") >= prev_last) & (F.col("_end") < F.col("first_ms")), F.lit(False))
        is_stats = F.col("role") == seg.STATS_ROLE
        # statistics rows all fall into run 0 of their own partition: summed in the same pass (a separate
        # branch would run the input, e.g. the segment scan, twice)
        df = df.withColumn("_run", F.when(is_stats, F.lit(0)).otherwise(F.sum(new.cast("int")).over(upto)))
        return df.groupBy("role", "group", "client_id", "_run").agg(
            F.min("conn_id").alias("conn_id"), F.min("_key").alias("sub_key"), F.min("first_ms").alias("first_ms"),
            F.max("last_ms").alias("last_ms"), F.sum("n").alias("n"),
        ).select(*_RUN_COLUMNS)

    return transform


def live_intervals(params: ScanParams = ScanParams(), cuts=None):
    """merged runs -> + end_ms: a member is live from its run's first heartbeat until the next run of the same
    member starts or ``expiry`` after the run's last heartbeat, whichever is first. Empty intervals dropped.
    ``cuts`` (a capture's, see :func:`capture_cuts`): also until its connection's first FIN / RST or its client's
    UNREGISTER_CLIENT for that group, the first at or after the run's last heartbeat (engine.recording.scan_py.member_left)."""
    expiry = params.expiry_ms

    def transform(df: DataFrame) -> DataFrame:
        lapse = F.col("last_ms") + expiry
        end = F.least(lapse, F.coalesce(F.lead("first_ms").over(_member_window()), lapse))
        df = df.withColumn("end_ms", end)
        if cuts is not None:
            conn_ends, unregs = cuts
            cols = df.columns
            df = df.join(F.broadcast(conn_ends.select("conn_id", F.col("cut_ms").alias("_ce"))), "conn_id", "left") \
                .withColumn("_ce", F.when(F.col("_ce") >= F.col("last_ms"), F.col("_ce"))).select(*cols, "_ce")
            u = F.broadcast(unregs.select(F.col("client_id").alias("_uc"), F.col("role").alias("_ur"),
                                          F.col("group").alias("_ug"), F.col("cut_ms").alias("_u")))
            df = df.join(u, (F.col("client_id") == F.col("_uc")) & (F.col("role") == F.col("_ur"))
                         & (F.col("group") == F.col("_ug")) & (F.col("_u") >= F.col("last_ms")), "left") \
                .groupBy(*cols, "_ce").agg(F.min("_u").alias("_u")) \
                .withColumn("end_ms", F.least("end_ms", "_ce", "_u")).select(*cols)
        return df.where(F.col("end_ms") > F.col("first_ms"))

    return transform


def capture_cuts(spark: SparkSession, conn_events: dict, unregisters: dict):
    """(conn_id, cut_ms) of the connections' first FIN / RST and (client_id, role, group, cut_ms) of the
    UNREGISTER_CLIENT requests of a capture (bindings.pcap.connection_events / unregister_times), as small frames
    for live_intervals; None when the capture saw neither."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    ends = [(int(c), int(e["end"][0])) for c, e in conn_events.items() if e.get("end") is not None]
    unregs = [(c, r, g, int(t)) for (c, r, g), ts in unregisters.items() for t in ts]
    if not ends and not unregs:
        return None
    return (spark.createDataFrame(ends, StructType([StructField("conn_id", LongType()),
                                                    StructField("cut_ms", LongType())])),
            spark.createDataFrame(unregs, StructType([StructField("client_id", StringType()),
                                                      StructField("role", StringType()),
                                                      StructField("group", StringType()),
                                                      StructField("cut_ms", LongType())])))


def client_groups():
    """merged runs -> client_id, groups (its consumer and producer groups, without CLIENT_INNER_PRODUCER)."""

    def transform(df: DataFrame) -> DataFrame:
        member = df.where(F.col("role").isin("consumer", "producer")
                          & ~((F.col("role") == "producer") & (F.col("group") == CLIENT_INNER_PRODUCER)))
        return member.groupBy("client_id").agg(F.array_sort(F.collect_set("group")).alias("groups"))

    return transform


def _with_groups(df: DataFrame, runs: DataFrame) -> DataFrame:
    groups = runs.transform(client_groups())
    return df.join(groups, "client_id", "left").withColumn(
        "groups", F.coalesce(F.col("groups"), F.array().cast("array<string>")))


def _client_steps(runs: DataFrame) -> DataFrame:
    w = Window.partitionBy("client_id").orderBy("first_ms", "conn_id")
    return runs.where(F.col("role") == "client").select(
        "client_id", "conn_id", "first_ms", "last_ms",
        F.lag("conn_id").over(w).alias("prev_conn"), F.lag("last_ms").over(w).alias("prev_last"))


def heartbeat_gaps(params: ScanParams = ScanParams()):
    """merged runs -> client_id, groups, start_ms, end_ms, gap_s: silences over the gap threshold."""

    def transform(runs: DataFrame) -> DataFrame:
        steps = _client_steps(runs)
        gaps = steps.where((F.col("first_ms") - F.col("prev_last")) > params.gap_ms).select(
            "client_id", F.col("prev_last").alias("start_ms"), F.col("first_ms").alias("end_ms"),
            ((F.col("first_ms") - F.col("prev_last")) / 1000.0).alias("gap_s"))
        return _with_groups(gaps, runs)

    return transform


def expired_clients(params: ScanParams = ScanParams(), last_ms: Optional[int] = None):
    """merged runs -> client_id, conn_id, groups, connected_ms, last_heartbeat_ms, expired_ms, returned_ms: a
    client's silences over ``expiry`` (any connection), and its last heartbeat when the recording goes on at
    least ``expiry`` after it (``last_ms``: the recording's last receive time); see engine.recording.scan_py. The
    connection is the one of the last heartbeat before the silence (the later connection on a tie)."""
    expiry = params.expiry_ms

    def transform(runs: DataFrame) -> DataFrame:
        c = runs.where(F.col("role") == "client").select("client_id", "conn_id", "first_ms", "last_ms")
        w = Window.partitionBy("client_id").orderBy("first_ms", "conn_id")
        # the latest heartbeat before this run (runs of concurrent connections may overlap)
        prev = F.max(F.struct(F.col("last_ms").alias("t"), F.col("conn_id").alias("c"))).over(
            w.rowsBetween(Window.unboundedPreceding, -1))
        mid = c.withColumn("p", prev).where(F.col("p").isNotNull() & ((F.col("first_ms") - F.col("p.t")) > expiry)) \
            .select("client_id", F.col("p.c").alias("conn_id"), F.col("p.t").alias("last_heartbeat_ms"),
                    F.col("first_ms").alias("returned_ms"))
        last = c.groupBy("client_id").agg(F.max(F.struct(F.col("last_ms").alias("t"), F.col("conn_id").alias("c")))
                                          .alias("p"))
        end = F.lit(last_ms).cast("long") if last_ms is not None else F.lit(None).cast("long")
        tail = last.where((F.col("p.t") + expiry) <= end).select(
            "client_id", F.col("p.c").alias("conn_id"), F.col("p.t").alias("last_heartbeat_ms"),
            F.lit(None).cast("long").alias("returned_ms"))
        connected = c.groupBy("client_id", "conn_id").agg(F.min("first_ms").alias("connected_ms"))
        rows = mid.unionByName(tail).join(connected, ["client_id", "conn_id"], "left")
        return _with_groups(rows.withColumn("expired_ms", F.col("last_heartbeat_ms") + expiry), runs)

    return transform


def expired_records(runs: DataFrame, params: ScanParams, last_ms: Optional[int], addresses=None) -> list:
    """The expired_clients finding (engine.recording.scan_py's rows) from merged runs: ``last_ms`` = the input's last
    receive time; ``addresses`` = {conn_id: address}, or a function of the rows giving it (default: none)."""
    rows = _rows(runs.transform(expired_clients(params, last_ms)))
    addrs = addresses(rows) if callable(addresses) else (addresses or {})
    return _expired_records(rows, addrs, params.expiry_ms)


def _expired_records(rows, addrs: dict, expiry_ms: int) -> list:
    from engine.recording.scan_py import expired_row

    out = [expired_row(r["client_id"], r["conn_id"], addrs.get(r["conn_id"]), r["groups"], r["connected_ms"],
                       r["last_heartbeat_ms"], r["returned_ms"], expiry_ms) for r in rows]
    return sorted(out, key=lambda r: (r["expired_ms"], r["client_id"], r["conn_id"]))


def connection_addresses(plan: seg.Plan, wanted) -> dict:
    """{conn_id: remote address} for (conn_id, receive time) pairs, read on the driver from the few blocks whose
    time range holds one of the times (the runs do not carry addresses; expiries are few)."""
    from engine.recording.recorder import iter_blocks

    wanted = {(int(c), int(t)) for c, t in wanted}
    times = sorted({t for _, t in wanted})
    out: dict = {}
    if not times:
        return out
    import bisect

    for split in plan.splits:
        blocks = [b for b in split.blocks if bisect.bisect_left(times, b.first_ms) < len(times)
                  and times[bisect.bisect_left(times, b.first_ms)] <= b.last_ms]
        if not blocks:
            continue
        for block in iter_blocks(split.path, blocks=blocks, on_corrupt="skip"):
            for r in block.records():
                if (r.conn_id, r.recv_ms) in wanted:
                    out.setdefault(r.conn_id, r.remote_addr)
    return out


def member_address_records(runs: DataFrame, plan, wanted, params: ScanParams, conn_events: Optional[dict] = None,
                           unregisters: Optional[dict] = None) -> list:
    """engine.recording.scan_py's ``member_addresses`` from merged runs: the connections of the runs of each deviating member
    ((group, client, start_ms, end_ms) of scan_py.deviating_members) live during its span (a run's observations are
    at most min(expiry, gap threshold) apart, so ``first < end and last + expiry > start`` holds exactly when one
    of its observations is live then), their addresses read on the driver (``plan``: a recording's seg.Plan,
    read with connection_addresses) or given (``plan``: {conn_id: address}, a capture's). A capture's
    ``conn_events`` and ``unregisters`` end a run's address at the member's leaving, as scan_py.address_live_until
    does for each observation: a capture's merged runs are cut at the member's unregisters and at their
    connection's first FIN / RST (merge_runs), so every observation of a run leaves when its last does
    (scan_py.member_left at ``last``), and the run counts while ``first < end and min(last + expiry, left) >
    max(start, first)``."""
    from engine.recording.scan_py import address_live_until

    wanted = list(wanted)
    if not wanted:
        return []
    spans: dict = defaultdict(list)
    for group, client, start, end in wanted:
        spans[(group, client)].append((start, end))
    rows = runs.where((F.col("role") == "consumer") & F.col("group").isin(sorted({w[0] for w in wanted}))
                      & F.col("client_id").isin(sorted({w[1] for w in wanted}))).select(
        "group", "client_id", "conn_id", "first_ms", "last_ms").collect()
    conns: dict = defaultdict(dict)
    for r in rows:
        key = (r["group"], r["client_id"])
        until = address_live_until(conn_events, unregisters, r["client_id"], r["group"], r["conn_id"], r["last_ms"],
                                   params)
        if any(r["first_ms"] < end and until > max(start, r["first_ms"]) for start, end in spans.get(key, ())):
            conns[key].setdefault(r["conn_id"], r["first_ms"])
    addrs = plan if isinstance(plan, dict) else connection_addresses(
        plan, [(c, t) for d in conns.values() for c, t in d.items()])
    return [{"group": g, "client_id": c, "addrs": sorted({addrs[x] for x in d if addrs.get(x)})}
            for (g, c), d in sorted(conns.items())]


def reconnects():
    """merged runs -> client_id, reconnect_ms: every heartbeat on another connection than the client's previous."""

    def transform(runs: DataFrame) -> DataFrame:
        steps = _client_steps(runs)
        return steps.where(F.col("prev_conn").isNotNull() & (F.col("conn_id") != F.col("prev_conn"))).select(
            "client_id", F.col("first_ms").alias("reconnect_ms"))

    return transform


def flapping_clients(params: ScanParams = ScanParams()):
    """merged runs -> clients with flap_min_reconnects or more reconnects in some flap_window (epoch-aligned):
    client_id, groups, reconnects, max_reconnects_per_window, first/last_reconnect_ms, windows, reconnect_ms."""
    w_ms, need = params.window_ms, params.flap_min_reconnects

    def transform(runs: DataFrame) -> DataFrame:
        per_client = runs.transform(reconnects()).groupBy("client_id").agg(
            F.count("*").alias("reconnects"), F.min("reconnect_ms").alias("first_reconnect_ms"),
            F.max("reconnect_ms").alias("last_reconnect_ms"), F.array_sort(F.collect_list("reconnect_ms")).alias("reconnect_ms"))
        start = lambda t: t - F.pmod(t, F.lit(w_ms))  # noqa: E731
        counted = F.transform(F.array_distinct(F.transform("reconnect_ms", start)),
                              lambda ws: F.array(ws, F.size(F.filter("reconnect_ms", lambda t: start(t) == ws)).cast("long")))
        flagged = per_client.withColumn("windows", F.filter(counted, lambda x: x[1] >= need)).where(F.size("windows") > 0)
        flagged = flagged.withColumn("max_reconnects_per_window", F.array_max(F.transform("windows", lambda x: x[1])))
        return _with_groups(flagged, runs)

    return transform


def _by_group(iv: DataFrame) -> DataFrame:
    """Partition member intervals by (role, group) once; every later key includes both, so no more shuffles."""
    return iv.repartition("role", "group")


def _events(iv: DataFrame, *keys) -> DataFrame:
    """+1 at each interval's start, -1 at its end (one pass, keeps the partitioning)."""
    ev = F.explode(F.array(F.struct(F.col("first_ms").alias("t"), F.lit(1).alias("d")),
                           F.struct(F.col("end_ms").alias("t"), F.lit(-1).alias("d"))))
    return iv.select(*keys, ev.alias("e")).select(*keys, "e.t", "e.d")


def group_sizes(params: ScanParams = ScanParams(), cuts=None):
    """merged runs -> group, role, ms, members: the number of live members from ms on, at every change
    (``cuts``: a capture's closes and unregisters, see live_intervals)."""

    def transform(runs: DataFrame) -> DataFrame:
        iv = _by_group(runs.where(F.col("role").isin("consumer", "producer"))
                       .transform(live_intervals(params, cuts)))
        ev = _events(iv, "role", "group").groupBy("role", "group", "t").agg(F.sum("d").alias("d")).where(F.col("d") != 0)
        w = Window.partitionBy("role", "group").orderBy("t").rowsBetween(Window.unboundedPreceding, Window.currentRow)
        return ev.select("group", "role", F.col("t").alias("ms"), F.sum("d").over(w).alias("members"))

    return transform


def inconsistent_subscriptions(params: ScanParams = ScanParams(), cuts=None):
    """merged runs -> group, start_ms, end_ms, duration_s, variants[sub_key, clients]: the spans during which live
    members of a consumer group hold two or more subscription sets (RocketMQ's consumerStatus rule, subVersion
    ignored), at least ``min_duration`` long (``cuts``: a capture's closes and unregisters, see live_intervals)."""

    def transform(runs: DataFrame) -> DataFrame:
        iv = _by_group(runs.where((F.col("role") == "consumer") & F.col("sub_key").isNotNull())
                       .transform(live_intervals(params, cuts)))
        ev = _events(iv, "role", "group", "sub_key").groupBy("role", "group", "sub_key", "t").agg(F.sum("d").alias("d"))
        wk = Window.partitionBy("role", "group", "sub_key").orderBy("t").rowsBetween(Window.unboundedPreceding,
                                                                                   Window.currentRow)
        ev = ev.withColumn("cnt", F.sum("d").over(wk))
        # +1 when a set gains its first live holder, -1 when it loses its last
        kd = (F.col("cnt") > 0).cast("int") - ((F.col("cnt") - F.col("d")) > 0).cast("int")
        kev = ev.withColumn("kd", kd).where(F.col("kd") != 0).groupBy("role", "group", "t").agg(F.sum("kd").alias("kd")) \
            .where(F.col("kd") != 0)
        wg = Window.partitionBy("role", "group").orderBy("t")
        nk = kev.withColumn("nk", F.sum("kd").over(wg.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        nk = nk.withColumn("prev", F.coalesce(F.lag("nk").over(wg), F.lit(0)))
        trans = nk.where((F.col("nk") >= 2) != (F.col("prev") >= 2))
        spans = trans.withColumn("span_end", F.lead("t").over(wg)).where(F.col("nk") >= 2).select(
            "role", "group", F.col("t").alias("span_start"), "span_end")
        spans = spans.where((F.col("span_end") - F.col("span_start")) >= params.min_duration_ms)
        held = iv.join(spans, ["role", "group"]).where(
            (F.col("first_ms") < F.col("span_end")) & (F.col("end_ms") > F.col("span_start")))
        variants = held.groupBy("role", "group", "span_start", "span_end", "sub_key").agg(
            F.array_sort(F.collect_set("client_id")).alias("clients"))
        return variants.groupBy("role", "group", "span_start", "span_end").agg(
            F.collect_list(F.struct("sub_key", "clients")).alias("variants"),
        ).select("group", F.col("span_start").alias("start_ms"), F.col("span_end").alias("end_ms"), "variants",
                 ((F.col("span_end") - F.col("span_start")) / 1000.0).alias("duration_s"))

    return transform


# ---------------------------------------------------------------------------------------------------------------
# the scan


def runs_for(spark: SparkSession, directory, method: str = "arrow", params: ScanParams = ScanParams(), *,
             split_records: int = seg.DEFAULT_SPLIT_RECORDS, dedupe: bool = True, on_corrupt: str = "skip",
             plan: Optional[seg.Plan] = None):
    """(unmerged runs, stats frame or None) for a method: arrow | heartbeats | pandas | from_json | json_loads."""
    plan = plan or seg.plan_splits(directory, split_records)
    if method == "arrow":
        runs = read_runs(spark, directory, params, dedupe=dedupe, on_corrupt=on_corrupt, plan=plan)
        return runs, None
    if method == "heartbeats":
        hb = read_heartbeats(spark, directory, dedupe=dedupe, plan=plan)
    else:
        # the mapInArrow reader: a Python data source feeding a Python UDF measured several times slower
        records = read_records(spark, directory, via="arrow", split_records=split_records, plan=plan)
        decoder = {"pandas": decode_pandas(dedupe), "from_json": decode_from_json(),
                   "json_loads": decode_json_loads()}.get(method)
        if decoder is None:
            raise ValueError(f"unknown method {method!r}")
        hb = records.transform(decoder)
    return hb.transform(memberships()), hb


#: Merged-run rows per shuffle partition in the analyses phase of scan().
ANALYSIS_ROWS_PER_PARTITION = 250_000


def _stats(merged: DataFrame) -> dict:
    """Record count, bad bodies, time range and clients, from merged runs (client runs count the good records)."""
    stats = F.col("role") == seg.STATS_ROLE
    counted = stats | (F.col("role") == "client")
    s = merged.agg(
        F.sum(F.when(counted, F.col("n")).otherwise(0)).alias("records"),
        F.sum(F.when(stats, F.col("n")).otherwise(0)).alias("bad"),
        F.min(F.when(counted, F.col("first_ms"))).alias("lo"), F.max(F.when(counted, F.col("last_ms"))).alias("hi"),
        F.countDistinct(F.when(F.col("role") == "client", F.col("client_id"))).alias("clients"),
        F.count(F.lit(1)).alias("rows")).collect()[0]
    return {"records": int(s["records"] or 0), "bad_bodies": int(s["bad"] or 0), "clients": int(s["clients"]),
            "first_ms": None if s["lo"] is None else int(s["lo"]), "last_ms": None if s["hi"] is None else int(s["hi"]),
            "runs": int(s["rows"])}


def _rows(df: DataFrame):
    return [r.asDict(recursive=True) for r in df.collect()]


def broker_names(directories) -> list:
    """A name per recording directory (one per broker): its name, made unique with its parent's if needed."""
    paths = [Path(d).resolve() for d in directories]
    names = [p.name or "broker" for p in paths]
    for i, p in enumerate(paths):
        if names.count(names[i]) > 1:
            names[i] = f"{p.parent.name}/{p.name}"
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def scan(spark: SparkSession, directory, params: ScanParams = ScanParams(), *, method: str = "arrow",
         split_records: int = seg.DEFAULT_SPLIT_RECORDS, dedupe: bool = True, on_corrupt: str = "skip",
         plan: Optional[seg.Plan] = None, client_ids: bool = False) -> dict:
    """All analyses over a recording; returns findings in the format of engine.recording.scan_py (plus plan damage).
    ``client_ids``: also list the distinct clients (``_client_ids``, for combining several brokers' scans)."""
    params.validate()
    clock = time.perf_counter
    t0 = clock()
    plan = plan if plan is not None else seg.plan_splits(directory, split_records)
    t_plan = clock()
    raw, _ = runs_for(spark, directory, method, params, split_records=split_records, dedupe=dedupe,
                      on_corrupt=on_corrupt, plan=plan)
    runs = raw.transform(merge_runs(params)).persist()
    saved = {}
    try:
        stats = _stats(runs)  # materialises the cached runs once: read, decode, pre-aggregate, merge
        t_runs = clock()
        # The merged runs are small (members x state changes, whatever the record count) and every analysis is
        # a chain of small shuffles: measured on local[2], fewer shuffle partitions and no adaptive re-planning
        # cut the analyses' latency. Applied to this phase only (the same for every method), then restored.
        for key, value in (("spark.sql.shuffle.partitions", str(max(1, -(-stats.pop("runs") // ANALYSIS_ROWS_PER_PARTITION)))),
                           ("spark.sql.adaptive.enabled", "false")):
            saved[key] = spark.conf.get(key, None)
            spark.conf.set(key, value)
        # the analyses are small, latency-bound jobs on the cached runs: submit them together
        jobs = {
            "inconsistent_subscriptions": lambda: _inconsistent_records(
                _rows(runs.transform(inconsistent_subscriptions(params)))),
            "flapping_clients": lambda: with_connection_marks(
                runs, _flapping_records(_rows(runs.transform(flapping_clients(params))))),
            "heartbeat_gaps": lambda: sorted(_rows(runs.transform(heartbeat_gaps(params)).select(
                "client_id", "groups", "start_ms", "end_ms", "gap_s")), key=lambda r: (r["client_id"], r["start_ms"])),
            "group_sizes": lambda: _rows(runs.transform(group_sizes(params))),
            "expired_clients": lambda: expired_records(runs, params, stats["last_ms"], lambda rows: connection_addresses(
                plan, [(r["conn_id"], r["last_heartbeat_ms"]) for r in rows])),
            "_client_ids": lambda: [r[0] for r in runs.where(F.col("role") == "client").select("client_id")
                                    .distinct().collect()] if client_ids else None,
            "_members": lambda: _rows(runs.where(F.col("role").isin("consumer", "producer"))
                                      .groupBy("group", "role").agg(F.countDistinct("client_id").alias("members"))),
        }
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = {k: pool.submit(fn) for k, fn in jobs.items()}
            done = {k: f.result() for k, f in futures.items()}
        findings = {k: done[k] for k in ("inconsistent_subscriptions", "flapping_clients", "heartbeat_gaps")}
        findings["group_sizes"] = _size_records(done["group_sizes"], done["_members"])
        findings["expired_clients"] = done["expired_clients"]
        findings["member_addresses"] = member_address_records(
            runs, plan, deviating_members(findings["inconsistent_subscriptions"]), params)
        if client_ids:
            findings["_client_ids"] = sorted(done["_client_ids"])
        t_analyses = clock()
    finally:
        runs.unpersist()
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    findings["summary"] = {**stats, **{k: len(findings[k]) for k in FINDING_KEYS}}
    findings["parameters"] = {k: getattr(params, k) for k in ScanParams.__dataclass_fields__}
    findings["scan"] = {"method": method, "splits": len(plan.splits), "segments": plan.segments,
                        "dedupe": dedupe, "seconds": round(clock() - t0, 3),
                        # driver-side phases: planning splits; reading, decoding and merging the runs (the Spark
                        # job that fills the cache); the four analyses collected (concurrent jobs)
                        "timings": {"plan_s": round(t_plan - t0, 3), "runs_s": round(t_runs - t_plan, 3),
                                    "analyses_s": round(t_analyses - t_runs, 3)},
                        **plan.damage_summary()}
    separate_data_loss(findings, plan.data_loss, plan.damaged)
    return findings


def _inconsistent_records(rows) -> list:
    out = []
    for r in rows:
        variants = [{"subscriptions": parse_key(v["sub_key"]), "clients": list(v["clients"])} for v in r["variants"]]
        variants.sort(key=lambda v: (-len(v["clients"]), v["subscriptions"]))
        out.append({"group": r["group"], "start_ms": r["start_ms"], "end_ms": r["end_ms"],
                    "duration_s": r["duration_s"], "variants": variants})
    return sorted(out, key=lambda r: (r["group"], r["start_ms"]))


def _flapping_records(rows) -> list:
    out = [{
        "client_id": r["client_id"], "groups": list(r["groups"]), "reconnects": r["reconnects"],
        "max_reconnects_per_window": r["max_reconnects_per_window"], "first_reconnect_ms": r["first_reconnect_ms"],
        "last_reconnect_ms": r["last_reconnect_ms"], "windows": [list(w) for w in r["windows"]],
        "reconnect_ms": list(r["reconnect_ms"]),
    } for r in rows]
    return sorted(out, key=lambda r: r["client_id"])


def with_connection_marks(runs: DataFrame, rows: list, conn_events: Optional[dict] = None) -> list:
    """The flapping rows with engine.recording.scan_py's connection marks (``connect_ms``, ``closes``): the first and last
    heartbeat of each connection of the flapping clients, from their merged client runs (collected: few clients),
    and a capture's ``conn_events`` (scan_py.connection_marks)."""
    if not rows:
        return rows
    conns: dict = defaultdict(dict)
    for r in runs.where((F.col("role") == "client") & F.col("client_id").isin(sorted({x["client_id"] for x in rows}))) \
            .groupBy("client_id", "conn_id").agg(F.min("first_ms").alias("a"), F.max("last_ms").alias("b")).collect():
        conns[r["client_id"]][int(r["conn_id"])] = (int(r["a"]), int(r["b"]))
    for x in rows:
        x["connect_ms"], x["closes"] = connection_marks(conns[x["client_id"]], conn_events)
    return rows


def _size_records(rows, members) -> list:
    series: dict = {}
    for r in rows:
        series.setdefault((r["group"], r["role"]), []).append([r["ms"], r["members"]])
    count = {(m["group"], m["role"]): m["members"] for m in members}
    out = []
    for key in sorted(set(series) | set(count)):
        s = sorted(series.get(key, []))
        out.append({"group": key[0], "role": key[1], "max_members": max((n for _, n in s), default=0),
                    "members": count.get(key, 0), "series": s})
    return out


#: `rmqhb scan` exit statuses
EXIT_OK, EXIT_USAGE, EXIT_DAMAGED, EXIT_NOTHING, EXIT_STRICT = 0, 2, 3, 4, 5


def cli_main(argv=None) -> int:
    """`rmqhb scan` from the command line: scan_main, and Ctrl-C ends it at once with one line (exit 130) also
    while Spark runs (not for an embedding program or a test calling scan_main: their SIGINT stays theirs)."""
    import signal

    from .scan_engine import reported

    before = signal.getsignal(signal.SIGINT)
    _cli["interrupt"] = not os.environ.get("RMQHB_DEBUG")
    try:
        return reported(scan_main, argv)  # and the closing line: engine, what was read, each part's time
    finally:  # a caller in this process (rmqhb demo, a test calling cli.main) gets its own handler back
        _cli["interrupt"] = False
        if before is not None and signal.getsignal(signal.SIGINT) is _interrupt:
            signal.signal(signal.SIGINT, before)


def scan_main(argv=None) -> int:
    """`rmqhb scan DIR --out REPORT_DIR`: every analysis over a recording on Spark (local[*] unless --master),
    written as findings.json, CSV, PNG plots and index.html; prints a short summary. Exit status: 0 the whole
    recording was read; 3 the scan completed over damaged data (corrupt ranges, torn tails, recorder data loss:
    named in findings.json, the report's banner and one stderr line; --allow-damage makes it 0); 2 no recording or
    bad arguments; 4 nothing decodable; 5 --strict stopped on damage; 1 any other failure. Broker logs
    (``--input broker-log``, ``--log-tz``, ``--broker NAME=PATH`` or log files given): engine.bindings.brokerlog.
    The report directory is never written through a symbolic link (engine.bindings.report.ReportFiles): --out naming
    one is refused with one line (exit 2), before the scan runs."""
    from .report import ReportOutputError, check_report_dir

    argv = list(sys.argv[2:] if argv is None else argv)
    try:
        for i, a in enumerate(argv):  # every input kind's --out, checked before a scan that may take minutes
            if a == "--out" and i + 1 < len(argv) or a.startswith("--out="):
                check_report_dir(a[len("--out="):] if a.startswith("--out=") else argv[i + 1])
        return _scan_main(argv)
    except ReportOutputError as e:
        print(f"rmqhb scan: --out {e}", file=sys.stderr)
        return EXIT_USAGE
    except JavaUnavailable as e:  # found as Spark was to start (an in-process scan needs no Java)
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return EXIT_USAGE


#: bytes read from the start of each log file given to tell a text log from binary data (bounded: a .gz is
#: decompressed only this far)
SNIFF_BYTES = 64 * 1024
#: what each input kind is, in the words of a one-line message
KIND_NAMES = {"recording": "recording (*.seg segments)", "broker-log": "broker log (broker*.log*)",
              "pcap": "packet capture (.pcap, .pcapng)"}
_CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz")


def _head(path: Path) -> bytes:
    import gzip
    import zlib

    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
            return f.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return b""  # unreadable or cut: the reader names the damage


def _binary(head: bytes) -> Optional[str]:
    """Why ``head`` (a file's first bytes) is not text, or None. A log line never holds NUL; a few other control
    bytes can be a client's text, so only a share of them counts."""
    if b"\0" in head:
        return f"binary data: a NUL byte at byte {head.index(0)}"
    controls = sum(head.count(bytes([c])) for c in (*range(1, 9), *range(14, 32), 127))
    if head and controls * 10 > len(head):
        return f"binary data: {controls * 100 // len(head)}% control bytes in its first {len(head):,} bytes"
    return None


def directory_kinds(directory: Path) -> dict:
    """{kind: first file of that kind} in a scan input directory: recording segments at its top level, broker
    logs (broker*.log*, at any depth: otherdays/) and packet captures (by their magic number) anywhere."""
    from .brokerlog import _file_kind, is_broker_log_name

    kinds = {}
    seg_file = next(directory.glob("*.seg"), None)
    if seg_file is not None:
        kinds["recording"] = seg_file
    for f in sorted(directory.rglob("*")):
        if len(kinds) == 3:
            break
        if f.suffix == ".seg" or f.name.endswith(".json") or not f.is_file():
            continue
        k = "broker-log" if is_broker_log_name(f.name) else ("pcap" if _file_kind(f) == "pcap" else None)
        if k:
            kinds.setdefault(k, f)
    return kinds


def input_problem(argv, kind: str, explicit: bool) -> Optional[Tuple[int, str]]:
    """(exit status, one line) for scan inputs that cannot be scanned, found before any work (no Spark yet):
    a path that does not exist (2), a directory holding nothing to scan (2) or several kinds unless --format says
    which to read (2), a segment file given for its recording (2), a file of no known kind (2), an empty file, a
    capture without a capture header, a log of binary data (4: nothing decodable), a --log-tz that is no zone (2)."""
    from .brokerlog import _paths_of, path_kind, resolve_tz

    paths = list(_paths_of(argv))
    for i, a in enumerate(argv):
        if a == "--broker" and i + 1 < len(argv) or a.startswith("--broker="):
            paths.append((a.split("=", 1)[1] if a.startswith("--broker=") else argv[i + 1]).partition("=")[2])
        if (a == "--log-tz" and i + 1 < len(argv) or a.startswith("--log-tz=")) and kind == "broker-log":
            tz = a.split("=", 1)[1] if a.startswith("--log-tz=") else argv[i + 1]
            try:
                resolve_tz(tz)
            except Exception:  # timedelta's range, ZoneInfo's KeyError or ValueError: none of them is the user's
                return EXIT_USAGE, (f"--log-tz {tz!r} is not a zone: give an IANA name (e.g. Asia/Shanghai) or "
                                    "an offset from -23:59 to +23:59 (e.g. +08:00)")
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            return EXIT_USAGE, f"no such file or directory: {raw}"
        if p.is_dir():
            kinds = directory_kinds(p)
            if not kinds:
                return EXIT_USAGE, (f"{raw} holds no recording (*.seg), broker log (broker*.log*) or packet "
                                    "capture (.pcap, .pcapng)")
            if explicit and kind not in kinds:
                return EXIT_USAGE, f"{raw} holds no {KIND_NAMES[kind]}"
            if not explicit and len(kinds) > 1:
                found = "; ".join(f"a {KIND_NAMES[k]}: {f.relative_to(p)}" for k, f in kinds.items())
                return EXIT_USAGE, (f"{raw} mixes input kinds ({found}); give one directory per kind, or "
                                    "--format KIND to read only that kind")
            continue
        if not p.is_file():
            return EXIT_USAGE, f"{raw} is not a regular file or a directory"
        if p.name.endswith(".seg"):
            return EXIT_USAGE, f"{raw} is one segment of a recording: give the recording's directory ({p.parent})"
        if p.stat().st_size == 0:
            return EXIT_NOTHING, f"{raw} is empty: nothing to scan"
        found = path_kind(p)
        if kind == "pcap" or (found is None and p.name.endswith(_CAPTURE_SUFFIXES)):
            if found != "pcap":
                return EXIT_NOTHING, f"{raw} is not a packet capture (no pcap or pcapng header at byte 0)"
        elif kind == "broker-log" or found == "broker-log":
            binary = _binary(_head(p))
            if binary:
                return EXIT_NOTHING, f"{raw} is not a broker log ({binary})"
        elif kind == "recording":
            return EXIT_USAGE, (f"{raw} is a file, not a recording directory, a broker log (*.log, broker*.log*) "
                                "or a packet capture (.pcap, .pcapng); --format KIND names its kind")
    return None


SCAN_HELP = """\
What a RocketMQ broker's clients did (group sizes over time, flapping and expired clients, heartbeat gaps,
inconsistent subscriptions, retry-topic churn), written to REPORT_DIR as index.html, findings.json, CSVs and
PNG plots. PATH is any of (the kind is detected; --format KIND forces it):
  recording    a directory of *.seg segments (rmqhb serve --recordDir, rmqhb generate); several: one per broker
  broker-log   Apache RocketMQ 4.x/5.x broker logs: files, or a directory per broker (broker*.log*, otherdays/)
  pcap         packet captures (.pcap, .pcapng, .gz) of the brokers' remoting port: files or directories
A broker's log and its capture given together (files, or one directory) scan as one timeline."""
SCAN_EPILOG = """\
broker logs (rmqhb scan --format broker-log -h for all):
  --log-tz ZONE         zone of the lines' times: IANA name or +HH:MM (default this machine's)
  --broker NAME=PATH    name the broker whose logs (or captures) are under PATH
  --max-line-bytes N    longest line read; a longer one is skipped and named as damage
packet captures (rmqhb scan --format pcap -h for all):
  --port PORT           read only TCP connections with this port (repeatable; default: every connection)
  --shards N            Spark tasks per capture, each reading the file and taking its share of the connections
exit status: 0 all input read; 3 completed over damaged input (named in the report; --allow-damage: 0);
  2 bad arguments, no such path, nothing of a known kind, mixed kinds, no Java 17; 4 nothing decodable (an empty
  file, a capture without a capture header, a log of binary data, no broker log line); 5 --strict stopped on
  damage; 130 interrupted (Ctrl-C); 1 any other failure (one line; --debug shows the Python and Java stacks)"""


def _scan_main(argv) -> int:
    from .brokerlog import INPUT_FORMATS, input_format
    from .merge import MergeRefused, route, scan_main as merged_scan_main

    try:
        argv, mixed, notice = route(argv)  # each file's kind from its content (engine.bindings.merge)
    except MergeRefused as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return EXIT_USAGE
    if mixed:  # a broker's log and its capture: one timeline; a combination that cannot merge: one line
        if _cli.get("interrupt"):
            _catch_interrupt()
        return merged_scan_main(argv)
    if notice:
        print(f"rmqhb scan: {notice}", file=sys.stderr)
    kind, why = input_format(argv)
    if kind is None:
        print(f"rmqhb scan: the inputs are of different kinds ({why}); scan them separately or give --format",
              file=sys.stderr)
        return EXIT_USAGE
    if kind not in INPUT_FORMATS:
        print(f"rmqhb scan: {why} is one of {', '.join(INPUT_FORMATS)}, not {kind!r}", file=sys.stderr)
        return EXIT_USAGE
    if _cli.get("interrupt"):
        _catch_interrupt()
    if not any(a in ("-h", "--help") for a in argv):
        problem = input_problem(argv, kind, explicit=why in ("--format", "--input"))
        if problem:
            print(f"rmqhb scan: {problem[1]}", file=sys.stderr)
            return problem[0]
    if kind == "broker-log":
        from .brokerlog import scan_main as broker_log_scan_main

        return broker_log_scan_main(argv)
    if kind == "pcap":
        try:
            from .pcap import scan_main as pcap_scan_main  # packet captures (issue 14 part 2)
        except ImportError:
            print("rmqhb scan: packet captures are not supported by this version", file=sys.stderr)
            return EXIT_USAGE
        return pcap_scan_main(argv)
    from .scan_engine import add_arguments as add_engine_arguments

    d = ScanParams()
    p = argparse.ArgumentParser(prog="rmqhb scan", usage="rmqhb scan PATH... --out REPORT_DIR [options]",
                                description=SCAN_HELP, epilog=SCAN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directories", type=Path, nargs="+", metavar="PATH",
                   help="recording directory (segments); several: one per broker (named after the directory); "
                        "broker logs and captures: below")
    p.add_argument("--out", type=Path, required=True, metavar="REPORT_DIR",
                   help="report directory (created; an earlier report's files there are replaced)")
    p.add_argument("--format", "--input", dest="format", default="recording", choices=["recording"], metavar="KIND",
                   help="recording, broker-log or pcap (detected when not given)")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--method", default="arrow", choices=["arrow", "pandas", "heartbeats", "from_json", "json_loads"],
                   help="arrow: mapInArrow reader + compiled decoder (fast); pandas: records + pandas UDF decoder")
    p.add_argument("--min-duration", type=float, default=d.min_duration_s,
                   help="drop subscription disagreements shorter than this many seconds (rolling updates)")
    p.add_argument("--gap-threshold", type=float, default=d.gap_threshold_s, help="seconds of silence reported as a gap")
    p.add_argument("--expiry", type=float, default=d.expiry_s, help="seconds a member stays live after a heartbeat")
    p.add_argument("--flap-window", type=float, default=d.flap_window_s, help="seconds per flapping window")
    p.add_argument("--flap-min", type=int, default=d.flap_min_reconnects, help="reconnects per window that flag a client")
    p.add_argument("--split-records", type=int, default=seg.DEFAULT_SPLIT_RECORDS, help="records per Spark task")
    p.add_argument("--no-dedupe", action="store_true", help="decode every body, not each distinct body once")
    p.add_argument("--strict", action="store_true", help="stop (exit 5) on any damage instead of scanning around it")
    p.add_argument("--allow-damage", action="store_true",
                   help="exit 0 when the scan completed over damaged data (default: exit 3)")
    p.add_argument("--debug", action="store_true", help="show the whole error (Java and Python stacks) on a failure")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--no-plots", action="store_true")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    for directory in args.directories:
        if not directory.is_dir():
            print(f"rmqhb scan: not a directory: {directory}", file=sys.stderr)
            return EXIT_USAGE
    try:
        params = ScanParams(args.expiry, args.gap_threshold, args.min_duration, args.flap_window, args.flap_min).validate()
    except ValueError as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return EXIT_USAGE
    from engine.recording.scan_py import combine_brokers

    from .report import damage_line, print_summary, write_report

    plans = {}
    for name, directory in zip(broker_names(args.directories), args.directories):
        plan = plans[name] = seg.plan_splits(directory, args.split_records)
        if plan.segments == 0:
            print(f"rmqhb scan: no recording in {directory} (no *.seg segment files)", file=sys.stderr)
            return EXIT_USAGE
        if args.strict and plan.is_damaged:
            first = (plan.damaged or plan.data_loss)[0]
            print(f"rmqhb scan: --strict: the recording is damaged ({first['segment']} at byte {first['offset']}: "
                  f"{first['reason']}); run `rmqhb segments verify {directory}`", file=sys.stderr)
            return EXIT_STRICT
    from .scan_engine import EngineError, local_recording_scan, recording_engine, run_scan

    try:  # in this process or on Spark (a running session, e.g. a notebook's or a test's, is used and left running)
        engine, what = recording_engine(args, plans)
    except EngineError as e:
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return EXIT_USAGE

    def on_spark(spark):
        per = {name: scan(spark, plan.directory, params, method=args.method, split_records=args.split_records,
                          dedupe=not args.no_dedupe, on_corrupt="raise" if args.strict else "skip", plan=plan,
                          client_ids=len(plans) > 1)
               for name, plan in plans.items()}
        return next(iter(per.values())) if len(per) == 1 else combine_brokers(per)

    try:
        findings = run_scan(args, engine=engine, what=what, app="rmqhb-scan", spark_scan=on_spark,
                            local_scan=lambda: local_recording_scan(next(iter(plans.values())), params))
        args.directory = args.directories[0] if len(plans) == 1 else ", ".join(map(str, args.directories))
    except Exception as e:  # a task that met damage the plan did not see (--strict), or Spark failing
        if args.debug or os.environ.get("RMQHB_DEBUG") or isinstance(e, JavaUnavailable):
            raise
        cause = str(e).strip().splitlines()
        detail = next((ln for ln in cause if "SegmentError" in ln), cause[0] if cause else type(e).__name__)
        print(f"rmqhb scan: stopped: {detail[:300]} (--debug shows the whole error)", file=sys.stderr)
        return EXIT_STRICT if args.strict else 1
    decodable = findings["summary"]["records"] - findings["summary"]["bad_bodies"]
    if decodable <= 0:
        print(f"rmqhb scan: nothing decodable in {args.directory}: {findings['summary']['records']} records, "
              f"{findings['summary']['bad_bodies']} undecodable bodies", file=sys.stderr)
        write_report(findings, args.out, plots=False)
        return EXIT_NOTHING
    index = write_report(findings, args.out, plots=not args.no_plots)
    print_summary(findings, sys.stdout)
    print(f"report: {index}")
    damage = damage_line(findings)
    if damage:
        print(f"rmqhb scan: {damage}", file=sys.stderr)
        return EXIT_OK if args.allow_damage else EXIT_DAMAGED
    return EXIT_OK
