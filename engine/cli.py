"""`rmqhb` (also `python -m engine`): the command line of the engine.

Subcommands are registered in COMMANDS; each takes its own argv so that modules stay independent.
"""
import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def default_vectors_dir() -> Path:
    from .vectors import shared_dir

    return shared_dir() / "vectors"


def _iter_captures(vectors: Path):
    for index_path in sorted(vectors.glob("*/index.json")):
        index = json.loads(index_path.read_text())
        stream = b"".join((index_path.parent / e["file"]).read_bytes() for e in index["frames"])
        yield index["client"], index["frames"], stream


def demo_main(argv=None) -> int:
    """The main job: decode the real-client captures as a broker would and print what they contain."""
    import engine

    p = argparse.ArgumentParser(prog="rmqhb demo", description=demo_main.__doc__)
    p.add_argument("--vectors", type=Path, default=default_vectors_dir(), help="captures directory")
    args = p.parse_args(argv)
    if not args.vectors.is_dir():
        print(f"no captures at {args.vectors} (set ENGINE_SHARED_DIR or --vectors)", file=sys.stderr)
        return 2
    print(f"engine.NATIVE = {engine.NATIVE}  (captures: {args.vectors})")
    for client, frames, stream in _iter_captures(args.vectors):
        decoder = engine.FrameDecoder()
        t0 = time.perf_counter()
        commands = []
        for i in range(0, len(stream), 1500):  # feed in MTU-sized chunks, like a socket would
            commands.extend(decoder.feed(stream[i : i + 1500]))
        elapsed = time.perf_counter() - t0
        assert len(commands) == len(frames) and decoder.buffered == 0
        codes = Counter(engine.RequestCode(c.code).name if c.code in engine.RequestCode._value2member_map_ else str(c.code) for c in commands)
        print(f"\n== {client}: {len(commands)} frames, {len(stream)} bytes, streamed in {elapsed * 1e3:.2f} ms")
        print("   requests: " + ", ".join(f"{name} x{n}" for name, n in codes.most_common()))
        langs = Counter(c.language.name if c.language is not None else "?" for c in commands)
        versions = Counter(c.version for c in commands)
        print(f"   languages: {dict(langs)}  versions: {dict(versions)}")
        seen = set()
        for c in commands:
            if c.code != engine.RequestCode.HEART_BEAT:
                continue
            hb = engine.decode_heartbeat(c.body)
            key = (hb.client_id, tuple(p.group for p in hb.producers), tuple(x.group for x in hb.consumers))
            if key in seen:
                continue
            seen.add(key)
            print(f"   heartbeat from {hb.client_id}: producers {[p.group for p in hb.producers]}")
            for cd in hb.consumers:
                model = cd.message_model.name if cd.message_model is not None else None
                ctype = cd.consume_type.name if cd.consume_type is not None else None
                print(f"     consumer {cd.group} ({ctype}, {model})")
                for s in cd.subscriptions:
                    print(f"       {s.topic}: {s.sub_string!r} tags={list(s.tags)} type={s.expression_type}")
        for c in commands:
            if c.code == engine.RequestCode.UNREGISTER_CLIENT:
                ext = c.ext_fields or {}
                print(f"   unregister {ext.get('clientID')}: producer={ext.get('producerGroup')!r} consumer={ext.get('consumerGroup')!r}")
    return 0


COMMANDS = {
    "demo": demo_main,
    # the broker front end (engine/broker.py, engine/admin.py), imported only when used
    "serve": lambda argv: __import__("engine.broker", fromlist=["serve_main"]).serve_main(argv),
    "consumerConnection": lambda argv: __import__("engine.admin", fromlist=["x"]).consumer_connection_main(argv),
    "producerConnection": lambda argv: __import__("engine.admin", fromlist=["x"]).producer_connection_main(argv),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: rmqhb {" + ",".join(COMMANDS) + "} [args]  (rmqhb CMD -h for help)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
