#!/usr/bin/env python3
"""TCP attacker for ci/adversarial-tcp.sh (python3 stdlib only), run inside the attacker
namespace against the gateway's WireGuard-over-TCP listener.

One run opens COUNT connections at up to RATE per second, round-robin over the source
addresses given, and does MODE on each:

  silent    connect and say nothing
  loris     a handshake-initiation frame, one byte per second (never completes in time)
  random    4 KiB of random bytes (not u16 framing)
  framed    well-framed garbage: a 1400-byte type-4 (data) frame every 50 ms
  toolong   a 65535-byte length prefix (longer than any WireGuard message) and data
  maxframe  two complete 65507-byte type-4 frames (the largest accepted), then 60000
            bytes of a third, then nothing (holds the gateway's partial-frame buffer)

It watches every connection until the gateway closes it or DURATION seconds have passed,
and prints one line of key=value figures: what was sent, how many connections were
established, when the gateway closed them (within 1 s: refused/evicted/bad frame; 5-12 s:
the authentication deadline), how many were open at most at one time, and how many were
still open at the end. Everything is bounded by COUNT and DURATION.
"""

import argparse
import errno
import os
import resource
import selectors
import socket
import struct
import time

LORIS_FRAME = struct.pack(">H", 148) + bytes([1, 0, 0, 0]) + os.urandom(144)


def garbage_data(n):
    return bytes([4, 0, 0, 0]) + os.urandom(n - 4)


class Conn:
    __slots__ = ("sock", "t0", "closed", "connected", "out", "next_send", "pos", "sent")

    def __init__(self, sock, t0):
        self.sock = sock
        self.t0 = t0
        self.closed = None
        self.connected = False
        self.out = b""
        self.next_send = 0.0
        self.pos = 0
        self.sent = 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, help="HOST:PORT ([v6]:port)")
    ap.add_argument("--sources", required=True, help="comma-separated source addresses")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--mode", required=True,
                    choices=["silent", "loris", "random", "framed", "toolong", "maxframe"])
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--name", default="attack")
    a = ap.parse_args()

    host, port = a.target.rsplit(":", 1)
    host = host.strip("[]")
    port = int(port)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sources = [s for s in a.sources.split(",") if s]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, a.count + 256)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    sel = selectors.DefaultSelector()
    conns = []
    launched = connect_failed = 0
    bytes_sent = 0
    peak_open = 0
    start = time.monotonic()
    last_sample = start
    end_launch = None

    def close(c, now):
        if c.closed is None:
            c.closed = now
            try:
                sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()

    def on_connected(c, now):
        c.connected = True
        c.t0 = now
        if a.mode == "random":
            c.out = os.urandom(4096)
        elif a.mode == "toolong":
            c.out = struct.pack(">H", 65535) + garbage_data(1000)
        elif a.mode == "maxframe":
            f = struct.pack(">H", 65507) + garbage_data(65507)
            c.out = f + f + f[:60000]
        elif a.mode == "loris":
            c.out = b""
            c.next_send = now
        elif a.mode == "framed":
            c.next_send = now
        sel.modify(c.sock, selectors.EVENT_READ, c)

    def pump(c, now):
        """Send what this mode wants to send now (non-blocking, bounded)."""
        nonlocal bytes_sent
        if c.closed is not None or not c.connected:
            return
        try:
            if a.mode == "loris":
                if now >= c.next_send and c.pos < len(LORIS_FRAME):
                    n = c.sock.send(LORIS_FRAME[c.pos:c.pos + 1])
                    c.pos += n
                    bytes_sent += n
                    c.next_send = now + 1.0
            elif a.mode == "framed":
                if now >= c.next_send:
                    f = struct.pack(">H", 1400) + garbage_data(1400)
                    n = c.sock.send(f)
                    bytes_sent += n
                    c.next_send = now + 0.05
            elif c.out and c.pos < len(c.out):
                n = c.sock.send(c.out[c.pos:c.pos + 262144])
                c.pos += n
                bytes_sent += n
        except BlockingIOError:
            pass
        except OSError:
            close(c, now)

    while True:
        now = time.monotonic()
        el = now - start
        if el > a.duration:
            break
        # Launch at the configured rate.
        due = min(a.count, int(el * a.rate) + 1)
        burst = 0
        while launched < due and burst < 200:
            src = sources[launched % len(sources)]
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.bind((src, 0))
                r = s.connect_ex((host, port))
            except OSError:
                r = -1
            launched += 1
            burst += 1
            if r not in (0, errno.EINPROGRESS):
                connect_failed += 1
                s.close()
                continue
            c = Conn(s, now)
            conns.append(c)
            sel.register(s, selectors.EVENT_WRITE, c)
        if launched >= a.count and end_launch is None:
            end_launch = now
        for key, ev in sel.select(timeout=0.01):
            c = key.data
            now = time.monotonic()
            if not c.connected:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err in (errno.ECONNRESET, errno.EPIPE):
                    # Established, then reset by the gateway before we looked: refused.
                    c.connected = True
                    c.t0 = now
                    close(c, now)
                    continue
                if err:
                    connect_failed += 1
                    conns.remove(c)
                    sel.unregister(c.sock)
                    c.sock.close()
                    continue
                on_connected(c, now)
                pump(c, now)
                continue
            try:
                d = c.sock.recv(65536)
                if not d:
                    close(c, now)
            except BlockingIOError:
                pass
            except OSError:
                close(c, now)
        now = time.monotonic()
        for c in conns:
            if c.closed is None and c.connected:
                pump(c, now)
        if now - last_sample >= 0.1:
            last_sample = now
            open_now = sum(1 for c in conns if c.connected and c.closed is None)
            peak_open = max(peak_open, open_now)
        if launched >= a.count and all(c.closed is not None for c in conns):
            break

    now = time.monotonic()
    connected = [c for c in conns if c.connected]
    lifetimes = sorted(c.closed - c.t0 for c in connected if c.closed is not None)
    fast = sum(1 for t in lifetimes if t < 1.0)
    mid = sum(1 for t in lifetimes if 1.0 <= t < 5.0)
    deadline = sum(1 for t in lifetimes if 5.0 <= t < 12.0)
    late = sum(1 for t in lifetimes if t >= 12.0)
    still = sum(1 for c in connected if c.closed is None)
    launch_time = (end_launch or now) - start
    median = lifetimes[len(lifetimes) // 2] if lifetimes else -1
    longest = lifetimes[-1] if lifetimes else -1
    print(
        f"{a.name}: mode={a.mode} sent={launched} sources={len(sources)} "
        f"rate={launched / max(launch_time, 0.001):.0f}/s launch_s={launch_time:.1f} "
        f"established={len(connected)} connect_failed={connect_failed} "
        f"bytes={bytes_sent} closed_lt1s={fast} closed_1_5s={mid} closed_5_12s={deadline} "
        f"closed_ge12s={late} still_open={still} peak_open={peak_open} "
        f"median_life_s={median:.2f} longest_life_s={longest:.2f} run_s={now - start:.1f}",
        flush=True,
    )
    for c in conns:
        if c.closed is None:
            c.sock.close()


if __name__ == "__main__":
    main()
