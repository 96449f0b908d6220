#!/usr/bin/env python3
"""Small socket and parsing tools the Bash labs in ci/ call (one scripting style: Bash
drives namespaces and processes, anything that talks sockets or parses output is here).

    labtool.py iperf-mbit [FILE]            Mbit/s received from iperf3 -J output (0 if none)
    labtool.py udp-echo                     echo UDP on 127.0.0.1 (port printed), 60 s idle max
    labtool.py udp-echo-check PORT          WireGuard-shaped datagrams echoed back intact
    labtool.py u32le-refused PORT           u32-LE framed input: the TCP peer closes at once
    labtool.py tcp-garbage HOST PORT        hostile frames + 200 quick connects; prints "closed N"
    labtool.py pcap-segments                tcpdump text on stdin -> "data bare2 small" counts
    labtool.py uapi-clients SOCK READY      40 silent, 10 half-request, 10 slow-loris UAPI clients for 25 s
    labtool.py uapi-cut SOCK                a `set` cut off inside a line; prints the reply
    labtool.py hold udp|tcp PORT READY      hold a port on [::] (dual-stack) for 120 s
    labtool.py tcp-reverse-once HOST PORT   accept one TCP connection (15 s), send back what
                                            it sent up to a newline, reversed
    labtool.py tcp-reverse-check HOST PORT  30 kB to a tcp-reverse-once server; prints "ok"
    labtool.py hmp SOCK LINE                one command on a QEMU human monitor socket
    labtool.py boot-probe HOST TPORT UPORT SECONDS STATUS
                                            while a guest boots: every 0.1 s a TCP SYN to
                                            HOST:TPORT and a UDP datagram to HOST:UPORT
                                            (closed ports), answers counted (RST, ICMP
                                            port unreachable, anything else); HOST's ARP
                                            entry tells when its address came up; STATUS
                                            rewritten twice a second (and on SIGTERM)
    labtool.py tcp-peer-once HOST PORT      as tcp-reverse-once, then prints the client's
                                            address (what a NAT made of it)
    labtool.py bulk-serve PORT BYTES SECONDS
                                            on [::]:PORT for SECONDS: every connection
                                            gets BYTES, then is closed
    labtool.py bulk-fetch HOST PORT SECONDS from a bulk-serve server until it closes or
                                            SECONDS have passed; prints "received N"

Every loop is bounded in count and time.
"""
import json
import os
import re
import socket
import struct
import sys
import threading
import time


def iperf_mbit(args):
    try:
        src = open(args[0]) if args else sys.stdin
        d = json.load(src)
        print(int(d["end"]["sum_received"]["bits_per_second"] / 1e6))
    except (OSError, ValueError, KeyError, TypeError):
        print(0)


