"""brokerIP1's default (issue 27 §1, 'with 4.9.8's defaults'): a broker behind a name server without brokerIP1
registers the address 4.9.8's RemotingUtil.getLocalAddress picks from the host's interfaces, not 127.0.0.1 (which a
client on another host takes for itself); with a specific listenHost, that address."""
import sys

import pytest

from engine.broker.controller import Broker
from engine.broker.local_address import _ipv4_addresses, local_address, pick_local_address
from engine.codec.enums import ResponseCode
from tests.nameserver import NameServer
from tests.test_server import Client, make_config, wait_until


@pytest.mark.parametrize("ipv4, ipv6, want", [
    (["127.0.0.1", "10.1.2.3", "172.16.0.9"], [], "10.1.2.3"),  # the first one not 127.0 / 192.168
    (["127.0.0.1", "192.168.1.5", "10.1.2.3"], [], "10.1.2.3"),
    (["127.0.0.1", "192.168.1.5", "192.168.7.7"], ["2001:db8::1"], "192.168.7.7"),  # else the last IPv4 one
    (["127.0.0.1"], ["::1", "fe80::1%eth0", "2001:db8::1"], "fe80::1%eth0"),  # no IPv4: the first IPv6 one
    (["127.0.0.1"], ["::1"], None),  # only loopback: Java falls back to the host name's address
])
def test_the_choice_is_remoting_utils(ipv4, ipv6, want):
    assert pick_local_address(ipv4, ipv6) == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the interfaces are read the Linux way")
def test_the_local_address_is_one_of_the_hosts():
    own = _ipv4_addresses()
    assert "127.0.0.1" in own  # the loopback interface is read too (then left out)
    ip = local_address()
    others = [a for a in own if not a.startswith("127.")]
    if others:
        assert ip == pick_local_address(own, []) and ip in others


@pytest.fixture
def nameserver():
    ns = NameServer().start()
    yield ns
    ns.stop()


def test_a_broker_behind_a_name_server_registers_an_address_clients_reach(nameserver, tmp_path):
    """listenHost 0.0.0.0 (the default) and no brokerIP1: the route carries local_address(), and a client that
    follows it reaches the broker; a broker bound to one address registers that one."""
    wide = Broker(make_config(tmp_path / "wide", listen_host="0.0.0.0", namesrv_addr=nameserver.addr,
                              broker_name="broker-wide")).start()
    one = Broker(make_config(tmp_path / "one", listen_host="127.0.0.1", namesrv_addr=nameserver.addr,
                             broker_name="broker-one", broker_cluster_name="C1")).start()
    try:
        assert wait_until(lambda: len(nameserver.broker_addr_table) == 2, 10)
        registered = nameserver.broker_addr_table["broker-wide"]["brokerAddrs"][0]
        assert registered == f"{local_address()}:{wide.ports['main']}"
        assert nameserver.broker_addr_table["broker-one"]["brokerAddrs"][0] == f"127.0.0.1:{one.ports['main']}"
        host, _, port = registered.rpartition(":")
        c = Client(int(port), host=host.strip("[]"))
        try:
            assert c.heartbeat(client_id="10.0.0.1@routed").code == ResponseCode.SUCCESS
        finally:
            c.close()
    finally:
        wide.stop()
        one.stop()
