#!/usr/bin/env python3
"""A scripted SNTP server for the clock tests (ci/ntp.sh, the QEMU tests).

usage: sntp_server.py [--log FILE] ADDR[:PORT]=SPEC ...

Each ADDR gets its own UDP socket and answers every mode-3 query as SPEC says, a
comma-separated list of:
  offset=SECONDS   answer with our clock plus SECONDS (default 0; may be negative)
  li=N             leap indicator (3: unsynchronised)
  stratum=N        stratum (default 2)
  kiss=CODE        a kiss-o'-death: stratum 0, LI 3, reference id CODE (RATE, DENY, RSTR)
  silent           never answer
Every query is logged as `query ADDR from SRC` (flushed), so tests count them.
"""
import select, socket, struct, sys, time

NTP_UNIX = 2208988800


def ntp_ts(t):
    s = int(t // 1)
    return ((s + NTP_UNIX) % 2**32) << 32 | int((t - s) * 2**32)


def answer(q, spec):
    if len(q) < 48 or q[0] & 7 != 3:
        return None
    kiss = spec.get('kiss')
    li = 3 if kiss else int(spec.get('li', 0))
    stratum = 0 if kiss else int(spec.get('stratum', 2))
    ref = (kiss or 'GPS').encode().ljust(4, b'\0')[:4]
    now = time.time() + float(spec.get('offset', 0))
    ts = ntp_ts(now)
    return (bytes([li << 6 | 4 << 3 | 4, stratum, 6, 0xec]) + b'\0' * 8 + ref
            + struct.pack('>QQQQ', ts, struct.unpack('>Q', q[40:48])[0], ts, ts))


def main(argv):
    log = sys.stdout
    if len(argv) >= 2 and argv[0] == '--log':
        log = open(argv[1], 'a', buffering=1)
        argv = argv[2:]
    socks = {}
    for a in argv:
        addr, _, spec_s = a.partition('=')
        spec = {}
        for kv in filter(None, spec_s.split(',')):
            k, _, v = kv.partition('=')
            spec[k] = v
        host, _, port = addr.rpartition(':') if addr.count(':') == 1 else (addr, '', '')
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port or 123)))
        socks[s] = (host, spec)
    print('ready', flush=True)
    while True:
        r, _, _ = select.select(list(socks), [], [], 1.0)
        for s in r:
            q, src = s.recvfrom(512)
            host, spec = socks[s]
            log.write(f'query {host} from {src[0]}:{src[1]}\n')
            log.flush()
            if 'silent' in spec:
                continue
            a = answer(q, spec)
            if a:
                s.sendto(a, src)


if __name__ == '__main__':
    main(sys.argv[1:])
