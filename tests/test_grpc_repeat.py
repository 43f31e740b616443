"""engine.broker._grpc_repeat (compiled) against its twin engine.broker.grpc_repeat: every branch of a repeated
5.x Heartbeat's check, on a stand-in endpoint, gives the same answer and the same effects in both."""
import importlib
import time
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_native

IMPLS = ("engine.broker._grpc_repeat", "engine.broker.grpc_repeat")
OK = b"\x0a\x02\x08\x14"  # the endpoint's prepared HeartbeatResponse bytes (any bytes do here)


class Registry:
    def __init__(self, holds=True):
        self.holds, self.tokens = holds, []

    def heartbeat_repeat(self, token):
        self.tokens.append(token)
        return "result" if self.holds else None


def endpoint(**kw):
    recorded = []
    ep = types.SimpleNamespace(acl=None, on_request=None, sessions={}, _heartbeat_ok=OK,
                               broker=types.SimpleNamespace(registry=Registry(), recorder=None),
                               _record=recorded.append, recorded=recorded)
    for k, v in kw.items():
        setattr(ep, k, v)
    return ep


def session(request=b"hb", stream_peer=None):
    return types.SimpleNamespace(_hb_repeat=(request, ("token",)), last_seen=0.0,
                                 stream=None if stream_peer is None else types.SimpleNamespace(peer=stream_peer))


CASES = {
    # name: (endpoint changes, session (None: none), call args (request, client_id bytes, peer))
    "answered": ({}, session(), (b"hb", b"c1", "ipv4:1.2.3.4:5")),
    "answered, the stream's peer": ({}, session(stream_peer="ipv4:1.2.3.4:5"), (b"hb", b"c1", "ipv4:1.2.3.4:5")),
    "the client id stripped": ({}, session(), (b"hb", b"  c1 \t", "p")),
    "the client id stripped of Unicode spaces": ({}, session(), (b"hb", "\u00a0c1\u2003".encode(), "p")),
    "a client id of spaces": ({}, session(), (b"hb", b" \t ", "p")),
    "no client id": ({}, session(), (b"hb", None, "p")),
    "another client": ({}, session(), (b"hb", b"c2", "p")),
    "a client id not UTF-8": ({}, session(), (b"hb", b"c\xff1", "p")),
    "other bytes": ({}, session(), (b"hb2", b"c1", "p")),
    "not armed": ({}, types.SimpleNamespace(_hb_repeat=None, last_seen=0.0, stream=None), (b"hb", b"c1", "p")),
    "another connection": ({}, session(stream_peer="ipv4:9.9.9.9:9"), (b"hb", b"c1", "ipv4:1.2.3.4:5")),
    "aclEnable": ({"acl": object()}, session(), (b"hb", b"c1", "p")),
    "the on_request hook": ({"on_request": print}, session(), (b"hb", b"c1", "p")),
    "the registry declines": ({"broker": types.SimpleNamespace(registry=Registry(holds=False), recorder=None)},
                              session(), (b"hb", b"c1", "p")),
    "recorded": ({"broker": types.SimpleNamespace(registry=Registry(), recorder=object())}, session(),
                 (b"hb", b"c1", "p")),
}


def run(impl, name):
    changes, s, (request, client_id, peer) = CASES[name]
    ep = endpoint(**changes)
    if s is not None:
        s = types.SimpleNamespace(**vars(s))  # each run its own session
        ep.sessions["c1"] = s
    repeat = importlib.import_module(impl).HeartbeatRepeat(ep)
    before = time.monotonic()
    answer = repeat(request, client_id, peer)
    # the effects: the counter, the session's repeat and last_seen, the registry's calls, the recorder's records
    touched = s is not None and s.last_seen >= before
    return (answer, repeat.hits, None if s is None else s._hb_repeat, touched, ep.broker.registry.tokens,
            len(ep.recorded))


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_and_twin_decide_alike(name):
    require_native()
    native, twin = run(IMPLS[0], name), run(IMPLS[1], name)
    assert native == twin
    answered = name.startswith(("answered", "the client id stripped")) or name == "recorded"
    assert (twin[0] == OK) is answered and twin[1] == int(answered) and twin[3] is answered
    if name == "the registry declines":
        assert twin[2] is None  # disarmed: the next Heartbeat takes the handler
    if name == "recorded":
        assert twin[5] == 1


def test_answer_takes_the_session_key():
    """The grpcio transport's form: the client id already a str (its metadata's value)."""
    require_native()
    for impl in IMPLS:
        ep = endpoint()
        ep.sessions["c1"] = session()
        assert importlib.import_module(impl).HeartbeatRepeat(ep).answer(b"hb", "c1", "p") == OK
        assert importlib.import_module(impl).HeartbeatRepeat(ep).answer(b"hb", None, "p") is None


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=24) | st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_the_client_id_decodes_alike(raw):
    """The compiled decode of the header's bytes (no method call when no end is whitespace) finds the session the
    twin's ``header_client_id`` names, for any bytes: invalid UTF-8, Unicode spaces at either end, empty."""
    require_native()
    twin = importlib.import_module(IMPLS[1])
    key = twin.header_client_id(raw)
    for impl in IMPLS:
        ep = endpoint()
        ep.sessions[key] = session()
        assert importlib.import_module(impl).HeartbeatRepeat(ep)(b"hb", raw, "p") == OK, impl
