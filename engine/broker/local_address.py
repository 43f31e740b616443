"""RemotingUtil.getLocalAddress (4.9.8): the default of ``brokerIP1``, the address a broker without one registers
with its name servers (and clients then connect to). Java takes it from the host's interfaces, not from where a
client connected: a broker behind a name server with no ``brokerIP1`` must register an address clients on other
hosts reach, never 127.0.0.1.
"""
from __future__ import annotations

import array
import ipaddress
import os
import socket
import struct

__all__ = ["local_address", "pick_local_address"]

#: ioctl SIOCGIFCONF (Linux) and the size of one struct ifreq on a 64-bit Linux
_SIOCGIFCONF = 0x8912
_IFREQ_SIZE = 40
_MAX_INTERFACES = 256


def pick_local_address(ipv4: list[str], ipv6: list[str]) -> str | None:
    """getLocalAddress's choice among the non-loopback addresses of the non-bridge interfaces, in interface order:
    the first IPv4 address that starts with neither ``127.0`` nor ``192.168``, else the last IPv4 address, else the
    first IPv6 address; None when there is none (Java then falls back to the host name's address)."""
    ipv4 = [ip for ip in ipv4 if not ipaddress.ip_address(ip).is_loopback]
    ipv6 = [ip for ip in ipv6 if not ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback]
    if ipv4:
        for ip in ipv4:
            if not ip.startswith(("127.0", "192.168")):
                return ip
        return ipv4[-1]
    return ipv6[0] if ipv6 else None


def _is_bridge(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}/bridge")  # RemotingUtil.isBridge (Linux)


def _ipv4_addresses() -> list[str]:
    """(Linux) the IPv4 address of every configured interface, in the kernel's order (SIOCGIFCONF)."""
    import fcntl

    buf = array.array("B", bytes(_IFREQ_SIZE * _MAX_INTERFACES))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        addr, length = buf.buffer_info()
        out = fcntl.ioctl(s.fileno(), _SIOCGIFCONF, struct.pack("iL", length * buf.itemsize, addr))
    size = struct.unpack("iL", out)[0]
    data = buf.tobytes()[:size]
    found = []
    for i in range(0, size - _IFREQ_SIZE + 1, _IFREQ_SIZE):
        name = data[i:i + 16].split(b"\0", 1)[0].decode("ascii", "replace")
        if not _is_bridge(name):
            found.append(socket.inet_ntoa(data[i + 20:i + 24]))
    return found


def _ipv6_addresses() -> list[str]:
    """(Linux) the IPv6 addresses of the interfaces, from /proc/net/if_inet6 (link-local ones with their zone)."""
    found = []
    with open("/proc/net/if_inet6", encoding="ascii") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6 or _is_bridge(fields[5]):
                continue
            ip = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            found.append(f"{ip}%{fields[5]}" if ip.is_link_local else str(ip))
    return found


def local_address() -> str:
    """brokerIP1's default, as 4.9.8 computes it (see :func:`pick_local_address`); where the interfaces cannot be
    read (not Linux), the host name's address; 127.0.0.1 as the last resort."""
    ipv4, ipv6 = [], []
    try:
        ipv4 = _ipv4_addresses()
    except (OSError, ImportError, struct.error):
        pass
    try:
        ipv6 = _ipv6_addresses()
    except (OSError, ValueError):
        pass
    ip = pick_local_address(ipv4, ipv6)
    if ip is None:
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = "127.0.0.1"
    return ip
