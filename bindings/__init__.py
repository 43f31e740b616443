"""Spark binding of the engine (installed as ``engine.bindings``).

``engine.bindings.segments``: recording splits as Arrow data (no Spark needed);
``engine.bindings.cli``: `rmqhb scan` (``scan_main``), its input checks in ``engine.bindings.inputs``;
``engine.bindings.analyses``: the recording's Spark readers (mapInArrow and a Python data source), the pandas-UDF
and mapInArrow decoders, the ``df.transform`` analyses, ``scan`` and ``spark_session`` (the session with the
``rmqhb`` data source); ``engine.bindings.session``: the Spark session's environment, private directory and Java
check; ``engine.bindings.brokerlog``, ``engine.bindings.pcap`` and ``engine.bindings.merge``: the broker-log, capture
and merged readers; ``engine.bindings.spark``: a short import of the names notebooks, tests and benchmarks use;
``engine.bindings.report``: findings.json, CSV, SVG plot and HTML report writer.

Importing this package does not import pyspark.
"""
