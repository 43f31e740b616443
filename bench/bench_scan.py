"""The Spark scan end to end on local[2]: read segments, decompress, decode, all four analyses, findings collected.

``test_scan``: contenders side by side on the same recording and the same analyses (they must all produce the
same findings, exactly the injected anomalies):

* ``arrow``: mapInArrow reads each split, decodes each distinct body once with the compiled batch decoder and
  pre-aggregates runs (the default scan);
* ``arrow_every_body``: the same, but decoding every body (what the decoder alone sustains);
* ``pandas``: the Python data source reads raw records, a pandas UDF decodes them with the compiled decoder;
* ``from_json``: the same raw records decoded by Spark's own ``from_json``;
* ``json_loads``: the same raw records decoded by ``json.loads`` in a pandas UDF.

``test_decode``: the same contenders reading and decoding only (no analyses).

Run (10M heartbeats by default; RMQHB_BENCH_RECORDS=1000000 for a quick run; the recording is generated once
into RMQHB_BENCH_DIR, default /tmp/rmqhb-bench-<records>)::

    .venv/bin/python -m pytest bench/bench_scan.py --benchmark-only -s \
        --benchmark-columns=min,rounds --benchmark-sort=name

Each contender runs once (a Spark scan of millions of rows is its own repetition); heartbeats/s is printed and
stored in the benchmark's extra_info. Target: ``arrow`` >= 1M heartbeats/s and >= 3x ``from_json``.
"""
import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from engine.recording.scan_py import FINDING_KEYS  # noqa: E402
from engine.recording.synth import FleetConfig, compare_with_manifest, generate, load_manifest  # noqa: E402

RECORDS = int(os.environ.get("RMQHB_BENCH_RECORDS", 10_000_000))
CLIENTS = int(os.environ.get("RMQHB_BENCH_CLIENTS", 3500))
DIRECTORY = Path(os.environ.get("RMQHB_BENCH_DIR", f"/tmp/rmqhb-bench-{RECORDS}"))
METHODS = os.environ.get("RMQHB_BENCH_METHODS", "arrow,from_json,json_loads,pandas,arrow_every_body").split(",")
RESULTS = {}
pytestmark = pytest.mark.timeout(4 * 3600)  # a 10M-row baseline scan takes minutes, not the suite's 300 s


