#!/usr/bin/env python3
"""Who answers ARP for an address: `arpwho.py IFACE TARGET [SECONDS]` sends an ARP
request for TARGET from IFACE's own address and MAC, and prints the sender MAC of every
reply for TARGET received within SECONDS (default 1.5), one per line, sorted, unique.
Used by ci/uplink-guard.sh to see which hosts claim an address (the router alone, or
also the appliance's proxy ARP). Needs root (AF_PACKET)."""
import fcntl
import socket
import struct
import sys
import time


def own(iface):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    req = struct.pack("256s", iface.encode()[:15])
    ip = fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]  # SIOCGIFADDR
    mac = open(f"/sys/class/net/{iface}/address").read().strip()
    return ip, bytes(int(b, 16) for b in mac.split(":"))


def main():
    iface, target = sys.argv[1], socket.inet_aton(sys.argv[2])
    wait = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
    ip, mac = own(iface)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    s.bind((iface, 0x0806))
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, ip, b"\0" * 6, target)
    s.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)
    seen = set()
    end = time.monotonic() + wait
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            f = s.recv(1600)
        except socket.timeout:
            break
        if len(f) < 42:
            continue
        op, sha, spa = struct.unpack("!6xH6s4s", f[14:32])
        if op == 2 and spa == target:
            seen.add(sha.hex(":"))
    for m in sorted(seen):
        print(m)


if __name__ == "__main__":
    main()
