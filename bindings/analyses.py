"""The analyses on Spark: the recording's readers (a Python data source and mapInArrow), the Cython decoder in
Arrow UDFs, the analyses as ``df.transform`` functions (the capture and merged scans use them too), and ``scan``.

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
the Python that ``PYSPARK_PYTHON`` names (``session.spark_session`` sets it to this interpreter for local runs and
exports this checkout on ``PYTHONPATH``). On a cluster the recording directory must be readable by executors.
The session comes from ``engine.bindings.session``; `rmqhb scan` (``engine.bindings.cli``) calls ``scan`` when
a recording is scanned on Spark.
"""
from __future__ import annotations

import functools
import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Optional

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from engine.recording.scan_py import (CLIENT_INNER_PRODUCER, FINDING_KEYS, ScanParams, connection_marks, deviating_members,
                            parse_key, separate_data_loss)

from . import segments as seg
from . import session

RECORD_STRUCT = from_arrow_schema(seg.RECORD_SCHEMA)
HEARTBEAT_STRUCT = from_arrow_schema(seg.HEARTBEAT_SCHEMA)
DECODED_STRUCT = from_arrow_type(seg.DECODED_TYPE)
FLAT_DECODED_STRUCT = from_arrow_type(seg.FLAT_DECODED_TYPE)
RUN_STRUCT = from_arrow_schema(seg.RUN_SCHEMA)
_RUN_COLUMNS = [f.name for f in seg.RUN_SCHEMA]



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


def spark_session(master: Optional[str] = None, app_name: str = "rmqhb", **kw) -> SparkSession:
    """``session.spark_session`` (same arguments) with the ``rmqhb`` data source registered: the session for
    notebooks, tests and benchmarks that read recordings with ``spark.read.format("rmqhb")``."""
    spark = session.spark_session(master, app_name, **kw)
    register_data_source(spark)
    return spark


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
    if via == "datasource" and register_data_source(spark):  # a session from session.spark_session has none yet
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
            # a silent restart's cut (bindings.pcap.restart_events) the capture's reader did not know: a run may
            # hold it (its heartbeats before it end there) or start after it (the new host reset that connection:
            # out at once), as scan_py.member_left has it
            df = df.join(F.broadcast(conn_ends.select("conn_id", F.col("cut_ms").alias("_ce"),
                                                      F.col("restart").alias("_rs"))), "conn_id", "left") \
                .withColumn("_ce", F.when(F.col("_ce") >= F.col("last_ms"), F.col("_ce"))
                            .when(F.col("_rs") & (F.col("_ce") > F.col("first_ms")), F.col("_ce"))
                            .when(F.col("_rs"), F.col("first_ms"))).select(*cols, "_ce")
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
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

    ends = [(int(c), int(e["end"][0]), e["end"][1] == "broker_restart") for c, e in conn_events.items()
            if e.get("end") is not None]
    unregs = [(c, r, g, int(t)) for (c, r, g), ts in unregisters.items() for t in ts]
    if not ends and not unregs:
        return None
    return (spark.createDataFrame(ends, StructType([StructField("conn_id", LongType()),
                                                    StructField("cut_ms", LongType()),
                                                    StructField("restart", BooleanType())])),
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


def reconnects(restarted=()):
    """merged runs -> client_id, reconnect_ms: every heartbeat on another connection than the client's previous
    (``restarted``: a capture's connections a broker restart ended: the next one after such a connection is no
    reconnect, engine.recording.scan_py._flapping)."""

    def transform(runs: DataFrame) -> DataFrame:
        steps = _client_steps(runs)
        new = F.col("prev_conn").isNotNull() & (F.col("conn_id") != F.col("prev_conn"))
        if restarted:
            new = new & ~F.col("prev_conn").isin(list(restarted))
        return steps.where(new).select("client_id", F.col("first_ms").alias("reconnect_ms"))

    return transform


def flapping_clients(params: ScanParams = ScanParams(), restarted=()):
    """merged runs -> clients with flap_min_reconnects or more reconnects in some flap_window (epoch-aligned):
    client_id, groups, reconnects, max_reconnects_per_window, first/last_reconnect_ms, windows, reconnect_ms
    (``restarted``: see :func:`reconnects`)."""
    w_ms, need = params.window_ms, params.flap_min_reconnects

    def transform(runs: DataFrame) -> DataFrame:
        per_client = runs.transform(reconnects(restarted)).groupBy("client_id").agg(
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


@contextmanager
def analysis_conf(spark: SparkSession, partitions: int):
    """The analyses' Spark settings for the ``with`` block, the previous ones restored after it. The merged runs
    are small (members x state changes, whatever the record count) and every analysis is a chain of small
    shuffles: measured on local[2], fewer shuffle partitions and no adaptive re-planning cut their latency."""
    saved = {}
    try:
        for key, value in (("spark.sql.shuffle.partitions", str(partitions)), ("spark.sql.adaptive.enabled", "false")):
            saved[key] = spark.conf.get(key, None)
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


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
    try:
        stats = _stats(runs)  # materialises the cached runs once: read, decode, pre-aggregate, merge
        t_runs = clock()
        with analysis_conf(spark, max(1, -(-stats.pop("runs") // ANALYSIS_ROWS_PER_PARTITION))):
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
