"""The load generator's answer check (bench/loadgen.py): a read of answers is checked with one comparison when it
holds only SUCCESS answers to the expected opaques; anything else must still be counted exactly, frame by frame."""
import asyncio
import sys
from pathlib import Path

import pytest

import engine
from engine.enums import RequestCode, ResponseCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import loadgen  # noqa: E402


class Sink:
    def __init__(self):
        self.written = []

    def write(self, data):
        self.written.append(data)


def answer(seq, code=ResponseCode.SUCCESS, ext=None):
    req = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=loadgen.OPAQUE_BASE + seq)
    return req.response(code, ext_fields={"IS_SUPPORT_HEART_BEAT_V2": "true", "IS_SUB_CHANGE": "true"}
                        if ext is None else ext).encode()


def notify():
    return engine.RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=5, flag=2,
                                  ext_fields={"consumerGroup": "g"}).encode()


async def _conn(sent):
    client = loadgen.SimClient(1, producers=["PID_x"])
    stats, lat = loadgen._new_stats(), []
    conn = loadgen.LoadConn(loadgen.FrameTemplate(client.heartbeat_frame(loadgen.OPAQUE_BASE)), stats, lat)
    conn.connection_made(Sink())
    conn.send(0.0, count=sent)
    return conn, stats, lat


def test_a_burst_is_one_write_of_frames_with_consecutive_opaques():
    async def main():
        conn, stats, _ = await _conn(8)
        frames = engine.FrameDecoder().feed(conn.transport.written[0])
        assert [f.opaque for f in frames] == [loadgen.OPAQUE_BASE + i for i in range(8)]
        assert all(f.code == RequestCode.HEART_BEAT for f in frames) and stats["sent"] == 8

    asyncio.run(main())


@pytest.mark.parametrize("split", [None, 3, 57])
def test_answers_are_counted_exactly_whichever_path_checks_them(split, monkeypatch):
    parsed = []
    real_parse = loadgen.LoadConn._parse
    monkeypatch.setattr(loadgen.LoadConn, "_parse", lambda self, data, now: (parsed.append(data),
                                                                           real_parse(self, data, now))[1])

    async def main():
        conn, stats, lat = await _conn(40)
        reads = [answer(0),  # parsed: learns the answer's shape
                 b"".join(answer(i) for i in range(1, 9)),  # the one-comparison path
                 b"".join(answer(i) for i in (9, 10, 99, 12)),  # a wrong opaque among them
                 b"".join([answer(13), answer(14, ResponseCode.SYSTEM_BUSY, ext={}), answer(15)]),
                 b"".join([answer(16), notify(), answer(17)]),
                 b"".join(answer(i) for i in range(18, 40))]
        for data in reads:
            if split is None:
                conn.data_received(data)
            else:  # arbitrary read boundaries: partial frames wait in the buffer
                for k in range(0, len(data), split):
                    conn.data_received(data[k:k + split])
        assert conn.answer is not None
        assert stats["answered"] == 40 and len(lat) == 40 and not conn.pending
        assert stats["opaque_mismatch"] == 1
        assert stats["errors"] == 1 and stats["ok"] == 39
        assert stats["notifies"] == 1
        assert conn.buf == b""
        if split is None:  # the reads of SUCCESS answers only, after the first, took the one-comparison path
            assert len(parsed) == 4


    asyncio.run(main())
