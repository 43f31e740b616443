"""The key of every per-address share of what all clients share (autoCreateTopicsPerIp, maxConnectionsPerIp, the
gRPC port's grpcMax*PerIp): an IPv4 address itself, an IPv6 address's /64. A host is commonly given a whole /64
(SLAAC, most providers' smallest allocation), so counting its single addresses apart would give anyone with a /64
2^64 shares; the /64 is what one host holds."""
from __future__ import annotations

import ipaddress


def share_key(ip: str) -> str:
    """``ip`` (an address without its port: ``1.2.3.4``, ``2001:db8::1``, ``[2001:db8::1]``, ``fe80::1%eth0``) as
    the address its shares count under: an IPv4 address as is, an IPv6 address as its /64 (``2001:db8::/64``); an
    IPv4-mapped IPv6 address (``::ffff:1.2.3.4``, a dual-stack listener's IPv4 client) as its IPv4 address. Anything
    that is not an address is its own key."""
    if ":" not in ip:
        return ip
    try:
        addr = ipaddress.IPv6Address(ip.strip("[]").split("%")[0])
    except ValueError:
        return ip
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.IPv6Network((addr, 64), strict=False))