def udp_echo(_args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    sys.stdout.close()
    s.settimeout(60)
    try:
        while True:
            d, a = s.recvfrom(65536)
            s.sendto(d, a)
    except OSError:
        pass


def udp_echo_check(args):
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(3)
    c.connect(("127.0.0.1", int(args[0])))
    for i, n in enumerate([32, 148, 1398, 60000]):
        m = bytes([4, 0, 0, 0]) + bytes([i]) * (n - 4)
        c.send(m)
        if c.recv(65536) != m:
            sys.exit(f"datagram of {n} bytes not echoed intact")


def u32le_refused(args):
    s = socket.create_connection(("127.0.0.1", int(args[0])))
    s.settimeout(3)
    m = bytes([4, 0, 0, 0]) + bytes(60)
    s.sendall(struct.pack("<I", len(m)) + m)
    if s.recv(10) != b"":
        sys.exit("connection not closed")


def tcp_garbage(args):
    host, port = args[0], int(args[1])
    closed = 0
    payloads = [os.urandom(4096), struct.pack("<I", 148) + os.urandom(148), b"\x00\x01",
                b"\xff\xff" + os.urandom(10)]
    for payload in payloads:
        s = socket.create_connection((host, port), timeout=3)
        try:
            s.sendall(payload)
            s.settimeout(3)
            if s.recv(1) == b"":
                closed += 1
        except (ConnectionResetError, socket.timeout, BrokenPipeError):
            closed += 1
        s.close()
    for _ in range(200):
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            pass
    print("closed", closed)


def pcap_segments(_args):
    lens = [int(m.group(1)) for line in sys.stdin
            for m in [re.search(r"length (\d+)$", line.strip())] if m]
    data = [n for n in lens if n > 0]
    print(len(data), sum(1 for n in data if n == 2), sum(1 for n in data if n < 1000))


def uapi_clients(args):
    path, ready = args[0], args[1]
    held = []

    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        held.append(s)
        return s

    for _ in range(40):  # silent: connect, say nothing
        connect()
    for _ in range(10):  # half a request, then nothing
        connect().sendall(b"set=1\nlisten_port=4")
    loris = [connect() for _ in range(10)]
    with open(ready, "w") as f:
        f.write("ok\n")
    # slow-loris: a get request one byte a second, re-connecting when cut off
    req = b"get=1\n\n"
    end = time.time() + 25
    i = 0
    while time.time() < end:
        for n, s in enumerate(loris):
            try:
                s.sendall(req[i % len(req):i % len(req) + 1])
            except OSError:
                try:
                    loris[n] = connect()
                except OSError:
                    pass
        i += 1
        time.sleep(1)


def uapi_cut(args):
    s = socket.socket(socket.AF_UNIX)
    s.connect(args[0])
    s.sendall(b"set=1\nlisten_port=4")
    s.shutdown(socket.SHUT_WR)
    s.settimeout(10)
    print(s.recv(100).decode().strip())


def hold(args):
    kind, port, ready = args[0], int(args[1]), args[2]
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    if kind == "tcp":
        s.listen(1)
    with open(ready, "w") as f:
        f.write("ok\n")
    time.sleep(120)


def _reverse_once(args):
    """Accept one TCP connection on ADDR PORT, answer its first line reversed; return
    the client's address."""
    s = socket.socket(socket.AF_INET6 if ":" in args[0] else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((args[0], int(args[1])))
    s.listen(1)
    s.settimeout(15)
    c, peer = s.accept()
    c.settimeout(5)
    data = b""
    while not data.endswith(b"\n"):
        d = c.recv(65536)
        if not d:
            break
        data += d
    c.sendall(data[::-1])
    c.close()
    return peer[0]


def tcp_reverse_once(args):
    _reverse_once(args)


def tcp_reverse_check(args):
    c = socket.create_connection((args[0], int(args[1])), timeout=5)
    msg = b"riceguard-" * 3000 + b"\n"
    c.sendall(msg)
    c.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = c.recv(65536)
        if not d:
            break
        data += d
    print("ok" if data == msg[::-1] else "mismatch %d" % len(data))


def hmp(args):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(args[0])
    time.sleep(0.3)
    s.recv(65536)  # the banner
    s.sendall(args[1].encode() + b"\n")
    time.sleep(0.5)
    s.close()


def arp_complete(host):
    """HOST has a complete entry in this namespace's ARP table (it answered ARP)."""
    try:
        with open("/proc/net/arp") as f:
            for line in f.readlines()[1:]:
                w = line.split()
                if len(w) >= 3 and w[0] == host and int(w[2], 16) & 0x2:
                    return True
    except (OSError, ValueError):
        pass
    return False


def boot_probe(args):
    """Closed-port probes while HOST boots. A closed port without a firewall answers a SYN
    with a RST and a datagram with an ICMP port unreachable as soon as the address is up;
    a firewall that drops them leaves both silent. Every probe waits up to 3 s for its
    answer (a guest under TCG is slow); the first answer of each kind is timed."""
    import errno
    import selectors
    import signal

    host, tport, uport, secs, status = args[0], int(args[1]), int(args[2]), float(args[3]), args[4]
    t0 = time.time()
    end = t0 + secs
    sel = selectors.DefaultSelector()
    n = {"sent": 0, "after_up": 0, "rst": 0, "unreach": 0, "open": 0, "reply": 0, "silent": 0, "other": 0}
    first = {}
    up_at = None
    pending = {}  # socket -> (kind, sent at)

    def write():
        at = lambda k: "%.1f" % first[k] if k in first else "-"
        line = " ".join("%s %d" % kv for kv in n.items())
        line += " up_at %s first_rst %s first_unreach %s first_open %s elapsed %.1f\n" % (
            "%.1f" % up_at if up_at is not None else "-", at("rst"), at("unreach"), at("open"),
            time.time() - t0)
        tmp = status + ".tmp"
        with open(tmp, "w") as f:
            f.write(line)
        os.replace(tmp, status)

    def stop(*_):
        write()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)

    def count(kind):
        n[kind] += 1
        first.setdefault(kind, time.time() - t0)

    def done(s):
        sel.unregister(s)
        del pending[s]
        s.close()

    last_write = 0.0
    next_send = t0
    while time.time() < end:
        now = time.time()
        if up_at is None and arp_complete(host):
            up_at = now - t0
        if now >= next_send and len(pending) < 200:
            next_send = now + 0.1
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            t.setblocking(False)
            t.connect_ex((host, tport))
            pending[t] = ("tcp", now)
            sel.register(t, selectors.EVENT_WRITE)
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.setblocking(False)
            u.connect((host, uport))
            try:
                u.send(b"riceguard boot probe")
            except OSError:
                pass
            pending[u] = ("udp", now)
            sel.register(u, selectors.EVENT_READ)
            n["sent"] += 2
            if up_at is not None:
                n["after_up"] += 2
        for key, _ in sel.select(timeout=max(0.0, min(0.1, next_send - time.time()))):
            s = key.fileobj
            kind, _ = pending[s]
            if kind == "tcp":
                e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if e == 0:
                    count("open")
                elif e == errno.ECONNREFUSED:
                    count("rst")
                elif e in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT):
                    n["silent"] += 1  # no ARP answer yet: nothing reached the guest
                else:
                    n["other"] += 1
            else:
                try:
                    s.recv(2048)
                    count("reply")
                except ConnectionRefusedError:
                    count("unreach")
                except OSError as e:
                    if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                        n["silent"] += 1
                    else:
                        n["other"] += 1
            done(s)
        now = time.time()
        for s, (_, at) in list(pending.items()):
            if now - at > 3:
                n["silent"] += 1
                done(s)
        if now - last_write >= 0.5:
            write()
            last_write = now
    write()


