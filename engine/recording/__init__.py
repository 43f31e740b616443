"""Heartbeats on disk and what the scan reads: the ``recorder`` (zstd segments; compiled ``_segment``), the
synthetic fleet generator ``synth``, the plain (non-Spark) scan ``scan_py``, and the readers of what real
deployments already have: Java brokers' logs (``_brokerlog`` / ``_brokerlog_py``) and packet captures
(``_pcap`` / ``_pcap_py``). The Spark side is ``engine.bindings``."""
