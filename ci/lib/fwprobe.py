#!/usr/bin/env python3
"""Socket probes for the firewall lab (ci/firewall.sh). Bash drives the namespaces; this
sends and listens. Every loop is bounded in count and time.

    fwprobe.py probe SECONDS SPEC...   all at once, one line "SPEC RESULT" each, SPEC is
                                       tcp:HOST:PORT or udp:HOST:PORT (HOST may be IPv6);
                                       tcp: open | refused (a RST) | unreachable:ERRNO
                                       (an ICMP error) | timeout (dropped);
                                       udp: reply | refused (ICMP port unreachable) |
                                       unreachable:ERRNO | silent (dropped, or no answer)
    fwprobe.py serve PORT SECONDS PEERS  on [::]:PORT (dual-stack) for SECONDS: TCP, one
                                       line echoed back per connection, each peer's
                                       address appended to the file PEERS; UDP echoed
    fwprobe.py tcp-check HOST PORT     one line through a `serve` server: prints "ok"
    fwprobe.py spoof SRC DST udp:PORT|udp:SPORT:DPORT|icmp COUNT
                                       COUNT raw packets from the source SRC (IPv4, or
                                       IPv6 for udp: with an IPv6 SRC and DST)
    fwprobe.py udp-from SPORT HOST PORT SECONDS
                                       one datagram from source port SPORT to a `serve`
                                       server: prints "reply" or "silent"
    fwprobe.py icmp-error DST QSRC QSPORT QDST QDPORT MTU
                                       one ICMP "fragmentation needed" (IPv4) or ICMPv6
                                       "packet too big" to DST, from this host, with MTU,
                                       quoting a full-size UDP datagram QSRC:QSPORT ->
                                       QDST:QDPORT (DF set)
    fwprobe.py mld-query IFACE         one MLDv2 general query to ff02::1 from IFACE's
                                       link-local address (hop limit 1, router alert),
                                       maximum response delay 500 ms
    fwprobe.py tcp-flags SRC DST PORT FLAGS
                                       one raw TCP segment with FLAGS (letters of FSRPAU,
                                       e.g. SF: SYN+FIN, which conntrack calls invalid)
    fwprobe.py echo DST COUNT RATE same|vary
                                       COUNT IPv4 echo requests at RATE a second, all with
                                       one ICMP id (one conntrack flow, as `ping -f`) or a
                                       new id each; prints "answered N of COUNT"
    fwprobe.py flood HOST PORT SOURCES EACH SECONDS
                                       EACH 148-byte datagrams shaped like handshake
                                       initiations (random, so they fail MAC1) from each of
                                       SOURCES source ports, for SECONDS at most; prints
                                       "sent N from P ports"
"""
import errno
import os
import random
import select
import socket
import struct
import sys
import threading
import time


