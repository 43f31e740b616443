"""Spark binding of the engine (installed as ``engine.bindings``).

``engine.bindings.segments``: recording splits as Arrow data (no Spark needed);
``engine.bindings.spark``: the SparkSession helper, segment readers (mapInArrow and a Python data source), the
pandas-UDF and mapInArrow decoders, the ``df.transform`` analyses and ``scan``/``scan_main``;
``engine.bindings.report``: findings.json, CSV, SVG plot and HTML report writer.

Importing this package does not import pyspark.
"""
