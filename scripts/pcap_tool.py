"""Derived test captures from a clean capture (tests/data/pcap/README.md says which file came from which command).

    pcap_tool.py pcapng IN.pcap OUT.pcapng [--big-endian] [--nanos]    the same packets as pcapng (SHB, IDB, EPBs)
    pcap_tool.py split IN.pcap OUTDIR --packets N                      rotated files as tcpdump -C names them
    pcap_tool.py mutate IN.pcap OUT.pcap --port P --size S [ops]       damage one connection's client->server bytes
    pcap_tool.py from-recording REC_DIR OUT.pcap                       a recording's heartbeats as the capture of
                                                                       the broker's port would show them
    pcap_tool.py relink IN.pcap OUT.pcap --link raw|ipv4|null|loop|vlan  the same IP packets under another link
                                                                       layer (raw IP 101 / 228-229, BSD loopback
                                                                       0 / 108, Ethernet with an 802.1Q tag)

``mutate`` cuts every data packet the client on port P sends into segments of S payload bytes (sequence numbers,
IP lengths and capture lengths adjusted; checksums are not recomputed, the reader does not check them) and then,
by index i of those segments (0 = the first data segment of that direction):

    --drop i        the segment is not in the output (the capture missed it)
    --swap i        segment i comes after segment i+1 (out of order)
    --dup i         segment i twice in a row (a retransmission)
    --overlap i     after segment i+1, one packet holding segments i and i+1 again (a partial-overlap retransmission)
    --late i:k      segment i comes k packets later (any packets), keeping its own time stamp
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": ("<", False), b"\xa1\xb2\xc3\xd4": (">", False),
               b"\x4d\x3c\xb2\xa1": ("<", True), b"\xa1\xb2\x3c\x4d": (">", True)}


def read_pcap(path):
    """(header bytes, endianness, nanos, link type, [(sec, frac, orig_len, data)])."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        import gzip

        raw = gzip.decompress(raw)
    e, nano = PCAP_MAGICS[raw[:4]]
    link = struct.unpack_from(e + "I", raw, 20)[0] & 0xFFFF
    pos, out = 24, []
    while pos + 16 <= len(raw):
        sec, frac, incl, orig = struct.unpack_from(e + "IIII", raw, pos)
        out.append((sec, frac, orig, raw[pos + 16:pos + 16 + incl]))
        pos += 16 + incl
    return raw[:24], e, nano, link, out


def write_pcap(path, header, e, packets):
    with open(path, "wb") as f:
        f.write(header)
        for sec, frac, orig, data in packets:
            f.write(struct.pack(e + "IIII", sec, frac, len(data), orig) + data)


def ip_offset(link, data):
    if link == 1:
        off, etype = 14, struct.unpack_from(">H", data, 12)[0]
        while etype in (0x8100, 0x88A8):
            etype = struct.unpack_from(">H", data, off + 2)[0]
            off += 4
        return off
    if link == 113:
        return 16
    if link == 276:
        return 20
    if link in (101, 228, 229):
        return 0
    raise SystemExit(f"link type {link} not supported by this tool")


def tcp_parts(link, data):
    """(ip offset, version, ip header length, tcp offset, tcp header length, sport, dport, seq, payload)."""
    ip = ip_offset(link, data)
    v = data[ip] >> 4
    if v == 4:
        ihl = (data[ip] & 15) * 4
        if data[ip + 9] != 6:
            return None
        total = struct.unpack_from(">H", data, ip + 2)[0]
        end = ip + total
    elif v == 6:
        ihl = 40
        if data[ip + 6] != 6:
            return None
        end = ip + 40 + struct.unpack_from(">H", data, ip + 4)[0]
    else:
        return None
    t = ip + ihl
    sport, dport, seq = struct.unpack_from(">HHI", data, t)
    thl = (data[t + 12] >> 4) * 4
    return ip, v, ihl, t, thl, sport, dport, seq, data[t + thl:end]


def rebuild(link, data, parts, seq, payload):
    ip, v, ihl, t, thl = parts[:5]
    head = bytearray(data[:t + thl])
    struct.pack_into(">I", head, t + 4, seq & 0xFFFFFFFF)
    if v == 4:
        struct.pack_into(">H", head, ip + 2, ihl + thl + len(payload))
    else:
        struct.pack_into(">H", head, ip + 4, thl + len(payload))
    return bytes(head) + payload


