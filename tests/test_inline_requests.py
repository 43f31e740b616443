"""UNREGISTER_CLIENT and GET_CONSUMER_LIST_BY_GROUP are served inline, in the read that decoded them (the native
protocol dispatches them in Cython), as heartbeats are: a connection's requests are answered in the order sent, in
the read's one write, and the write is flushed early once the read's non-heartbeat answers pass
``RemotingServer.out_flush_bytes``, so a read of many small requests with large answers cannot build an unbounded
write. Each test runs on the native protocol and its twin."""
import json

import engine
from engine.codec.enums import RequestCode, ResponseCode

from test_protocol_review import answers, conn_class, connect, heartbeat, make_broker  # noqa: F401  (fixture)
from test_server_fastpath import FakeTransport, split_frames


def consumer_list(opaque, group="g_fast"):
    return engine.RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, opaque=opaque,
                                  ext_fields={"consumerGroup": group}).encode()


def unregister(opaque, client, group="g_fast"):
    return engine.RemotingCommand(RequestCode.UNREGISTER_CLIENT, opaque=opaque,
                                  ext_fields={"clientID": client, "consumerGroup": group}).encode()


def ids(answer):
    return json.loads(answer.body)["consumerIdList"]


def test_a_connections_requests_are_answered_in_order_in_one_write(tmp_path, conn_class):
    """Heartbeat, consumer list, unregister, consumer list, heartbeat, consumer list in one read: each sees the
    state the previous ones left (with queued unregisters and lists they were answered after the read's heartbeats,
    out of order), and all six answers go out in one write; nothing waits in an executor."""
    b = make_broker(tmp_path, conn_class)
    try:
        conn = connect(b)
        client = "10.0.0.1@1#1"
        conn.data_received(heartbeat(1, client=client) + consumer_list(2) + unregister(3, client) + consumer_list(4)
                           + heartbeat(5, client=client) + consumer_list(6))
        assert len(conn.transport.chunks) == 1
        got = answers(conn)
        assert [a.opaque for a in got] == [1, 2, 3, 4, 5, 6]
        assert [a.code for a in got] == [ResponseCode.SUCCESS] * 3 + [ResponseCode.SYSTEM_ERROR] + [
            ResponseCode.SUCCESS] * 2
        assert ids(got[1]) == [client] and ids(got[5]) == [client]
        assert got[3].remark == "no consumer for this group, g_fast"
        assert conn.inflight == 0 and not any(len(ex) for ex in b.server.executors.values())
        m = b.metrics.requests
        assert (m[RequestCode.UNREGISTER_CLIENT], m[RequestCode.GET_CONSUMER_LIST_BY_GROUP]) == (1, 3)
        assert b.registry.consumer_ids("g_fast") == [client]
    finally:
        b.loop.close()


def test_large_answers_flush_the_reads_write_early(tmp_path, conn_class):
    """With out_flush_bytes at 400 B, a read of 12 consumer lists of a 6-member group (~230 B answers) and
    heartbeats between them goes out in several writes, each flushed as soon as its non-heartbeat answers passed
    the limit, in request order, every request answered once."""
    b = make_broker(tmp_path, conn_class)
    b.server.out_flush_bytes = 400
    try:
        members = [connect(b) for _ in range(6)]
        for i, m in enumerate(members):
            m.data_received(heartbeat(i, client=f"10.0.0.{i}@1#1"))
        conn = members[0]
        conn.transport.chunks.clear()
        frames = []
        for k in range(12):
            frames.append(consumer_list(100 + k))
            if k % 3 == 0:
                frames.append(heartbeat(200 + k, client="10.0.0.0@1#1"))
        conn.data_received(b"".join(frames))
        got = answers(conn)
        assert [a.opaque for a in got] == [engine.decode_frame(f).opaque for f in frames]
        lists = [a for a in got if a.opaque < 200]
        assert all(sorted(ids(a)) == sorted(f"10.0.0.{i}@1#1" for i in range(6)) for a in lists)
        size = len(consumer_list_answer(conn, lists[0]))
        assert size <= 400 < 2 * size  # the limit is passed by the second list of a batch
        chunks = conn.transport.chunks
        assert len(chunks) == 6  # two lists per flushed write (the read ends with the twelfth: nothing left)
        for chunk in chunks:
            assert sum(1 for f in map(engine.decode_frame, split_frames(chunk)) if f.opaque < 200) == 2
        assert not conn.closing
    finally:
        b.loop.close()


def consumer_list_answer(conn, answer):
    """The encoded bytes of one answer as it was written."""
    for chunk in conn.transport.chunks:
        for f in split_frames(chunk):
            if engine.decode_frame(f).opaque == answer.opaque:
                return f
    raise AssertionError(answer.opaque)