def tcp_peer_once(args):
    print(_reverse_once(args), flush=True)


def bulk_serve(args):
    port, size, secs = int(args[0]), int(args[1]), float(args[2])
    t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    t.bind(("::", port))
    t.listen(8)
    end = time.monotonic() + secs
    chunk = bytes(65536)

    def send(c):
        # Bounded: a connection whose data cannot get through (the lab's point) gives up
        # when the server's time is up.
        c.settimeout(max(0.1, end - time.monotonic()))
        left = size
        try:
            while left > 0:
                left -= c.send(chunk[:min(left, len(chunk))])
        except OSError:
            pass
        c.close()

    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        t.settimeout(left)
        try:
            c, _ = t.accept()
        except socket.timeout:
            break
        threading.Thread(target=send, args=(c,), daemon=True).start()


def bulk_fetch(args):
    host, port, secs = args[0].strip("[]"), int(args[1]), float(args[2])
    end = time.monotonic() + secs
    n = 0
    try:
        c = socket.create_connection((host, port), timeout=min(5.0, secs))
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            c.settimeout(left)
            d = c.recv(65536)
            if not d:
                break
            n += len(d)
    except OSError:
        pass
    print("received %d" % n, flush=True)


TOOLS = {
    "boot-probe": boot_probe,
    "tcp-peer-once": tcp_peer_once,
    "hmp": hmp,
    "tcp-reverse-once": tcp_reverse_once,
    "tcp-reverse-check": tcp_reverse_check,
    "iperf-mbit": iperf_mbit,
    "udp-echo": udp_echo,
    "udp-echo-check": udp_echo_check,
    "u32le-refused": u32le_refused,
    "tcp-garbage": tcp_garbage,
    "pcap-segments": pcap_segments,
    "uapi-clients": uapi_clients,
    "uapi-cut": uapi_cut,
    "hold": hold,
    "bulk-serve": bulk_serve,
    "bulk-fetch": bulk_fetch,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        sys.exit(__doc__)
    TOOLS[sys.argv[1]](sys.argv[2:])