def mutate(args):
    header, e, nano, link, packets = read_pcap(args.input)
    out = []  # (sec, frac, orig, data)
    seg_index = 0
    held = {}  # index -> packet waiting for its op
    late = []  # [remaining packets, packet]
    drop, swap, dup, overlap = set(args.drop), set(args.swap), set(args.dup), set(args.overlap)
    late_ops = dict(tuple(int(x) for x in s.split(":")) for s in args.late)

    def emit(pkt):
        out.append(pkt)
        for item in late[:]:
            item[0] -= 1
            if item[0] <= 0:
                late.remove(item)
                out.append(item[1])

    for sec, frac, orig, data in packets:
        parts = tcp_parts(link, data)
        if parts is None or parts[5] != args.port or not parts[8]:
            emit((sec, frac, orig, data))
            continue
        payload, seq = parts[8], parts[7]
        for k in range(0, len(payload), args.size):
            piece = payload[k:k + args.size]
            new = rebuild(link, data, parts, seq + k, piece)
            pkt = (sec, frac, len(new), new)
            i = seg_index
            seg_index += 1
            if i in drop:
                continue
            if i in late_ops:
                late.append([late_ops[i], pkt])
                continue
            if i in swap:
                held[i] = pkt
                continue
            emit(pkt)
            if i in dup:
                emit(pkt)
            if i - 1 in swap and i - 1 in held:
                emit(held.pop(i - 1))
            if i - 1 in overlap:
                both = payload[k - args.size:k + args.size] if k >= args.size else None
                if both is not None:
                    new2 = rebuild(link, data, parts, seq + k - args.size, both)
                    emit((sec, frac, len(new2), new2))
    for item in late:
        out.append(item[1])
    out.extend(held.values())
    write_pcap(args.output, header, e, out)
    print(f"{args.output}: {len(out)} packets, {seg_index} segments of port {args.port}")


