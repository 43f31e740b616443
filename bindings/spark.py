"""A short import for notebooks, tests and benchmarks: ``from engine.bindings.spark import scan, spark_session``
(these names lived here before the scan was split into modules). It holds only the names imported through it:

* from ``engine.bindings.analyses``: ``scan(spark, dir)``, ``spark_session`` (the session with the ``rmqhb`` data
  source registered), the recording's Spark readers, the decoders and the ``df.transform`` analyses;
* from ``engine.bindings.cli``: ``scan_main`` (`rmqhb scan`).

Anything else is imported from the module that holds it. Importing this module imports pyspark; `rmqhb scan` itself
enters at ``engine.bindings.cli``, which does not. No module of ``engine.bindings`` imports this one.
"""
from .analyses import (decode_from_json, decode_json_loads, decode_pandas, heartbeat_gaps,  # noqa: F401
                       inconsistent_subscriptions, merge_runs, read_heartbeats, read_records, read_runs, scan,
                       spark_session)
from .cli import scan_main  # noqa: F401
