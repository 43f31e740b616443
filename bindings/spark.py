"""The names ``engine.bindings.spark`` has always offered (notebooks, tests, benchmarks), from the modules that now
hold them:

* ``engine.bindings.analyses``: the recording's Spark readers, the decoders, the ``df.transform`` analyses,
  ``scan(spark, dir)`` and ``spark_session`` (the session with the ``rmqhb`` data source registered);
* ``engine.bindings.session``: the session's environment, private directory, Java check and Ctrl-C handling;
* ``engine.bindings.cli``: `rmqhb scan` (``scan_main``, ``cli_main``) and ``engine.bindings.inputs``: its input
  checks.

Importing this module imports pyspark (as it always did); `rmqhb scan` itself enters at ``engine.bindings.cli``,
which does not. No module of ``engine.bindings`` imports this one: it sits above them all.
"""
from .analyses import *  # noqa: F401,F403  (the analyses' public names, spark_session among them)
from .analyses import _flapping_records, _inconsistent_records, _rows, _size_records, _stats  # noqa: F401
from .cli import (EXIT_DAMAGED, EXIT_NOTHING, EXIT_OK, EXIT_STRICT, EXIT_USAGE, broker_names, cli_main,  # noqa: F401
                  scan_main)
from .inputs import KIND_NAMES, SNIFF_BYTES, directory_kinds, input_problem  # noqa: F401
from .session import (_LOG4J2, JAVA_MIN_VERSION, JavaUnavailable, _log4j2_file, java_problem,  # noqa: F401
                      prepare_environment, private_dir)
