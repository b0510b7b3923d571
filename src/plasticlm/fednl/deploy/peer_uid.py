"""Which local user is at the other end of a loopback TCP connection (Linux).

The kernel lists every TCP socket of this network namespace in ``/proc/net/tcp`` and
``/proc/net/tcp6`` with the uid that created it, readable by anyone, without the socket's
process being this user's. A connection's client end is the entry whose local address is
the peer's and whose remote address is the server's. Elsewhere (no such listing) the uid is
not known: :data:`AVAILABLE` is False.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
AVAILABLE = TABLES[0].is_file()
# Only an ESTABLISHED socket with an inode speaks for a live connection: a client that has
# closed its end (FIN_WAIT2, TIME_WAIT, ...) is listed with uid 0 and inode 0, which would pass
# for root's, and a request's bytes can still be read after that close (a stranger's full
# request, then close(): the gate saw uid 0 where the SuperLink ran as root).
_LIVE = "01"

Address = tuple[str, int]


def _ip(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_ip)
    ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _parse(address: Address) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    ip = ipaddress.ip_address(address[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(address[1])


def _entries(table: Path):
    """(local ip, local port, remote ip, remote port, state, uid) of each socket of ``table``
    that is established and has an inode (see ``_LIVE``)."""
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LIVE or fields[9] == "0":
            continue
        (lip, lport), (rip, rport) = (f.split(":") for f in fields[1:3])
        yield _ip(lip), int(lport, 16), _ip(rip), int(rport, 16), fields[3], int(fields[7])


def peer_uid(peer: Address, server: Address, tables=TABLES) -> int | None:
    """The uid that owns the client socket of the TCP connection from ``peer`` to ``server``
    (each (host, port) as ASGI's ``client`` and ``server`` give them); None when it is not
    listed (a peer in another network namespace, a connection gone) or listed twice with two
    owners."""
    try:
        want = (*_parse(peer), *_parse(server))
    except ValueError:
        return None
    for table in tables:   # IPv4 first, where an IPv4 client's socket is: one read, not two
        uids = {uid for *addr, state, uid in _entries(table)
                if tuple(addr) == want}
        if uids:
            return uids.pop() if len(uids) == 1 else None
    return None
