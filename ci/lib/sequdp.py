#!/usr/bin/env python3
"""Sequence-numbered UDP for ci/order.sh: does a path keep a flow's order?

    sequdp.py send HOST PORT [--count N] [--size B] [--seconds S]
        N datagrams (default 40000) of B bytes (default 1200) to HOST:PORT, as fast as the
        socket takes them, for at most S seconds (default 3); each carries a magic and
        its number 0, 1, 2, ... Prints {"sent": N, "seconds": T, "send_errors": E}.
    sequdp.py recv ADDR PORT [--idle S] [--deadline S]
        counts what arrives on ADDR:PORT until S seconds (default 1.5) pass without a
        datagram once one came, or the deadline (default 20 s) passes. Prints JSON:
        received, unique, duplicated, reordered (a datagram, not seen before, whose
        number is below the highest seen so far), max_displacement (the highest seen
        minus such a number), highest, stray (datagrams without the magic).
    sequdp.py summary SENDJSON RECVJSON
        one line for the shell: sent unique lost duplicated reordered max_displacement
        seconds (the sender's)

Every loop is bounded in count and time.
"""
import errno
import json
import socket
import struct
import sys
import time

MAGIC = b"RGSQ"
HDR = struct.Struct("!4sI")
MAX_COUNT = 1_000_000


def opt(args, name, default, kind):
    if name in args:
        i = args.index(name)
        return kind(args[i + 1])
    return default


def send(args):
    host, port = args[0], int(args[1])
    count = min(opt(args, "--count", 40000, int), MAX_COUNT)
    size = max(HDR.size, opt(args, "--size", 1200, int))
    seconds = opt(args, "--seconds", 3.0, float)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    pad = b"\0" * (size - HDR.size)
    t0 = time.monotonic()
    end = t0 + seconds
    sent = errors = 0
    while sent < count:
        if (sent & 255) == 0 and time.monotonic() >= end:
            break
        try:
            s.send(HDR.pack(MAGIC, sent) + pad)
            sent += 1
        except OSError as e:
            # A full queue below us (ENOBUFS) or an ICMP error reported on the connected
            # socket: try the same number again, still within the deadline.
            if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED):
                raise
            errors += 1
            if time.monotonic() >= end:
                break
            time.sleep(0.0005)
    print(json.dumps({"sent": sent, "seconds": round(time.monotonic() - t0, 3),
                      "send_errors": errors}))


def recv(args):
    addr, port = args[0], int(args[1])
    idle = opt(args, "--idle", 1.5, float)
    deadline = time.monotonic() + opt(args, "--deadline", 20.0, float)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # root: a buffer above rmem_max, so the receiver's own pace loses little
        s.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    s.bind((addr, port))
    seen = bytearray(MAX_COUNT)
    received = unique = dup = reordered = stray = maxdisp = 0
    highest = -1
    buf = bytearray(65536)
    last = None
    while True:
        now = time.monotonic()
        if now >= deadline or (last is not None and now - last >= idle):
            break
        s.settimeout(max(0.01, min(deadline - now, idle if last is None else idle - (now - last))))
        try:
            n = s.recv_into(buf)
        except socket.timeout:
            continue
        last = time.monotonic()
        if n < HDR.size or buf[:4] != MAGIC:
            stray += 1
            continue
        seq = HDR.unpack_from(buf)[1]
        if seq >= MAX_COUNT:
            stray += 1
            continue
        received += 1
        if seen[seq]:
            dup += 1
            continue
        seen[seq] = 1
        unique += 1
        if seq < highest:
            reordered += 1
            maxdisp = max(maxdisp, highest - seq)
        else:
            highest = seq
    print(json.dumps({"received": received, "unique": unique, "duplicated": dup,
                      "reordered": reordered, "max_displacement": maxdisp,
                      "highest": highest, "stray": stray}))


def summary(args):
    try:
        snd = json.load(open(args[0]))
        rcv = json.load(open(args[1]))
        print(snd["sent"], rcv["unique"], snd["sent"] - rcv["unique"], rcv["duplicated"],
              rcv["reordered"], rcv["max_displacement"], snd["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        print("")  # the shell sees no figures: a failed check, not a passed one


if __name__ == "__main__":
    cmds = {"send": send, "recv": recv, "summary": summary}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