def split_spec(spec):
    kind, rest = spec.split(":", 1)
    host, port = rest.rsplit(":", 1)
    return kind, host.strip("[]"), int(port)


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def err_name(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


def probe_tcp(host, port, secs):
    s = socket.socket(family(host), socket.SOCK_STREAM)
    s.settimeout(secs)
    try:
        s.connect((host, port))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "unreachable:" + err_name(e)
    finally:
        s.close()


def probe_udp(host, port, secs):
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.connect((host, port))
    end = time.monotonic() + secs
    try:
        for _ in range(3):
            s.send(b"riceguard-fw-probe\n")
            s.settimeout(max(0.05, min(secs / 3, end - time.monotonic())))
            try:
                if s.recv(2048):
                    return "reply"
            except socket.timeout:
                pass
            if time.monotonic() >= end:
                break
        return "silent"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return "unreachable:" + err_name(e)
    finally:
        s.close()


def probe(args):
    secs = float(args[0])
    results = {}

    def one(spec):
        kind, host, port = split_spec(spec)
        f = probe_tcp if kind == "tcp" else probe_udp
        results[spec] = f(host, port, secs)

    threads = [threading.Thread(target=one, args=(s,)) for s in args[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(secs + 5)
    for s in args[1:]:
        print(s, results.get(s, "hung"))


def norm(addr):
    return addr[7:] if addr.startswith("::ffff:") else addr


def serve(args):
    port, secs, peers = int(args[0]), float(args[1]), args[2]
    t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    t.bind(("::", port))
    t.listen(16)
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    u.bind(("::", port))
    end = time.monotonic() + secs
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([t, u], [], [], left)
        if u in r:
            try:
                d, a = u.recvfrom(65536)
                u.sendto(d, a)
            except OSError:
                pass
        if t in r:
            c, a = t.accept()
            with open(peers, "a") as f:
                f.write(norm(a[0]) + "\n")
            c.settimeout(3)
            data = b""
            try:
                while not data.endswith(b"\n") and len(data) < 65536:
                    d = c.recv(65536)
                    if not d:
                        break
                    data += d
                c.sendall(data)
            except OSError:
                pass
            c.close()


def tcp_check(args):
    host, port = args[0].strip("[]"), int(args[1])
    try:
        c = socket.create_connection((host, port), timeout=5)
        msg = b"riceguard-fw-" + os.urandom(8).hex().encode() + b"\n"
        c.sendall(msg)
        data = b""
        while not data.endswith(b"\n"):
            d = c.recv(65536)
            if not d:
                break
            data += d
        print("ok" if data == msg else "mismatch %r" % data[:40])
    except OSError as e:
        print("failed: %s" % e)


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src, dst, proto, payload):
    # Checksum and id 0: the kernel fills them in for IP_HDRINCL sockets.
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + payload


def ipv6(src, dst, proto, payload):
    return struct.pack("!IHBB16s16s", 6 << 28, len(payload), proto, 64,
                       socket.inet_pton(socket.AF_INET6, src),
                       socket.inet_pton(socket.AF_INET6, dst)) + payload


def udp(src, dst, sport, dport, data):
    """A UDP header and data with its checksum (IPv4 or IPv6 pseudo header)."""
    n = 8 + len(data)
    if ":" in src:
        pseudo = (socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
                  + struct.pack("!IxxxB", n, 17))
    else:
        pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 17, n)
    hdr = struct.pack("!HHHH", sport, dport, n, 0)
    c = csum(pseudo + hdr + data) or 0xFFFF
    return hdr[:6] + struct.pack("!H", c) + data


def raw_send(dst, packets):
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for p in packets:
        s.sendto(p, (dst, 0))
        time.sleep(0.05)
    s.close()


def spoof(args):
    src, dst, what, count = args[0], args[1], args[2], int(args[3])
    pkts = []
    for i in range(count):
        if what == "icmp":
            body = struct.pack("!BBHHH", 8, 0, 0, 0x5247, i) + b"riceguard-spoof"
            body = body[:2] + struct.pack("!H", csum(body)) + body[4:]
            pkts.append(ipv4(src, dst, 1, body))
        else:
            ports = [int(x) for x in what.split(":")[1:]]
            sport, dport = (40000 + i, ports[0]) if len(ports) == 1 else ports
            body = udp(src, dst, sport, dport, b"riceguard-spoof\n")
            pkts.append((ipv6 if ":" in src else ipv4)(src, dst, 17, body))
    raw_send(dst, pkts)
    print("sent %d" % count)


def udp_from(args):
    sport, host, port, secs = int(args[0]), args[1].strip("[]"), int(args[2]), float(args[3])
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.bind(("::" if ":" in host else "0.0.0.0", sport))
    s.settimeout(secs)
    try:
        s.sendto(b"riceguard-fw-from\n", (host, port))
        print("reply" if s.recvfrom(2048)[0] else "silent")
    except socket.timeout:
        print("silent")
    except OSError as e:
        print("unreachable:" + err_name(e))
    finally:
        s.close()


def icmp_error(args):
    dst, qsrc, qsport, qdst, qdport, mtu = args[0], args[1], int(args[2]), args[3], int(args[4]), int(args[5])
    if ":" in dst:
        # What we quote: the first 1232 bytes of a 1500-byte datagram (RFC 4443: as
        # much as fits in 1280).
        q = ipv6(qsrc, qdst, 17, udp(qsrc, qdst, qsport, qdport, b"\x04" + bytes(1451)))[:1232]
        body = struct.pack("!BBHI", 2, 0, 0, mtu) + q
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    else:
        q = udp(qsrc, qdst, qsport, qdport, b"\x04" + bytes(1451))
        hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(q), 0, 0x4000, 64, 17, 0,
                          socket.inet_aton(qsrc), socket.inet_aton(qdst))
        hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
        body = struct.pack("!BBHHH", 3, 4, 0, 0, mtu) + hdr + q[:8]
        body = body[:2] + struct.pack("!H", csum(body)) + body[4:]
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    # The kernel fills in the ICMPv6 checksum for raw ICMPv6 sockets.
    s.sendto(body, (dst, 0))
    s.close()
    print("sent 1")


