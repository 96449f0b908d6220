#!/usr/bin/env python3
"""A scripted DHCPv4 server for ci/dhcp.sh's rogue-renewal case: it leases CLIENT_IP for
LEASE s (T1 = LEASE/2) from SERVER_IP, and answers each renewal (a REQUEST with ciaddr
set) first with an ACK from ROGUE_IP (its own server identifier and router, sent from
that address) and 0.5 s later with its own ACK. While RENEWING the client must take only
the second.

usage: dhcp_rogue_server.py IFACE SERVER_IP ROGUE_IP CLIENT_IP LEASE_SECS DEADLINE_SECS
ROGUE_IP must be an address of IFACE. Runs at most DEADLINE_SECS."""
import socket
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from dhcp_expiry_server import options, reply  # noqa: E402


def main():
    iface, server, rogue, client, lease, deadline = sys.argv[1:7]
    lease, end = int(lease), time.monotonic() + float(deadline)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.setsockopt(socket.SOL_SOCKET, 25, iface.encode())  # SO_BINDTODEVICE
    s.bind(("0.0.0.0", 67))
    # The rogue answers from port 67 too, as a real server would (the appliance's firewall,
    # left in place, passes DHCP replies by that port).
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    r.bind((rogue, 67))
    while time.monotonic() < end:
        s.settimeout(max(0.1, end - time.monotonic()))
        try:
            raw, _ = s.recvfrom(2048)
        except socket.timeout:
            break
        if len(raw) < 240 or raw[0] != 1:
            continue
        kind = options(raw).get(53, b"\x00")[0]
        ciaddr = socket.inet_ntoa(raw[12:16])
        if kind == 1:  # DISCOVER
            s.sendto(reply(raw, 2, server, client, lease), ("255.255.255.255", 68))
        elif kind == 3 and ciaddr == "0.0.0.0":  # REQUEST (selecting, init-reboot)
            s.sendto(reply(raw, 5, server, client, lease), ("255.255.255.255", 68))
        elif kind == 3:  # a renewal: the rogue answers first
            r.sendto(reply(raw, 5, rogue, client, lease), (ciaddr, 68))
            print("rogue ACK sent", flush=True)
            time.sleep(0.5)
            s.sendto(reply(raw, 5, server, client, lease), (ciaddr, 68))
            print("server ACK sent", flush=True)
            continue
        else:
            continue
        print(f"answered message type {kind}", flush=True)


if __name__ == "__main__":
    main()
