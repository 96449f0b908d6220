#!/usr/bin/env python3
"""A scripted DHCPv4 server for ci/dhcp.sh's expiry case: it answers one DISCOVER with an
OFFER and one REQUEST with an ACK (a short lease: LEASE s, T1 = LEASE/2, T2 = LEASE*3/4),
then goes silent, so the client's renewals and rebinds fail and the lease must expire.

usage: dhcp_expiry_server.py IFACE SERVER_IP CLIENT_IP LEASE_SECS DEADLINE_SECS
Runs at most DEADLINE_SECS, then exits. Bound to IFACE (SO_BINDTODEVICE)."""
import socket
import struct
import sys
import time


def options(raw):
    out, i = {}, 240
    while i < len(raw):
        code = raw[i]
        if code == 0:
            i += 1
            continue
        if code == 255 or i + 1 >= len(raw):
            break
        n = raw[i + 1]
        out[code] = raw[i + 2:i + 2 + n]
        i += 2 + n
    return out


def reply(req, kind, server, client, lease):
    hdr = bytearray(240)
    hdr[0:4] = bytes([2, 1, 6, 0])  # BOOTREPLY, Ethernet, hlen 6, hops
    hdr[4:8] = req[4:8]  # xid
    hdr[10:12] = b"\x80\x00"  # BROADCAST
    hdr[16:20] = socket.inet_aton(client)  # yiaddr
    hdr[20:24] = socket.inet_aton(server)  # siaddr
    hdr[28:44] = req[28:44]  # chaddr
    hdr[236:240] = bytes([99, 130, 83, 99])
    sid = socket.inet_aton(server)
    o = bytes([53, 1, kind, 54, 4]) + sid
    o += bytes([51, 4]) + struct.pack("!I", lease)
    o += bytes([58, 4]) + struct.pack("!I", lease // 2)
    o += bytes([59, 4]) + struct.pack("!I", lease * 3 // 4)
    o += bytes([1, 4]) + socket.inet_aton("255.255.255.0")
    o += bytes([3, 4]) + sid + bytes([6, 4]) + sid + bytes([255])
    return bytes(hdr) + o


def main():
    iface, server, client, lease, deadline = sys.argv[1:6]
    lease, end = int(lease), time.monotonic() + float(deadline)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.setsockopt(socket.SOL_SOCKET, 25, iface.encode())  # SO_BINDTODEVICE
    s.bind(("0.0.0.0", 67))
    offered = acked = False
    while time.monotonic() < end:
        s.settimeout(max(0.1, end - time.monotonic()))
        try:
            raw, _ = s.recvfrom(2048)
        except socket.timeout:
            break
        if len(raw) < 240 or raw[0] != 1:
            continue
        kind = options(raw).get(53, b"\x00")[0]
        if kind == 1 and not offered:  # DISCOVER
            offered = True
            out = reply(raw, 2, server, client, lease)
        elif kind == 3 and offered and not acked:  # REQUEST
            acked = True
            out = reply(raw, 5, server, client, lease)
        else:
            print(f"silent to message type {kind}", flush=True)
            continue
        s.sendto(out, ("255.255.255.255", 68))
        print(f"answered message type {kind}", flush=True)


if __name__ == "__main__":
    main()