def from_recording(args):
    """Every record of a recording (engine.recording.recorder) as a heartbeat request on its connection: one TCP connection
    per conn_id from the record's address to 10.255.255.254:10911 (SYN handshake before its first heartbeat, FIN
    after its last), each heartbeat answered by the broker's SUCCESS and ACKed, Ethernet, time = receive time.
    ``--keep-open-after S``: no FIN for a connection whose last heartbeat is its client's last for more than S
    seconds (or for good): the client went silent with its connection open, as a recording's expiry assumes
    (the capture then shows the expiry; a FIN 1 ms after the last heartbeat is a clean close, no expiry)."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine import decode_heartbeat
    from engine.recording.recorder import iter_records

    records = sorted(iter_records(args.input), key=lambda r: (r.recv_ms, r.conn_id))
    last = {r.conn_id: i for i, r in enumerate(records)}
    keep_open = set()
    if args.keep_open_after is not None:
        limit = int(round(args.keep_open_after * 1000))
        times = {}  # client -> its heartbeat times (any connection)
        client_of = {}
        for r in records:
            try:
                cid = decode_heartbeat(r.body).client_id
            except ValueError:
                cid = None
            client_of[r.conn_id] = cid
            times.setdefault(cid, []).append(r.recv_ms)
        import bisect

        for conn, i in last.items():
            cid, t = client_of[conn], records[i].recv_ms
            ts = times.get(cid, [])
            k = bisect.bisect_right(ts, t)
            if cid is not None and (k == len(ts) or ts[k] - t > limit):
                keep_open.add(conn)
    server = (bytes([10, 255, 255, 254]), 10911)
    ok = _frame(b'{"code":0,"extFields":{},"flag":1,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON",'
                b'"version":479}', b"")
    conns = {}
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]

    def emit(us, data):
        out.append(struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(data), len(data)) + data)

    for i, r in enumerate(records):
        us = r.recv_ms * 1000
        c = conns.get(r.conn_id)
        if c is None:
            host, port = r.remote_addr.rsplit(":", 1)
            ip = bytes(int(x) for x in host.split("."))
            c = conns[r.conn_id] = [ip, int(port), 1000 + len(conns) * 7919, 50000 + len(conns) * 104729]
            emit(us - 3, _tcp(c[0], c[1], *server, c[2], 0, 0x02))
            emit(us - 2, _tcp(*server, c[0], c[1], c[3], c[2] + 1, 0x12))
            emit(us - 1, _tcp(c[0], c[1], *server, c[2] + 1, c[3] + 1, 0x10))
            c[2] += 1
            c[3] += 1
        lang = "null" if r.language is None else f'"{r.language.name}"'
        head = (f'{{"code":34,"extFields":{{}},"flag":0,"language":{lang},"opaque":{i},'
                f'"serializeTypeCurrentRPC":"JSON","version":{r.version}}}').encode()
        req = _frame(head, r.body)
        emit(us, _tcp(c[0], c[1], *server, c[2], c[3], 0x18, req))
        c[2] += len(req)
        emit(us, _tcp(*server, c[0], c[1], c[3], c[2], 0x18, ok))
        c[3] += len(ok)
        emit(us, _tcp(c[0], c[1], *server, c[2], c[3], 0x10))
        if last[r.conn_id] == i and r.conn_id not in keep_open:
            emit(us + 1, _tcp(c[0], c[1], *server, c[2], c[3], 0x11))
            emit(us + 1, _tcp(*server, c[0], c[1], c[3], c[2] + 1, 0x11))
            emit(us + 1, _tcp(c[0], c[1], *server, c[2] + 1, c[3] + 1, 0x10))
            del conns[r.conn_id]
    Path(args.output).write_bytes(b"".join(out))
    print(json.dumps({"output": str(args.output), "records": len(records), "connections": len(last),
                      "left_open": len(keep_open)}))


def write_script(path, steps) -> None:
    """A capture of scripted connections to 10.255.255.254:10911, Ethernet, in the order given: steps are
    ``(ms, "ip:port", kind, arg)`` with kind ``hb`` (arg: the HeartbeatData body; answered SUCCESS),
    ``unregister`` (arg: (clientID, producerGroup, consumerGroup), None for absent; answered SUCCESS), ``fin`` or
    ``rst`` (arg: "client" or "server", the side that sends it), ``missed`` (arg: a HeartbeatData body: the request
    and its answer the capture missed, their bytes skipped), ``half_close`` (arg: None: the server's FIN alone,
    ACKed; the client may go on sending on the half-closed connection, its requests only ACKed; a later ``fin``
    by the client ends it with the client's FIN and the server's ACK). A connection's SYN handshake precedes its
    first step; a FIN is answered by the other side's FIN and the ACK."""
    import json

    server = (bytes([10, 255, 255, 254]), 10911)
    ok = _frame(b'{"code":0,"extFields":{},"flag":1,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON",'
                b'"version":479}', b"")
    conns, out = {}, [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]

    def emit(us, data):
        out.append(struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(data), len(data)) + data)

    for n, (ms, addr, kind, arg) in enumerate(steps):
        us = ms * 1000
        c = conns.get(addr)
        if c is None:
            host, port = addr.rsplit(":", 1)
            c = conns[addr] = [bytes(int(x) for x in host.split(".")), int(port), 1000 + len(conns) * 7919,
                               50000 + len(conns) * 104729, False]  # [4]: the server sent its FIN
            emit(us, _tcp(c[0], c[1], *server, c[2], 0, 0x02))
            emit(us, _tcp(*server, c[0], c[1], c[3], c[2] + 1, 0x12))
            emit(us, _tcp(c[0], c[1], *server, c[2] + 1, c[3] + 1, 0x10))
            c[2] += 1
            c[3] += 1
        cli, srv = (c[0], c[1]), server
        if kind == "missed":  # a heartbeat request and its answer the capture missed: sequence numbers move on
            c[2] += len(_frame(b'{"code":34,"extFields":{},"flag":0,"language":"JAVA","opaque":0,'
                               b'"serializeTypeCurrentRPC":"JSON","version":479}', arg))
            c[3] += len(ok)
        elif kind in ("hb", "unregister"):
            if kind == "hb":
                code, ext, body = 34, {}, arg
            else:
                code, body = 35, b""
                ext = {k: v for k, v in zip(("clientID", "producerGroup", "consumerGroup"), arg) if v is not None}
            head = json.dumps({"code": code, "extFields": ext, "flag": 0, "language": "JAVA", "opaque": n,
                               "serializeTypeCurrentRPC": "JSON", "version": 479}, separators=(",", ":")).encode()
            req = _frame(head, body)
            emit(us, _tcp(*cli, *srv, c[2], c[3], 0x18, req))
            c[2] += len(req)
            if c[4]:  # half-closed by the server: no answer
                emit(us, _tcp(*srv, *cli, c[3], c[2], 0x10))
                continue
            emit(us, _tcp(*srv, *cli, c[3], c[2], 0x18, ok))
            c[3] += len(ok)
            emit(us, _tcp(*cli, *srv, c[2], c[3], 0x10))
        elif kind == "half_close":
            emit(us, _tcp(*srv, *cli, c[3], c[2], 0x11))
            c[3] += 1
            emit(us, _tcp(*cli, *srv, c[2], c[3], 0x10))
            c[4] = True
        elif kind == "fin" and c[4]:
            if arg != "client":
                raise ValueError("a connection the server half-closed ends by the client's FIN")
            emit(us, _tcp(*cli, *srv, c[2], c[3], 0x11))
            emit(us, _tcp(*srv, *cli, c[3], c[2] + 1, 0x10))
            del conns[addr]
        elif kind == "fin":
            a, b, sa, sb = (cli, srv, 2, 3) if arg == "client" else (srv, cli, 3, 2)
            emit(us, _tcp(*a, *b, c[sa], c[sb], 0x11))
            emit(us, _tcp(*b, *a, c[sb], c[sa] + 1, 0x11))
            emit(us, _tcp(*a, *b, c[sa] + 1, c[sb] + 1, 0x10))
            del conns[addr]
        elif kind == "rst":
            a, b, sa, sb = (cli, srv, 2, 3) if arg == "client" else (srv, cli, 3, 2)
            emit(us, _tcp(*a, *b, c[sa], c[sb], 0x14))
            del conns[addr]
        else:
            raise ValueError(f"unknown step kind {kind!r}")
    Path(path).write_bytes(b"".join(out))


