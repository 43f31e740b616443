"""HPACK (RFC 7541) of the native HTTP/2 server, side by side in one run: the Cython module, its pure-Python twin
and the `hpack` package (python-hyper's, the reference HPACK of the Python world; a test/bench dependency only).

The blocks are real grpc C-core ones (tests/data/hpack/grpc_c_core_blocks.json, grpcio 1.85): a 5.x client's
unary Heartbeat request (17 fields: the pseudo-headers, grpc's own, the x-mq-* metadata and the ACL authorization)
as the first block of a connection (608 bytes, fresh table) and as the next call's block (365 bytes, naming what the
first one indexed), and the grpcio server's response headers and trailers. Each decode starts from a decoder
primed by the blocks before it on that connection (pedantic setup, not timed). Run:

    .venv/bin/python -m pytest bench/bench_hpack.py --benchmark-only --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,ops
"""
import json
from pathlib import Path

import pytest

from engine.http2 import _hpack_py

try:
    from engine.http2 import _hpack
except ImportError:  # not built: the twin and the reference only
    _hpack = None
hpack = pytest.importorskip("hpack")  # the test extra

BLOCKS = json.loads((Path(__file__).resolve().parents[1] / "tests" / "data" / "hpack" /
                     "grpc_c_core_blocks.json").read_text())
REQUESTS = [bytes.fromhex(b) for b in BLOCKS["requests"]]
RESPONSES = [bytes.fromhex(b) for b in BLOCKS["responses"]]
#: (name, blocks before it on the connection, the block decoded)
CASES = [("request-first", [], REQUESTS[0]), ("request-next", REQUESTS[:1], REQUESTS[1]),
         ("response-headers", [], RESPONSES[0]), ("response-trailers", RESPONSES[:1], RESPONSES[1]),
         ("response-headers-next", RESPONSES[:2], RESPONSES[2])]


class _Reference:
    """hpack.Decoder under our API (raw bytes out)."""

    def __init__(self):
        self.d = hpack.Decoder()

    def decode(self, block):
        return self.d.decode(block, raw=True)


IMPLS = {"native": _hpack and _hpack.HpackDecoder, "twin": _hpack_py.HpackDecoder, "hpack": _Reference}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decode(benchmark, impl, case):
    name, before, block = case
    if IMPLS[impl] is None:
        pytest.skip("engine.http2._hpack is not built")
    benchmark.group = f"hpack decode {name} ({len(block)} B)"

    def setup():
        d = IMPLS[impl]()
        for b in before:
            d.decode(b)
        return (d, block), {}

    fields = benchmark.pedantic(lambda d, b: d.decode(b), setup=setup, rounds=3000, warmup_rounds=50)
    ref = _Reference()
    for b in before:
        ref.decode(b)
    assert [tuple(f) for f in fields] == [tuple(f) for f in ref.decode(block)]


RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc"),
            (b"grpc-accept-encoding", b"identity, deflate, gzip")]
TRAILERS = [(b"grpc-status", b"0"), (b"grpc-message", b"")]


@pytest.mark.parametrize("impl", ["native", "twin", "hpack"])
def test_encode_response_and_trailers(benchmark, impl):
    """A unary call's response headers and trailers on a connection that already answered one."""
    if impl == "native" and _hpack is None:
        pytest.skip("engine.http2._hpack is not built")
    benchmark.group = "hpack encode response + trailers (steady state)"
    if impl == "hpack":
        e = hpack.Encoder()
        encode = e.encode
    else:
        e = (_hpack if impl == "native" else _hpack_py).HpackEncoder()
        encode = e.encode
    ref = hpack.Decoder()  # the peer: every block decodes to what was encoded
    assert [[tuple(f) for f in ref.decode(encode(h), raw=True)] for h in (RESPONSE, TRAILERS)] == [RESPONSE, TRAILERS]
    blocks = benchmark(lambda: (encode(RESPONSE), encode(TRAILERS)))
    assert [[tuple(f) for f in ref.decode(b, raw=True)] for b in blocks] == [RESPONSE, TRAILERS]
