#!/usr/bin/env python3
"""A syslog collector for ci/syslog.sh: RFC 5424 messages over UDP (one per datagram) and
TCP (RFC 6587 octet counting), each written to OUT as one line, `udp|tcp OK <message>` when its
header is valid RFC 5424 (PRI, version 1, timestamp or -, HOSTNAME/APP-NAME/PROCID/MSGID
printable ASCII within their lengths, structured data -), `BAD <repr>` otherwise.

    syslog_collector.py ADDR PORT OUT        (UDP and TCP on the same port)
"""
import re
import select
import socket
import sys

HEADER = re.compile(
    r'^<(\d{1,3})>1 '
    r'(-|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})) '
    r'([!-~]{1,255}) ([!-~]{1,48}) ([!-~]{1,128}) ([!-~]{1,32}) (-)( (.*))?$', re.S)


def judge(raw):
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError:
        return 'BAD ' + repr(raw)
    m = HEADER.match(text)
    if not m or int(m.group(1)) > 191 or '\n' in text:
        return 'BAD ' + repr(text)
    msg = m.group(11) or ''
    if msg.startswith('\ufeff'):
        msg = msg[1:]
    head = text[:len(text) - len(m.group(10) or '')]
    return 'OK ' + head + (' ' + msg if m.group(10) else '')


def main():
    addr, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    fam = socket.AF_INET6 if ':' in addr else socket.AF_INET
    u = socket.socket(fam, socket.SOCK_DGRAM)
    u.bind((addr, port))
    t = socket.socket(fam, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((addr, port))
    t.listen(8)
    f = open(out, 'a', buffering=1, encoding='utf-8')
    conns = {}  # socket -> pending bytes
    while True:
        r, _, _ = select.select([u, t] + list(conns), [], [])
        for s in r:
            if s is u:
                f.write('udp ' + judge(u.recv(65536)) + '\n')
            elif s is t:
                c, _ = t.accept()
                conns[c] = b''
            else:
                data = s.recv(65536)
                if not data:
                    if conns[s]:
                        f.write('tcp BAD trailing ' + repr(conns[s]) + '\n')
                    del conns[s]
                    s.close()
                    continue
                buf = conns[s] + data
                while True:
                    sp = buf.find(b' ')
                    if sp < 0:
                        break
                    if not buf[:sp].isdigit() or sp > 7:
                        f.write('tcp BAD frame ' + repr(buf[:40]) + '\n')
                        buf = b''
                        break
                    n = int(buf[:sp])
                    if len(buf) < sp + 1 + n:
                        break
                    f.write('tcp ' + judge(buf[sp + 1:sp + 1 + n]) + '\n')
                    buf = buf[sp + 1 + n:]
                conns[s] = buf


if __name__ == '__main__':
    main()