def mld_query(args):
    ifc = args[0]
    idx = socket.if_nametoindex(ifc)
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, idx)
    # Hop-by-hop options: router alert (MLD), then PadN to 8 bytes.
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_HOPOPTS, bytes([0, 0, 5, 2, 0, 0, 1, 0]))
    # MLDv2 general query: max response code 500 ms, no group, QRV 2, QQIC 125, no sources.
    body = struct.pack("!BBHHH16sBBH", 130, 0, 0, 500, 0, bytes(16), 2, 125, 0)
    s.sendto(body, ("ff02::1", 0, 0, idx))
    s.close()
    print("sent 1")


def tcp_flags(args):
    src, dst, port, flags = args[0], args[1], int(args[2]), args[3]
    bits = sum({"F": 1, "S": 2, "R": 4, "P": 8, "A": 16, "U": 32}[c] for c in flags)
    hdr = struct.pack("!HHIIBBHHH", random.randint(40000, 60000), port,
                      random.getrandbits(32), 0, 5 << 4, bits, 65535, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(hdr))
    hdr = hdr[:16] + struct.pack("!H", csum(pseudo + hdr)) + hdr[18:]
    raw_send(dst, [ipv4(src, dst, 6, hdr)])
    print("sent 1")


def echo(args):
    dst, count, rate, mode = args[0], int(args[1]), float(args[2]), args[3]
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    base = random.randint(1, 0xFFFF)
    ids = set()
    for i in range(count):
        ident = base if mode == "same" else (base + i) & 0xFFFF
        ids.add(ident)
        body = struct.pack("!BBHHH", 8, 0, 0, ident, i) + b"riceguard-echo"
        body = body[:2] + struct.pack("!H", csum(body)) + body[4:]
        s.sendto(body, (dst, 0))
        time.sleep(1 / rate)
    answered = set()
    end = time.monotonic() + 1.5
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([s], [], [], left)
        if not r:
            break
        d, a = s.recvfrom(2048)
        ihl = (d[0] & 15) * 4
        if a[0] != dst or len(d) < ihl + 8 or d[ihl] != 0:
            continue
        ident, seq = struct.unpack("!HH", d[ihl + 4:ihl + 8])
        if ident in ids:
            answered.add(seq)
    print("answered %d of %d" % (len(answered), count))


def flood(args):
    host, port, sources, each, secs = args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4])
    end = time.monotonic() + secs
    sent, ports = 0, set()
    for _ in range(sources):
        if time.monotonic() >= end:
            break
        s = socket.socket(family(host), socket.SOCK_DGRAM)
        s.connect((host, port))
        ports.add(s.getsockname()[1])
        for _ in range(each):
            try:
                s.send(b"\x01\x00\x00\x00" + os.urandom(144))
                sent += 1
            except OSError:
                pass
        s.close()
    print("sent %d from %d ports" % (sent, len(ports)))


TOOLS = {
    "probe": probe,
    "serve": serve,
    "tcp-check": tcp_check,
    "spoof": spoof,
    "tcp-flags": tcp_flags,
    "flood": flood,
    "echo": echo,
    "udp-from": udp_from,
    "icmp-error": icmp_error,
    "mld-query": mld_query,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        sys.exit(__doc__)
    TOOLS[sys.argv[1]](sys.argv[2:])
