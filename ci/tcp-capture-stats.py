#!/usr/bin/env python3
"""Segment statistics of a WireGuard-over-TCP capture (pcap, Ethernet, IPv4).

Usage: tcp-capture-stats.py FILE.pcap CLIENT_IP

For each direction: data segments, bytes, largest payload (the MSS under bulk), the
share of segments within 48 bytes of it, and the segments carrying a 2-byte payload,
split into *bare headers* (the 2 bytes are a frame's length prefix: the next segment in
sequence starts with a WireGuard type word 1-4,0,0,0 and the value is a valid length)
and *frame tails* (the last 2 bytes of a message, cut there by TCP segmentation).
Prints one `key=value` line for the shell script.
"""
import struct
import sys


def segments(path):
    with open(path, "rb") as f:
        hdr = f.read(24)
        magic = struct.unpack("<I", hdr[:4])[0]
        endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
        linktype = struct.unpack(endian + "I", hdr[20:24])[0]
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            _, _, incl, orig = struct.unpack(endian + "IIII", rec)
            data = f.read(incl)
            off = 14 if linktype == 1 else 16 if linktype == 113 else 0
            if linktype == 113:
                proto = struct.unpack(">H", data[14:16])[0]
            else:
                proto = struct.unpack(">H", data[12:14])[0]
            if proto != 0x0800:
                continue
            ip = data[off:]
            ihl = (ip[0] & 15) * 4
            total = struct.unpack(">H", ip[2:4])[0]
            if ip[9] != 6:
                continue
            src = ".".join(map(str, ip[12:16]))
            tcp = ip[ihl:]
            seq = struct.unpack(">I", tcp[4:8])[0]
            doff = (tcp[12] >> 4) * 4
            plen = total - ihl - doff
            if plen <= 0:
                continue
            yield src, seq, plen, tcp[doff:doff + 8]


def main():
    path, client = sys.argv[1], sys.argv[2]
    dirs = {}
    for src, seq, plen, head in segments(path):
        d = "c2s" if src == client else "s2c"
        dirs.setdefault(d, {})[seq] = (plen, head)
    out = {}
    bare = tails = 0
    for d in ("c2s", "s2c"):
        segs = dirs.get(d, {})
        sizes = [p for p, _ in segs.values()]
        mx = max(sizes) if sizes else 0
        out["segs_" + d] = len(sizes)
        out["bytes_" + d] = sum(sizes)
        out["max_" + d] = mx
        out["nearmss_" + d] = sum(1 for s in sizes if s >= mx - 48) if sizes else 0
        out["mean_" + d] = sum(sizes) // len(sizes) if sizes else 0
        for seq, (plen, head) in segs.items():
            if plen != 2:
                continue
            nxt = segs.get((seq + 2) & 0xFFFFFFFF)
            length = struct.unpack(">H", head[:2])[0]
            if nxt and len(nxt[1]) >= 4 and nxt[1][0] in (1, 2, 3, 4) and nxt[1][1:4] == b"\0\0\0" \
                    and 32 <= length <= 65507:
                bare += 1
            else:
                tails += 1
    out["bare_headers"] = bare
    out["two_byte_tails"] = tails
    print(" ".join("%s=%d" % kv for kv in out.items()))


main()
