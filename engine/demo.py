"""`rmqhb demo`: the whole story on one machine, with embedded defaults and nothing to configure.

1. decode the real-client captures (../shared/vectors) the way a broker does, and summarise them;
2. start an embedded broker on loopback with the heartbeat recorder on, drive a small simulated fleet against it
   (heartbeats, a second consumer joining -> NOTIFY, a client with a different subscription, a flapping client,
   unregisters), and show the consumer connection over the wire as `mqadmin consumerConnection` would;
3. generate a larger synthetic recording with injected anomalies;
4. scan both recordings with Spark and point to the report (findings.json, CSV, SVG plots, index.html).
"""
import argparse
import asyncio
import contextlib
import logging
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

from engine import ConsumeFromWhere, ConsumeType, ConsumerData, HeartbeatData, MessageModel, ProducerData
from engine import RemotingCommand, RequestCode, build_subscription, encode_heartbeat


class FleetClient:
    """One simulated client instance: one connection, the heartbeat of MQClientInstance, NOTIFY counting."""

    def __init__(self, client_id, group, topics, expression="*", producer="PID_demo"):
        subs = tuple(build_subscription(t, expression, sub_version=int(time.time() * 1000)) for t in topics)
        consumer = ConsumerData(group, consume_type=ConsumeType.CONSUME_PASSIVELY,
                                message_model=MessageModel.CLUSTERING,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, subscriptions=subs)
        self.client_id, self.group, self.producer = client_id, group, producer
        self.heartbeat = HeartbeatData(client_id=client_id, producers=(ProducerData(producer),), consumers=(consumer,))
        self.body = encode_heartbeat(self.heartbeat)
        self.notifies = 0
        self.opaque = 0
        self.reader = self.writer = None

    async def connect(self, port):
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    async def request(self, code, ext_fields=None, body=b""):
        self.opaque += 1
        self.writer.write(RemotingCommand(code, opaque=self.opaque, ext_fields=ext_fields or {}, body=body).encode())
        while True:  # NOTIFY_CONSUMER_IDS_CHANGED (oneway) may arrive before our answer
            from engine import decode_frame

            head = await self.reader.readexactly(4)
            frame = head + await self.reader.readexactly(struct.unpack(">i", head)[0])
            cmd = decode_frame(frame)
            if not cmd.is_response:
                self.notifies += cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
                continue
            return cmd

    async def send_heartbeat(self):
        resp = await self.request(RequestCode.HEART_BEAT, body=self.body)
        assert resp.code == 0, resp

    async def shutdown(self):
        for ext in ({"clientID": self.client_id, "consumerGroup": self.group},
                    {"clientID": self.client_id, "producerGroup": self.producer}):
            await self.request(RequestCode.UNREGISTER_CLIENT, ext)
        self.writer.close()


async def drive_fleet(port, rounds=5, clients_per_group=4, groups=3):
    """A small fleet: steady heartbeats, a late joiner, a deviating subscription, a flapping client."""
    fleet = [FleetClient(f"127.0.0.1@demo{g}-{i}", f"CID_demo_{g}", [f"Topic{g}"], "TagA || TagB")
             for g in range(groups) for i in range(clients_per_group)]
    odd = FleetClient("127.0.0.1@demo-odd", "CID_demo_0", ["Topic0", "TopicExtra"], "*")  # inconsistent member
    flapper = FleetClient("127.0.0.1@demo-flap", "CID_demo_1", ["Topic1"], "TagA || TagB")
    for c in fleet:
        await c.connect(port)
    for r in range(rounds):
        if r == 1:
            await odd.connect(port)
            fleet.append(odd)
        await asyncio.gather(*(c.send_heartbeat() for c in fleet))
        await flapper.connect(port)  # connect, heartbeat, drop: every round
        await flapper.send_heartbeat()
        flapper.writer.close()
        await asyncio.sleep(0.2)
    return fleet


def _section(title):
    print(f"\n{'=' * 8} {title} {'=' * (60 - len(title))}")