def _frame(header: bytes, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def _tcp(src, sport, dst, dport, seq, ack, flags, payload=b""):
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
    return b"\0" * 12 + b"\x08\x00" + ip + tcp + payload


def relink(args):
    header, e, nano, link, packets = read_pcap(args.input)
    out = []
    new_link = {"raw": 101, "ipv4": 228, "null": 0, "loop": 108, "vlan": 1}[args.link]
    for sec, frac, orig, data in packets:
        ip = data[ip_offset(link, data):]
        v = ip[0] >> 4
        if args.link in ("raw", "ipv4"):
            new = ip
            if args.link == "ipv4" and v != 4:
                raise SystemExit("--link ipv4 needs an IPv4 capture")
        elif args.link == "null":  # the capturing host's byte order (little-endian here), AF_INET 2 / AF_INET6 30
            new = struct.pack("<I", 2 if v == 4 else 30) + ip
        elif args.link == "loop":  # network byte order
            new = struct.pack(">I", 2 if v == 4 else 30) + ip
        else:
            new = b"\0" * 12 + struct.pack(">HHH", 0x8100, 42, 0x0800 if v == 4 else 0x86DD) + ip
        out.append((sec, frac, orig - len(data) + len(new), new))
    header = header[:20] + struct.pack(e + "I", new_link)
    write_pcap(args.output, header, e, out)
    print(f"{args.output}: {len(out)} packets, link type {new_link}")


def to_pcapng(args):
    header, e, nano, link, packets = read_pcap(args.input)
    o = ">" if args.big_endian else "<"

    def block(btype, body):
        body += b"\0" * (-len(body) % 4)
        n = len(body) + 12
        return struct.pack(o + "II", btype, n) + body + struct.pack(o + "I", n)

    res = 9 if args.nanos else 6
    out = [block(0x0A0D0D0A, struct.pack(o + "IHHq", 0x1A2B3C4D, 1, 0, -1)),
           block(1, struct.pack(o + "HHI", link, 0, 262144) + struct.pack(o + "HHB3x", 9, 1, res) + b"\0" * 4)]
    for sec, frac, orig, data in packets:
        units = sec * (10 ** res) + (frac * (1 if nano else 1000) if res == 9 else (frac // 1000 if nano else frac))
        out.append(block(6, struct.pack(o + "IIIII", 0, units >> 32, units & 0xFFFFFFFF, len(data), orig) + data))
    Path(args.output).write_bytes(b"".join(out))
    print(f"{args.output}: {len(packets)} packets as pcapng")


def split(args):
    header, e, nano, link, packets = read_pcap(args.input)
    os.makedirs(args.outdir, exist_ok=True)
    base = Path(args.outdir) / Path(args.input).name.replace(".gz", "")
    for k in range(0, len(packets), args.packets):
        name = f"{base}{k // args.packets or ''}"
        write_pcap(name, header, e, packets[k:k + args.packets])
    print(f"{args.outdir}: {-(-len(packets) // args.packets)} files")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mutate")
    m.add_argument("input")
    m.add_argument("output")
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--size", type=int, default=100)
    for op in ("drop", "swap", "dup", "overlap"):
        m.add_argument(f"--{op}", type=int, action="append", default=[])
    m.add_argument("--late", action="append", default=[])
    n = sub.add_parser("pcapng")
    n.add_argument("input")
    n.add_argument("output")
    n.add_argument("--big-endian", action="store_true")
    n.add_argument("--nanos", action="store_true")
    r = sub.add_parser("from-recording")
    r.add_argument("input")
    r.add_argument("output")
    r.add_argument("--keep-open-after", type=float, default=None, metavar="S",
                   help="no FIN for a connection whose client is silent for more than S seconds after its last "
                        "heartbeat on it (or for good)")
    k = sub.add_parser("relink")
    k.add_argument("input")
    k.add_argument("output")
    k.add_argument("--link", required=True, choices=["raw", "ipv4", "null", "loop", "vlan"])
    s = sub.add_parser("split")
    s.add_argument("input")
    s.add_argument("outdir")
    s.add_argument("--packets", type=int, required=True)
    args = p.parse_args(argv)
    {"mutate": mutate, "pcapng": to_pcapng, "split": split, "from-recording": from_recording,
     "relink": relink}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
