"""Sockets for ci/dns.sh: a fake upstream that forges before it answers, a flooder, and a
client that counts its answers. DNS messages are built and read by hand (one question,
A records): the lab checks the appliance against bytes it did not make with hickory.

  dnslab.py upstream ADDR LOG      answer every query three times: a forged reply with a
                                   wrong ID (6.6.6.6) from ADDR:53, the right ID from
                                   ADDR:5353 (6.6.6.7), then the real answer (198.51.100.8);
                                   each query's source port and ID go to LOG
  dnslab.py flood SERVER SECONDS   queries as fast as it can for SECONDS; prints
                                   "sent N answered M"
  dnslab.py ask SERVER N GAP       N queries GAP seconds apart, each waiting 1 s for its
                                   answer; prints "answered M of N"
"""
import random
import socket
import struct
import sys
import time


def query(ident, name):
    q = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    return struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + q + struct.pack(">HH", 1, 1)


def question_end(msg):
    i = 12
    while msg[i] != 0:
        i += 1 + msg[i]
    return i + 5


def reply(msg, ident, addr):
    end = question_end(msg)
    head = struct.pack(">HHHHHH", ident, 0x8180, 1, 1, 0, 0)
    rr = struct.pack(">HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(addr)
    return head + msg[12:end] + rr


def upstream(addr, log):
    main = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    main.bind((addr, 53))
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind((addr, 5353))
    with open(log, "a", buffering=1) as out:
        while True:
            msg, src = main.recvfrom(4096)
            if len(msg) < 17:
                continue
            (ident,) = struct.unpack(">H", msg[:2])
            out.write("query port=%d id=%d\n" % (src[1], ident))
            main.sendto(reply(msg, ident ^ 0x5A5A, "6.6.6.6"), src)
            other.sendto(reply(msg, ident, "6.6.6.7"), src)
            main.sendto(reply(msg, ident, "198.51.100.8"), src)


def flood(server, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    msg = query(1, "phone.home.arpa")
    sent = answered = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s.sendto(msg, (server, 53))
            sent += 1
        except BlockingIOError:
            pass
        while True:
            try:
                s.recv(4096)
                answered += 1
            except BlockingIOError:
                break
    time.sleep(0.3)
    while True:
        try:
            s.recv(4096)
            answered += 1
        except BlockingIOError:
            break
    print("sent %d answered %d" % (sent, answered))


def ask(server, n, gap):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    got = 0
    for _ in range(n):
        ident = random.randrange(65536)
        s.sendto(query(ident, "phone.home.arpa"), (server, 53))
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            try:
                b = s.recv(4096)
            except socket.timeout:
                break
            if b[:2] == struct.pack(">H", ident):
                got += 1
                break
        time.sleep(gap)
    print("answered %d of %d" % (got, n))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "upstream":
        upstream(sys.argv[2], sys.argv[3])
    elif cmd == "flood":
        flood(sys.argv[2], float(sys.argv[3]))
    elif cmd == "ask":
        ask(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit("usage: dnslab.py upstream|flood|ask ...")
