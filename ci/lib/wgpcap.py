#!/usr/bin/env python3
"""The WireGuard messages of a UDP capture (pcap, IPv4; Ethernet or Linux cooked), one
line each, for the Bash labs:

    wgpcap.py FILE.pcap

    TIME SRC:PORT DST:PORT TYPE LEN SENDER RECEIVER

TIME is the capture's (Unix seconds, microseconds), TYPE the message type (1 initiation,
148 bytes; 2 response, 92; 3 cookie reply, 64; 4 data), LEN the UDP payload's length,
SENDER and RECEIVER the message's indices in hex (`-` where the type has none: an
initiation names only its sender, a response both, a cookie reply and data only the
receiver). A response's RECEIVER is the SENDER of the initiation it answers. Datagrams
that are not WireGuard-shaped (first byte 1-4, then three zero bytes) are left out. The
file may still be written (tcpdump -U): a record cut short at its end ends the list.
"""
import struct
import sys


def messages(path):
    with open(path, "rb") as f:
        hdr = f.read(24)
        if len(hdr) < 24:
            return
        magic = struct.unpack("<I", hdr[:4])[0]
        if magic in (0xA1B2C3D4, 0xA1B23C4D):
            endian = "<"
        elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
            endian = ">"
            magic = struct.unpack(">I", hdr[:4])[0]
        else:
            raise SystemExit(f"{path}: not a pcap file")
        frac = 1e-9 if magic == 0xA1B23C4D else 1e-6
        linktype = struct.unpack(endian + "I", hdr[20:24])[0]
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            sec, sub, incl, _ = struct.unpack(endian + "IIII", rec)
            data = f.read(incl)
            if len(data) < incl:
                return
            if linktype == 1:  # Ethernet (a veth)
                off, proto = 14, data[12:14]
            elif linktype == 113:  # Linux cooked (-i any)
                off, proto = 16, data[14:16]
            else:
                continue
            if proto != b"\x08\x00" or len(data) < off + 20:
                continue
            ip = data[off:]
            ihl = (ip[0] & 15) * 4
            if ip[9] != 17 or len(ip) < ihl + 8:
                continue
            src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
            sport, dport, ulen = struct.unpack(">HHH", ip[ihl:ihl + 6])
            pay = ip[ihl + 8:]
            if len(pay) < 4 or pay[0] not in (1, 2, 3, 4) or pay[1:4] != b"\0\0\0":
                continue
            t = pay[0]

            def idx(at):
                return "%08x" % struct.unpack("<I", pay[at:at + 4])[0] if len(pay) >= at + 4 else "-"

            sender = idx(4) if t in (1, 2) else "-"
            receiver = idx(8) if t == 2 else idx(4) if t in (3, 4) else "-"
            yield (f"{sec + sub * frac:.6f} {src}:{sport} {dst}:{dport} {t} {ulen - 8} "
                   f"{sender} {receiver}")


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    try:
        for line in messages(sys.argv[1]):
            print(line)
    except FileNotFoundError:
        raise SystemExit(f"{sys.argv[1]}: no such file")


if __name__ == "__main__":
    main()
