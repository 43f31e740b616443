"""`rmqhb scan`: the one entry. It checks the inputs (``inputs``), routes them by kind (``merge.route``) and hands
them to their reader's scan: a recording (``recording_scan_main`` below: ``engine.recording.scan_py`` in this
process, ``analyses.scan`` on Spark), broker logs (``brokerlog.scan_main``), packet captures (``pcap.scan_main``),
or a broker's log with its capture or recording as one timeline (``merge.scan_main``). Each chooses its engine
and runs through ``scan_engine``; Spark's session, when one starts, is ``session.spark_session``.

Loading this module (and inputs, scan_engine, session, plan) imports neither pyspark nor pyarrow nor pandas: a small
input scanned in this process loads no part of Spark (tests/test_imports.py checks it). No module of
``engine.bindings`` imports this one (the facade ``spark.py`` aside).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine.recording.scan_py import ScanParams

from . import session
from .inputs import EXIT_DAMAGED, EXIT_NOTHING, EXIT_OK, EXIT_STRICT, EXIT_USAGE, input_problem


def cli_main(argv=None) -> int:
    """`rmqhb scan` from the command line: scan_main, and Ctrl-C ends it at once with one line (exit 130) also
    while Spark runs (not for an embedding program or a test calling scan_main: their SIGINT stays theirs)."""
    import signal

    from .scan_engine import reported

    before = signal.getsignal(signal.SIGINT)
    session.take_interrupts(not os.environ.get("RMQHB_DEBUG"))
    try:
        return reported(scan_main, argv)  # and the closing line: engine, what was read, each part's time
    finally:  # a caller in this process (rmqhb demo, a test calling cli.main) gets its own handler back
        session.take_interrupts(False)
        session.restore_interrupt(before)


def scan_main(argv=None) -> int:
    """`rmqhb scan PATH... --out REPORT_DIR`: every analysis over a recording, broker logs or packet captures (or a
    broker's log with its capture), in this process or on Spark (scan_engine), written as findings.json, CSV, SVG
    plots and index.html; prints a short summary. Exit status: 0 the whole input was read; 3 the scan completed
    over damaged data (corrupt ranges, torn tails, recorder data loss: named in findings.json, the report's banner
    and one stderr line; --allow-damage makes it 0); 2 no input or bad arguments; 4 nothing decodable; 5 --strict
    stopped on damage; 1 any other failure. The report directory is never written through a symbolic link
    (engine.bindings.report.ReportFiles): --out naming one is refused with one line (exit 2), before the scan runs."""
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
    except session.JavaUnavailable as e:  # found as Spark was to start (an in-process scan needs no Java)
        print(f"rmqhb scan: {e}", file=sys.stderr)
        return EXIT_USAGE


SCAN_HELP = """\
What a RocketMQ broker's clients did (group sizes over time, flapping and expired clients, heartbeat gaps,
inconsistent subscriptions, retry-topic churn), written to REPORT_DIR as index.html, findings.json, CSVs and
SVG plots. PATH is any of (the kind is detected; --format KIND forces it):
  recording    a directory of *.seg segments (rmqhb serve --recordDir, rmqhb generate), or one segment file;
               several: one per broker
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
        session.catch_interrupt()
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
    session.catch_interrupt()
    if not any(a in ("-h", "--help") for a in argv):
        problem = input_problem(argv, kind, explicit=why in ("--format", "--input"))
        if problem:
            print(f"rmqhb scan: {problem[1]}", file=sys.stderr)
            return problem[0]
    if kind == "broker-log":
        from .brokerlog import scan_main as broker_log_scan_main

        return broker_log_scan_main(argv)
    if kind == "pcap":
        from .pcap import scan_main as pcap_scan_main

        return pcap_scan_main(argv)
    return recording_scan_main(argv)


def broker_names(directories) -> list:
    """A name per recording directory (one per broker): its name, made unique with its parent's if needed."""
    paths = [Path(d).resolve() for d in directories]
    names = [p.name or "broker" for p in paths]
    for i, p in enumerate(paths):
        if names.count(names[i]) > 1:
            names[i] = f"{p.parent.name}/{p.name}"
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def recording_scan_main(argv) -> int:
    """`rmqhb scan RECORDING... --out REPORT_DIR`: recordings (directories of *.seg segments; several: one per
    broker), in this process (engine.recording.scan_py) or on Spark (analyses.scan). Exit statuses: scan_main's."""
    from .plan import DEFAULT_SPLIT_RECORDS, plan_splits
    from .scan_engine import add_arguments as add_engine_arguments

    d = ScanParams()
    p = argparse.ArgumentParser(prog="rmqhb scan", usage="rmqhb scan PATH... --out REPORT_DIR [options]",
                                description=SCAN_HELP, epilog=SCAN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directories", type=Path, nargs="+", metavar="PATH",
                   help="recording directory (segments) or one segment file; several: one per broker (named after "
                        "the directory); broker logs and captures: below")
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
    p.add_argument("--split-records", type=int, default=DEFAULT_SPLIT_RECORDS, help="records per Spark task")
    p.add_argument("--no-dedupe", action="store_true", help="decode every body, not each distinct body once")
    p.add_argument("--strict", action="store_true", help="stop (exit 5) on any damage instead of scanning around it")
    p.add_argument("--allow-damage", action="store_true",
                   help="exit 0 when the scan completed over damaged data (default: exit 3)")
    p.add_argument("--debug", action="store_true", help="show the whole error (Java and Python stacks) on a failure")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--no-plots", action="store_true")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    parents = {}
    for directory in args.directories:  # a segment file: the recording of that one file
        if not (directory.is_dir() or directory.name.endswith(".seg") and directory.is_file()):
            print(f"rmqhb scan: not a recording directory or segment file (*.seg): {directory}", file=sys.stderr)
            return EXIT_USAGE
        if not directory.is_dir():
            other = parents.setdefault(directory.resolve().parent, directory)
            if other != directory:
                print(f"rmqhb scan: {other} and {directory} are segments of one recording: give its directory "
                      f"({directory.parent}) to scan it whole", file=sys.stderr)
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
        plan = plans[name] = plan_splits(directory, args.split_records)
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
        from .analyses import scan

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
        if args.debug or os.environ.get("RMQHB_DEBUG") or isinstance(e, session.JavaUnavailable):
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
