"""`rmqhb` (also `python -m engine`): the command line of the engine.

Subcommands are registered in COMMANDS; each takes its own argv so that modules stay independent.
"""
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def default_vectors_dir() -> Path:
    from engine.codec.vectors import shared_dir

    return shared_dir() / "vectors"


def capture_summary(vectors: Path) -> None:
    """Stream each capture through a FrameDecoder as a socket would and print what the clients sent."""
    import engine

    for index_path in sorted(vectors.glob("*/index.json")):
        index = json.loads(index_path.read_text())
        stream = b"".join((index_path.parent / e["file"]).read_bytes() for e in index["frames"])
        decoder = engine.FrameDecoder()
        t0 = time.perf_counter()
        commands = []
        for i in range(0, len(stream), 1500):  # MTU-sized chunks
            commands.extend(decoder.feed(stream[i : i + 1500]))
        elapsed = time.perf_counter() - t0
        assert len(commands) == len(index["frames"]) and decoder.buffered == 0
        names = {c.value: c.name for c in engine.RequestCode}
        codes = Counter(names.get(c.code, str(c.code)) for c in commands)
        print(f"== {index['client']}: {len(commands)} frames, {len(stream)} bytes, streamed in {elapsed * 1e3:.2f} ms")
        print("   requests: " + ", ".join(f"{name} x{n}" for name, n in codes.most_common()))
        langs = Counter(c.language.name if c.language is not None else "?" for c in commands)
        print(f"   languages: {dict(langs)}  versions: {dict(Counter(c.version for c in commands))}")
        seen = set()
        for c in commands:
            if c.code == engine.RequestCode.HEART_BEAT:
                hb = engine.decode_heartbeat(c.body)
                key = (hb.client_id, tuple(p.group for p in hb.producers), tuple(x.group for x in hb.consumers))
                if key in seen:
                    continue
                seen.add(key)
                print(f"   heartbeat from {hb.client_id}: producers {[p.group for p in hb.producers]}")
                for cd in hb.consumers:
                    ctype = cd.consume_type.name if cd.consume_type is not None else None
                    model = cd.message_model.name if cd.message_model is not None else None
                    print(f"     consumer {cd.group} ({ctype}, {model})")
                    for s in cd.subscriptions:
                        print(f"       {s.topic}: {s.sub_string!r} tags={list(s.tags)} type={s.expression_type}")
            elif c.code == engine.RequestCode.UNREGISTER_CLIENT:
                ext = c.ext_fields or {}
                print(f"   unregister {ext.get('clientID')}: producer={ext.get('producerGroup')!r} "
                      f"consumer={ext.get('consumerGroup')!r}")


def _lazy(module: str, func: str):
    """A subcommand whose module is imported only when it runs (Spark, the server...)."""
    return lambda argv: getattr(__import__(module, fromlist=[func]), func)(argv)


#: what `rmqhb scan` needs beyond the engine: the spark extra
SCAN_DEPENDENCIES = ("pyspark", "pyarrow", "pandas")