def demo_main(argv=None) -> int:
    """Run the whole story: captures, live broker + fleet + recorder, synthetic recording, Spark scan."""
    import engine

    from .cli import capture_summary, default_vectors_dir

    p = argparse.ArgumentParser(prog="rmqhb demo", description=demo_main.__doc__)
    p.add_argument("--vectors", type=Path, default=default_vectors_dir(), help="real-client captures")
    p.add_argument("--work", type=Path, default=None, help="working directory (default: a new temp dir)")
    p.add_argument("--records", type=int, default=2_000_000, help="heartbeats in the synthetic recording")
    p.add_argument("--no-spark", action="store_true", help="stop before the Spark scan")
    args = p.parse_args(argv)
    if not args.no_spark:  # what step 4 needs, checked before steps 1-3 run for minutes
        missing = _spark_missing()
        if missing:
            print(f"rmqhb demo: {missing} (or run `rmqhb demo --no-spark`)", file=sys.stderr)
            return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="rmqhb-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    # the one place the demo names its directory; everything it writes stays under it and is kept afterwards
    print(f"engine.NATIVE = {engine.NATIVE}; working directory {work} (kept afterwards; --work DIR chooses it)")

    _section("1. real-client captures")
    if args.vectors.is_dir():
        capture_summary(args.vectors)
    else:
        print(f"(no captures at {args.vectors}; set ENGINE_SHARED_DIR to show them)")

    _section("2. live broker, simulated fleet, recorder")
    from engine.recording.recorder import verify

    live = work / "live-recording"
    cfg = engine.BrokerConfig(listen_port=0, store_path_root_dir=str(work / "store"), record_dir=str(live))
    with _broker_log(work / "broker.log") as log_lines:
        broker = engine.Broker(cfg).start()
        try:
            port = broker.ports["main"]
            print(f"broker listening on 127.0.0.1:{port} (fast port {broker.ports.get('fast')})")
            asyncio.run(_run_fleet(port))
        finally:
            broker.stop()
    print(f"broker log: {log_lines()} lines in broker.log (the broker's own lines, kept out of this output)")
    print(f"recorder: {verify(live).format()}")

    _section("3. synthetic recording with injected anomalies")
    from engine.recording.synth import FleetConfig, generate

    synth_dir = work / "synthetic-recording"
    clients, interval = 2000, 30.0
    t0 = time.perf_counter()
    manifest = generate(synth_dir, FleetConfig(clients=clients, groups=100, days=args.records * interval / clients / 86400,
                                               interval_s=interval), progress=True)
    el = time.perf_counter() - t0
    print(f"{manifest['records']:,} heartbeats in {el:.1f} s -> {synth_dir.name}/")
    for kind, items in manifest["anomalies"].items():
        print(f"  injected {kind}: {len(items)}")

    if args.no_spark:
        _files_left(work)
        return 0
    _section("4. Spark scan")
    from engine.bindings.cli import cli_main as scan_main  # Ctrl-C while Spark runs: one line, 130
    from engine.recording.synth import compare_with_manifest
    import json

    out = work / "report"
    rc = scan_main([str(synth_dir), "--out", str(out)])
    if rc:
        return rc
    findings = json.loads((out / "findings.json").read_text())
    problems = compare_with_manifest(findings, manifest)
    print("scan vs injected anomalies: " + ("exact match" if not problems else f"{len(problems)} differences"))
    for line in problems[:10]:
        print("  " + line)
    _files_left(work)  # the scan printed the report's path
    return 0 if not problems else 1


def _spark_missing():
    """Why the Spark scan cannot run here (one line: the spark extra, Java 17), or None."""
    import importlib.util

    from .cli import SCAN_DEPENDENCIES

    missing = [m for m in SCAN_DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        return (f"the scan needs the spark extra (missing: {', '.join(missing)}): "
                "pip install 'rocketmq-heartbeat-engine[spark]'")
    from engine.bindings.session import java_problem

    return java_problem()


def _files_left(work: Path) -> None:
    size = sum(f.stat().st_size for f in work.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"\nthe working directory above holds {size / 1e6:.0f} MB (recordings, broker store and log"
          f"{', report' if (work / 'report').is_dir() else ''}); remove it when done")


@contextlib.contextmanager
def _broker_log(path: Path):
    """The embedded broker logs into ``path`` (opened without following a symlink), not between the demo's lines.
    Yields a function counting the lines written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    stream = os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lambda: path.read_bytes().count(b"\n")
    finally:
        root.removeHandler(handler)
        stream.close()


async def _run_fleet(port):
    from engine.broker.admin import AdminClient, format_consumer_connection

    t0 = time.perf_counter()
    fleet = await drive_fleet(port)
    print(f"{len(fleet)} clients heartbeated for 5 rounds in {time.perf_counter() - t0:.2f} s; "
          f"NOTIFY_CONSUMER_IDS_CHANGED received: {sum(c.notifies for c in fleet)} "
          "(the member with a different topic set flips the group's subscription table on every heartbeat)")

    def query():
        with AdminClient("127.0.0.1", port) as admin:
            return format_consumer_connection(admin.consumer_connection("CID_demo_0"))

    print(f"\n$ rmqhb consumerConnection -g CID_demo_0 -b 127.0.0.1:{port}\n" + await asyncio.to_thread(query))
    for c in fleet:
        await c.shutdown()
