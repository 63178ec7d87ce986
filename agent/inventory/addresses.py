"""Interface addresses: ask the kernel over rtnetlink (RTM_GETADDR dump).

No subprocess and no dependency: one AF_NETLINK socket, one dump request, the
answer parsed with ``struct``. It sees the network namespace the agent runs in
(the testbed runs agents in namespaces). When netlink is unavailable the output
of ``ip -j addr`` is used instead; recorded trees ship that output as
``ip-addr.json``, parsed by :func:`from_ip_json`.

Result: ``{"eth0": ["10.0.0.5/24", "fe80::1/64"], ...}``, IPv4 before IPv6, in
kernel order.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess

NETLINK_ROUTE = 0
RTM_NEWADDR = 20
RTM_GETADDR = 22
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_LABEL = 3

_NLMSGHDR = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse_dump(chunks: list[bytes], names: dict[int, str]) -> dict[str, list[str]]:
    """Parse RTM_NEWADDR messages (as received) into name -> ["addr/prefix", ...]."""
    v4: dict[str, list[str]] = {}
    v6: dict[str, list[str]] = {}
    for data in chunks:
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, mtype, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                break
            body = data[offset + _NLMSGHDR.size : offset + length]
            offset += _align(length)
            if mtype == NLMSG_DONE:
                break
            if mtype == NLMSG_ERROR:
                (errno,) = struct.unpack_from("=i", body, 0)
                if errno:
                    raise OSError(-errno, os.strerror(-errno))
                continue
            if mtype != RTM_NEWADDR or len(body) < _IFADDRMSG.size:
                continue
            family, prefixlen, _f, _scope, index = _IFADDRMSG.unpack_from(body, 0)
            attrs: dict[int, bytes] = {}
            pos = _IFADDRMSG.size
            while pos + _RTATTR.size <= len(body):
                alen, atype = _RTATTR.unpack_from(body, pos)
                if alen < _RTATTR.size:
                    break
                attrs[atype] = body[pos + _RTATTR.size : pos + alen]
                pos += _align(alen)
            raw = attrs.get(IFA_LOCAL) if family == socket.AF_INET else None
            raw = raw or attrs.get(IFA_ADDRESS)
            if raw is None or family not in (socket.AF_INET, socket.AF_INET6):
                continue
            name = names.get(index)
            if name is None:
                try:
                    name = socket.if_indextoname(index)
                except OSError:
                    name = f"if{index}"
            text = socket.inet_ntop(family, raw)
            (v4 if family == socket.AF_INET else v6).setdefault(name, []).append(f"{text}/{prefixlen}")
    out: dict[str, list[str]] = {}
    for name in list(v4) + [n for n in v6 if n not in v4]:
        out[name] = v4.get(name, []) + v6.get(name, [])
    return out


def from_netlink(timeout: float = 2.0) -> dict[str, list[str]]:
    names = {index: name for index, name in socket.if_nameindex()}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(timeout)
        sock.bind((0, 0))
        seq = 1
        request = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
        sock.send(header + request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            if _contains_done(data):
                break
    return parse_dump(chunks, names)


def _contains_done(data: bytes) -> bool:
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, mtype, *_ = _NLMSGHDR.unpack_from(data, offset)
        if mtype in (NLMSG_DONE, NLMSG_ERROR):
            return True
        if length < _NLMSGHDR.size:
            return True
        offset += _align(length)
    return False


def from_ip_json(text: str) -> dict[str, list[str]]:
    """Parse ``ip -j addr`` output (live fallback, and recorded trees)."""
    out: dict[str, list[str]] = {}
    for link in json.loads(text or "[]"):
        name = link.get("ifname")
        if not name:
            continue
        v4, v6 = [], []
        for info in link.get("addr_info", []):
            local, prefix = info.get("local"), info.get("prefixlen")
            if local is None or prefix is None:
                continue
            try:
                version = ipaddress.ip_address(local).version
            except ValueError:
                continue
            (v4 if version == 4 else v6).append(f"{local}/{prefix}")
        if v4 or v6:
            out[name] = v4 + v6
    return out


def live_addresses() -> tuple[dict[str, list[str]], list[str]]:
    """Addresses of this host's interfaces, and what went wrong (if anything)."""
    try:
        return from_netlink(), []
    except OSError as exc:
        netlink_error = f"addresses: netlink failed ({exc}); trying `ip -j addr`"
    try:
        proc = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=5, check=True)
        return from_ip_json(proc.stdout), [netlink_error]
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {}, [netlink_error, f"addresses: `ip -j addr` failed too ({exc}); addresses not reported"]
