"""What `rmqhb scan` was given, checked before any work (no Spark, no reader yet): each path exists, a directory
holds something to scan and one kind of it, a file is of a known kind and not empty, a log is text, a capture
has a capture header, a --log-tz is a zone. One line and the documented exit status for each mistake
(``input_problem``). Used by the entry (``engine.bindings.cli``) and the merged scan (``merge.scan_main``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

#: `rmqhb scan` exit statuses
EXIT_OK, EXIT_USAGE, EXIT_DAMAGED, EXIT_NOTHING, EXIT_STRICT = 0, 2, 3, 4, 5

#: bytes read from the start of each log file given to tell a text log from binary data (bounded: a .gz is
#: decompressed only this far)
SNIFF_BYTES = 64 * 1024
#: what each input kind is, in the words of a one-line message
KIND_NAMES = {"recording": "recording (*.seg segments)", "broker-log": "broker log (broker*.log*)",
              "pcap": "packet capture (.pcap, .pcapng)"}
_CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz")


def _head(path: Path) -> bytes:
    import gzip
    import zlib

    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
            return f.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return b""  # unreadable or cut: the reader names the damage


def _binary(head: bytes) -> Optional[str]:
    """Why ``head`` (a file's first bytes) is not text, or None. A log line never holds NUL; a few other control
    bytes can be a client's text, so only a share of them counts."""
    if b"\0" in head:
        return f"binary data: a NUL byte at byte {head.index(0)}"
    controls = sum(head.count(bytes([c])) for c in (*range(1, 9), *range(14, 32), 127))
    if head and controls * 10 > len(head):
        return f"binary data: {controls * 100 // len(head)}% control bytes in its first {len(head):,} bytes"
    return None


def directory_kinds(directory: Path) -> dict:
    """{kind: first file of that kind} in a scan input directory: recording segments at its top level, broker
    logs (broker*.log*, at any depth: otherdays/) and packet captures (by their magic number) anywhere."""
    from .brokerlog import _file_kind, is_broker_log_name

    kinds = {}
    seg_file = next(directory.glob("*.seg"), None)
    if seg_file is not None:
        kinds["recording"] = seg_file
    for f in sorted(directory.rglob("*")):
        if len(kinds) == 3:
            break
        if f.suffix == ".seg" or f.name.endswith(".json") or not f.is_file():
            continue
        k = "broker-log" if is_broker_log_name(f.name) else ("pcap" if _file_kind(f) == "pcap" else None)
        if k:
            kinds.setdefault(k, f)
    return kinds


def input_problem(argv, kind: str, explicit: bool) -> Optional[Tuple[int, str]]:
    """(exit status, one line) for scan inputs that cannot be scanned, found before any work (no Spark yet):
    a path that does not exist (2), a directory holding nothing to scan (2) or several kinds unless --format says
    which to read (2), a file of no known kind (2), an empty file, a
    capture without a capture header, a log of binary data (4: nothing decodable), a --log-tz that is no zone (2)."""
    from .brokerlog import _paths_of, path_kind, resolve_tz

    paths = list(_paths_of(argv))
    for i, a in enumerate(argv):
        if a == "--broker" and i + 1 < len(argv) or a.startswith("--broker="):
            paths.append((a.split("=", 1)[1] if a.startswith("--broker=") else argv[i + 1]).partition("=")[2])
        if (a == "--log-tz" and i + 1 < len(argv) or a.startswith("--log-tz=")) and kind == "broker-log":
            tz = a.split("=", 1)[1] if a.startswith("--log-tz=") else argv[i + 1]
            try:
                resolve_tz(tz)
            except Exception:  # timedelta's range, ZoneInfo's KeyError or ValueError: none of them is the user's
                return EXIT_USAGE, (f"--log-tz {tz!r} is not a zone: give an IANA name (e.g. Asia/Shanghai) or "
                                    "an offset from -23:59 to +23:59 (e.g. +08:00)")
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            return EXIT_USAGE, f"no such file or directory: {raw}"
        if p.is_dir():
            kinds = directory_kinds(p)
            if not kinds:
                return EXIT_USAGE, (f"{raw} holds no recording (*.seg), broker log (broker*.log*) or packet "
                                    "capture (.pcap, .pcapng)")
            if explicit and kind not in kinds:
                return EXIT_USAGE, f"{raw} holds no {KIND_NAMES[kind]}"
            if not explicit and len(kinds) > 1:
                found = "; ".join(f"a {KIND_NAMES[k]}: {f.relative_to(p)}" for k, f in kinds.items())
                return EXIT_USAGE, (f"{raw} mixes input kinds ({found}); give one directory per kind, or "
                                    "--format KIND to read only that kind")
            continue
        if not p.is_file():
            return EXIT_USAGE, f"{raw} is not a regular file or a directory"
        if p.name.endswith(".seg"):
            continue  # one segment: the recording of that one file (its damage is named by the scan)
        if p.stat().st_size == 0:
            return EXIT_NOTHING, f"{raw} is empty: nothing to scan"
        found = path_kind(p)
        if kind == "pcap" or (found is None and p.name.endswith(_CAPTURE_SUFFIXES)):
            if found != "pcap":
                return EXIT_NOTHING, f"{raw} is not a packet capture (no pcap or pcapng header at byte 0)"
        elif kind == "broker-log" or found == "broker-log":
            binary = _binary(_head(p))
            if binary:
                return EXIT_NOTHING, f"{raw} is not a broker log ({binary})"
        elif kind == "recording":
            return EXIT_USAGE, (f"{raw} is a file, not a recording directory, a broker log (*.log, broker*.log*) "
                                "or a packet capture (.pcap, .pcapng); --format KIND names its kind")
    return None