class NotReading(FakeTransport):
    """A client that reads nothing: every written byte stays in the transport's buffer."""

    def get_write_buffer_size(self):
        return sum(map(len, self.chunks))


def test_a_client_that_does_not_read_its_large_answers_is_closed_within_the_write_budget(tmp_path, conn_class):
    """One read of 2,000 consumer lists of a 40-member group (~1.2 KB answers, 2.4 MB in all) from a client that
    reads nothing, with maxWriteBufferBytes at 64 KiB: the batch is flushed every out_flush_bytes, the write-buffer
    limit closes the connection at the first flush past it, and the rest of the read is not served: what the
    broker holds for the client stays within the limit plus one flush."""
    b = make_broker(tmp_path, conn_class, max_write_buffer_bytes=64 * 1024)
    b.server.out_flush_bytes = 16 * 1024
    try:
        for i in range(40):
            connect(b).data_received(heartbeat(i, client=f"10.0.0.{i}@1#1"))
        conn = b.server.new_connection("main")
        conn.connection_made(NotReading())
        conn.data_received(b"".join(consumer_list(k) for k in range(2000)))
        assert conn.closing and conn.close_reason.startswith("client does not read its responses")
        held = sum(map(len, conn.transport.chunks))
        assert 64 * 1024 < held <= 64 * 1024 + 16 * 1024 + 2 * 1300
        assert b.metrics.requests[RequestCode.GET_CONSUMER_LIST_BY_GROUP] < 100
    finally:
        b.loop.close()


def join(b, n, group="g_fast", first=0):
    conns = []
    for i in range(first, first + n):
        c = connect(b)
        c.data_received(heartbeat(i, client=f"10.0.{i // 250}.{i % 250}@1#1", group=group))
        conns.append(c)
    return conns


def test_large_consumer_lists_are_kept_encoded_while_the_group_is_the_same(tmp_path, conn_class):
    """A group of 70 members: the second ask gets the kept encoding (the same bytes object), a member leaving or
    joining is seen at once (the list is compared, not trusted), and every answer equals the one of a broker that
    keeps nothing (consumerListCacheBytes=0)."""
    b = make_broker(tmp_path / "a", conn_class)
    plain = make_broker(tmp_path / "b", conn_class, consumer_list_cache_bytes=0)
    try:
        members = {id(x): join(x, 70) for x in (b, plain)}
        asker = {id(x): connect(x) for x in (b, plain)}

        def ask(x, opaque):
            c = asker[id(x)]
            c.transport.chunks.clear()
            c.data_received(consumer_list(opaque))
            (a,) = answers(c)
            return a

        def both(opaque):
            got, want = ask(b, opaque), ask(plain, opaque)
            assert got.body == want.body and got.code == want.code == ResponseCode.SUCCESS
            return ids(got)

        first = both(1)
        assert len(first) == 70
        kept = b.processors._consumer_lists["g_fast"][1]
        both(2)
        assert b.processors._consumer_lists["g_fast"][1] is kept  # reused, not encoded again
        assert not plain.processors._consumer_lists
        for x in (b, plain):
            members[id(x)][5].connection_lost(None)  # a member leaves
        assert len(both(3)) == 69
        for x in (b, plain):
            join(x, 1, first=500)
        after = both(4)
        assert len(after) == 70 and "10.0.2.0@1#1" in after
    finally:
        b.loop.close()
        plain.loop.close()


def test_the_kept_consumer_lists_stay_within_their_budget(tmp_path, conn_class):
    """Four groups of 64-80 members with room for about two of their lists: the oldest kept lists make room,
    the budget is never passed, and every answer is right (from the registry, kept or not)."""
    probe = _json_list_size(70)
    b = make_broker(tmp_path, conn_class, consumer_list_cache_bytes=2 * 2 * probe + 100)
    try:
        groups = {f"g{k}": 64 + 5 * k for k in range(4)}
        first = 0
        for g, n in groups.items():
            join(b, n, group=g, first=first)
            first += n
        asker = connect(b)
        for round_ in range(3):
            for g, n in groups.items():
                asker.transport.chunks.clear()
                asker.data_received(consumer_list(round_ * 10 + len(g), group=g))
                (a,) = answers(asker)
                assert len(ids(a)) == n
                p = b.processors
                assert p._consumer_lists_bytes == sum(2 * len(body) for _, body in p._consumer_lists.values())
                assert p._consumer_lists_bytes <= b.config.consumer_list_cache_bytes
                assert list(p._consumer_lists)[-1] == g  # the newest kept
        assert 1 <= len(b.processors._consumer_lists) <= 2
    finally:
        b.loop.close()


def _json_list_size(n):
    return len(json.dumps({"consumerIdList": [f"10.0.0.{i}@1#1" for i in range(n)]}, separators=(",", ":")))