@pytest.fixture(scope="module")
def recording():
    if not (DIRECTORY / "manifest.json").exists():
        days = RECORDS * 30 / CLIENTS / 86400
        generate(DIRECTORY, FleetConfig(clients=CLIENTS, groups=max(4, CLIENTS // 20), days=days, seed=7),
                 progress=True, block_records=4096)
    return DIRECTORY, load_manifest(DIRECTORY)


@pytest.fixture(scope="module")
def spark(recording, tmp_path_factory):
    from engine.bindings.segments import TIMINGS_ENV
    from engine.bindings.spark import scan, spark_session

    # the Python workers inherit this: every scan task appends its stage timings (see task_timings)
    os.environ[TIMINGS_ENV] = str(TASK_TIMINGS)
    session = spark_session("local[2]", "rmqhb-bench", driver_memory="4g")
    # warm up (part of start-up, not measured): JVM JIT, Python workers, the data source registration, on a
    # small recording, twice with every contender
    small = tmp_path_factory.mktemp("warm")
    generate(small, FleetConfig(clients=50, groups=5, days=0.1, seed=1))
    for _ in range(2):
        for method in ("arrow", "pandas", "from_json", "json_loads"):
            scan(session, small, method=method)
    yield session
    session.stop()
    if RESULTS:
        print(f"\nload average {os.getloadavg()}")
        print(f"{'method':<26}{'seconds':>10}{'heartbeats/s':>16}{'vs from_json':>14}{'vs json_loads':>15}")
        for name, (secs, rate) in sorted(RESULTS.items()):
            prefix = "decode " if name.startswith("decode ") else ""
            ratios = []
            for b in ("from_json", "json_loads"):
                base = RESULTS.get(prefix + b)
                ratios.append(f"{rate / base[1]:.2f}x" if base else "")
            print(f"{name:<26}{secs:>10.1f}{rate:>16,.0f}{ratios[0]:>14}{ratios[1]:>15}")


TASK_TIMINGS = Path(os.environ.get("RMQHB_BENCH_TIMINGS", f"/tmp/rmqhb-bench-task-timings-{os.getpid()}.jsonl"))
FINDINGS = {}


def task_timings() -> dict:
    """Sum of the scan tasks' stage timings (task seconds, over both cores) since the last call."""
    if not TASK_TIMINGS.exists():
        return {}
    lines = [json.loads(x) for x in TASK_TIMINGS.read_text().splitlines() if x.strip()]
    TASK_TIMINGS.write_text("")
    out = {"tasks": len(lines), "sorted_path_tasks": sum(1 for x in lines if x.get("sorted_path"))}
    for key in ("total", "read", "decompress", "scan", "decode", "runs", "arrow"):
        out[key + "_s"] = round(sum(x.get(key, 0.0) for x in lines), 2)
    out["records"] = sum(x.get("records", 0) for x in lines)
    out["rows_out"] = sum(x.get("rows", 0) for x in lines)
    return out


DECODERS = os.environ.get("RMQHB_BENCH_DECODERS", "arrow,arrow_every_body,pandas,from_json,json_loads").split(",")


@pytest.mark.parametrize("method", DECODERS)
def test_decode(benchmark, spark, recording, method):
    """Read and decode only (every decoded column written to Spark's no-op sink, so nothing is pruned)."""
    from engine.bindings.spark import (decode_from_json, decode_json_loads, decode_pandas, read_heartbeats,
                                       read_records)

    directory, manifest = recording
    if method in ("arrow", "arrow_every_body"):
        df = read_heartbeats(spark, directory, dedupe=method == "arrow")
    else:
        decoder = {"pandas": decode_pandas(), "from_json": decode_from_json(), "json_loads": decode_json_loads()}[method]
        df = read_records(spark, directory, via="arrow").transform(decoder)
    out = {}

    def run():
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        out["seconds"] = time.perf_counter() - t0

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    n = manifest["records"]
    rate = n / out["seconds"]
    RESULTS["decode " + method] = (out["seconds"], rate)
    benchmark.extra_info.update({"records": n, "heartbeats_per_s": round(rate)})
    print(f"\ndecode {method}: {n:,} heartbeats in {out['seconds']:.1f} s = {rate:,.0f}/s")


@pytest.mark.parametrize("method", METHODS)
def test_scan(benchmark, spark, recording, method):
    from engine.bindings.spark import scan

    directory, manifest = recording
    kwargs = {"method": "arrow", "dedupe": False} if method == "arrow_every_body" else {"method": method}
    out = {}

    def run():
        task_timings()  # reset
        load = os.getloadavg()
        t0 = time.perf_counter()
        out["findings"] = scan(spark, directory, **kwargs)
        out["seconds"] = time.perf_counter() - t0
        out["load"] = load

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    findings = out["findings"]
    n = findings["summary"]["records"]
    rate = n / out["seconds"]
    RESULTS[method] = (out["seconds"], rate)
    stages = {**findings["scan"]["timings"], **({"task": task_timings()} if method.startswith("arrow") else {})}
    benchmark.extra_info.update({"records": n, "heartbeats_per_s": round(rate), "stages": stages,
                                 "load_before": out["load"]})
    print(f"\n{method}: {n:,} heartbeats in {out['seconds']:.1f} s = {rate:,.0f}/s "
          f"(load average before {out['load'][0]:.2f}); stages: {json.dumps(stages)}")
    # every contender must find exactly what was injected (same data, same answers), and the same as the others
    assert compare_with_manifest(findings, manifest) == []
    same = {k: findings[k] for k in FINDING_KEYS}
    for other, theirs in FINDINGS.items():
        assert same == theirs, f"{method} and {other} disagree"
    FINDINGS[method] = same