def scan_main(argv) -> int:
    """`rmqhb scan`: a missing Spark dependency is one line naming the extra to install, not a traceback."""
    import importlib.util

    missing = [m for m in SCAN_DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        print(f"rmqhb scan needs the spark extra (missing: {', '.join(missing)}): "
              f"pip install 'rocketmq-heartbeat-engine[spark]'", file=sys.stderr)
        return 2
    # what the scan prints comes from files and clients: no ESC or other control character reaches the terminal
    from engine.logutil import EscapedWriter

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedWriter(out), EscapedWriter(err)
    try:
        return _lazy("engine.bindings.cli", "cli_main")(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def segments_main(argv) -> int:
    """`rmqhb segments verify PATH`: PATH a recording directory or one of its segment files."""
    if not argv or argv[0] != "verify":
        print("usage: rmqhb segments verify PATH [-v] [--json]  (PATH: a recording directory or a .seg file)",
              file=sys.stderr)
        return 2
    rest = argv[1:]
    paths = [a for a in rest if not a.startswith("-")]
    if len(paths) == 1 and not any(a in ("-h", "--help") for a in rest):
        path = Path(paths[0])
        if not path.exists():
            print(f"rmqhb segments verify: no such file or directory: {path}", file=sys.stderr)
            return 2
        if path.is_dir() and not any(path.glob("*.seg")):
            print(f"rmqhb segments verify: no recording in {path} (no *.seg segment files)", file=sys.stderr)
            return 2
        if not path.is_dir():
            if not path.is_file() or not path.name.endswith(".seg"):
                print(f"rmqhb segments verify: {path} is neither a recording directory nor a segment file (*.seg)",
                      file=sys.stderr)
                return 2
            return verify_segment_file(path, verbose="-v" in rest or "--verbose" in rest, as_json="--json" in rest)
    return _lazy("engine.recording.recorder", "segments_verify_main")(rest)


def verify_segment_file(path: Path, verbose: bool, as_json: bool) -> int:
    """`rmqhb segments verify FILE.seg`: the directory's check on one segment (same report, same exit status)."""
    from engine.recording.recorder import VerifyReport, scan_segment

    report = VerifyReport(path.parent)
    report.segments.append(scan_segment(path, check_payload=True))
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.format(verbose=verbose))
    return 0 if report.ok else 1


def loadgen_main(argv) -> int:
    """`rmqhb loadgen`: ``--protocol grpc`` is the 5.x load generator (engine.loadgen_grpc, its own options), else the
    remoting one (engine.loadgen)."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--protocol", default="remoting")
    grpc = pre.parse_known_args(argv)[0].protocol == "grpc"
    return _lazy("engine.loadgen_grpc" if grpc else "engine.loadgen", "main")(argv)


COMMANDS = {
    "demo": _lazy("engine.demo", "demo_main"),
    "serve": _lazy("engine.broker.controller", "serve_main"),
    "consumerConnection": _lazy("engine.broker.admin", "consumer_connection_main"),
    "producerConnection": _lazy("engine.broker.admin", "producer_connection_main"),
    "updateTopic": _lazy("engine.broker.admin", "update_topic_main"),
    "segments": segments_main,
    "generate": _lazy("engine.recording.synth", "generate_main"),
    "scan": scan_main,
    "loadgen": loadgen_main,
}

#: one line per command for `rmqhb --help`
SUMMARIES = {
    "demo": "the whole story on this machine: a broker, a simulated fleet, recordings and their scan",
    "serve": "the broker front end: RocketMQ client management on the remoting port (and 5.x gRPC)",
    "consumerConnection": "mqadmin consumerConnection: a consumer group's clients and subscriptions, over the wire",
    "producerConnection": "mqadmin producerConnection: a producer group's clients, over the wire",
    "updateTopic": "mqadmin updateTopic: create or update a topic on one broker (UPDATE_AND_CREATE_TOPIC)",
    "segments": "segments verify DIR: check a heartbeat recording",
    "generate": "write a synthetic recording (or broker logs) with injected anomalies and a manifest",
    "scan": "what the clients did, from a recording, broker logs or packet captures: an HTML/JSON/CSV report",
    "loadgen": "simulated clients heartbeating any RocketMQ broker (--broker HOST:PORT; --protocol grpc: 5.x SDKs)",
}

#: `rmqhb` exit statuses common to every command (each command documents its own beside these)
EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: rmqhb COMMAND [args]   (rmqhb COMMAND -h: the command's options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {SUMMARIES[name]}" for name in COMMANDS]
    lines += ["", "--debug (any command): show the whole error (Python and Java stacks) on a failure",
              "exit status: 0 done; 2 a bad command line (serve: mqbroker's 253 / 255); 130 interrupted (Ctrl-C); "
              "the others: rmqhb COMMAND -h"]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return EXIT_USAGE
    if argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        from engine.logutil import escape_text

        print(f"rmqhb: unknown command {escape_text(name)!r}; the commands are {', '.join(COMMANDS)} "
              "(rmqhb --help)", file=sys.stderr)
        return EXIT_USAGE
    debug = "--debug" in rest or bool(os.environ.get("RMQHB_DEBUG"))
    if debug:  # every command takes it: the flag is read here and passed on in the environment
        rest = [a for a in rest if a != "--debug"]
        os.environ["RMQHB_DEBUG"] = "1"
    try:
        return COMMANDS[name](rest) or 0
    except KeyboardInterrupt:
        if debug:
            raise
        return interrupted(name)
    except Exception as e:  # a bug or an environment failure: one line of our own, the stack with --debug
        if debug:
            raise
        from engine.logutil import escape_text

        detail = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        print(f"rmqhb {name}: failed: {type(e).__name__}{': ' + escape_text(detail[:300]) if detail else ''} "
              "(--debug shows where)", file=sys.stderr)
        return EXIT_FAILED


def interrupted(name: str, what: str = "") -> int:
    """Ctrl-C: one line and status 130 (128 + SIGINT, as shells report it)."""
    lead = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C (or a progress line)
    print(f"{lead}rmqhb {name}: interrupted{what}", file=sys.stderr)
    return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
