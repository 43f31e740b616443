"""`rmqhb` (also `python -m engine`): the command line of the engine.

Subcommands are registered in COMMANDS; each takes its own argv so that modules stay independent.
"""
import json
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
SCAN_DEPENDENCIES = ("pyspark", "pyarrow", "pandas", "matplotlib")


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
        return _lazy("engine.bindings.spark", "scan_main")(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def segments_main(argv) -> int:
    if not argv or argv[0] != "verify":
        print("usage: rmqhb segments verify DIR [-v] [--json]", file=sys.stderr)
        return 2
    return _lazy("engine.recording.recorder", "segments_verify_main")(argv[1:])


COMMANDS = {
    "demo": _lazy("engine.demo", "demo_main"),
    "serve": _lazy("engine.broker.controller", "serve_main"),
    "consumerConnection": _lazy("engine.broker.admin", "consumer_connection_main"),
    "producerConnection": _lazy("engine.broker.admin", "producer_connection_main"),
    "segments": segments_main,
    "generate": _lazy("engine.recording.synth", "generate_main"),
    "scan": scan_main,
    "loadgen": _lazy("engine.loadgen", "main"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: rmqhb {" + ",".join(COMMANDS) + "} [args]  (rmqhb CMD -h for help)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
